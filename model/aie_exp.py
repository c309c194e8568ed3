"""aie4ml's exact-exp Softmax, bit for bit: the kernel fallback heads run on the AI Engine (``--top aie``).

A second integer-exp variant beside :mod:`somatile.model.intexp` (which the PL tile runs). aie4ml 0.2.1's
``softmax_exp_i8`` / ``softmax_exp_i8_tiled`` kernels (``templates/nnet_utils/softmax/softmax.cpp``,
``exp_score16``; constants in ``templates/firmware/variants/softmax/parameters.h.jinja``) compute, for a row x
of int8 logits and the head's step KQ = round(log2(e) * scale * 2**8)::

    m = max(x);  d = m - x                          0..255
    z = d * KQ                                      0..32640, int16: a log2 distance in Q8
    zi = z >> 8;  f = z & 255                       integer and fractional octave
    e = ((((f * A2) >> 8) + B1) * f >> 8) + C0      2**(-f/256) in Q14, floor at both shifts
    E = e >> (zi & 15), or 0 when zi >= 16          four conditional halvings
    inv = floor(NUM / sum(E))                       NUM = 255 << 15 (uint8) or 32767 (int16)
    out = min((E * inv) >> 15, 255)  (uint8)   or   min(E * inv, 32767)  (int16)

with A2 = 2811, B1 = -11004, C0 = 16384; every shift floors (the kernel's rounding mode) and the output
saturates. docs/aie.md lists each step with the line of aie4ml's source it comes from. The int16 output is
reproduced as the kernel computes it: its Q14 terms sum to at least 16384, so ``inv`` is 0 or 1 and the
"probabilities" are the raw terms; ``somatile build --top aie`` refuses fallback heads with int16 output.

The kernel has no mask: every element of a row takes part. ``impl="numpy"`` is the spec, ``impl="numba"`` the
fast path; they agree bit for bit (tests/model/test_aie_exp.py).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from somatile.model import hccs, nbcache
from somatile.model.hccs import (INT16_MAX, OUT_CODES, OUT_DTYPES, OUT_UINT8, UINT8_MAX, as_heads, code_of,
                                 per_head_in_range)

# Its kernels compile in constants of hccs.py: a change there must reach this module's numba cache.
nbcache.drop_stale(__file__, ("aie_exp.py", "hccs.py"))

EXP_A2 = 2811
EXP_B1 = -11004
EXP_C0 = 16384
"""2**-f ~= A2 f^2 + B1 f + C0 in Q14 for f in [0, 1): the coefficients aie4ml's parameters.h fixes."""
EXP_ZF = 8
"""Fraction bits of the log2 distance z (Q8) and of each polynomial product's shift."""
EXP_ZERO_OCTAVE = 16
"""An integer octave zi >= 16 gives E = 0 (the Q14 term is shifted out)."""
MAX_DIST = 255
"""Largest m - x of int8 logits."""
KQ_MIN, KQ_MAX = 1, INT16_MAX // MAX_DIST
"""KQ range aie4ml accepts: below 1 every gap rounds to 0; above 128, 255 * KQ overflows int16."""
MAX_COLS = (1 << 31) // EXP_C0 - 1
"""Row length bound that keeps the int32 row sum of E <= 16384 per element from overflowing."""
INV_SHIFT = 15
UINT8_NUMERATOR = UINT8_MAX << INV_SHIFT
INT16_NUMERATOR = INT16_MAX

WIDTHS = {"dist_bits": 8, "z_bits": 16, "exp_frac_bits": EXP_ZF, "term_bits": 15, "sum_bits": 32,
          "inv_bits_uint8": 9, "inv_bits_int16": 1, "product_bits": 24, "kq": (KQ_MIN, KQ_MAX)}
"""Widths of the intermediates (unsigned unless stated; docs/aie.md): E <= 16384, inv <= 510 (uint8)."""


def exp_kq_from_scale(scale, heads=None) -> np.ndarray:
    """Per-head KQ = round_half_even(log2(e) * scale * 2**8), as aie4ml derives it from the scale folded into
    the Softmax. ``heads`` (bool per head, default all) marks the heads that run the kernel: ValueError naming
    the first of them whose KQ falls outside 1..128 (scales from about 0.0014 to 0.347 per int8 step)."""
    s = np.atleast_1d(np.asarray(scale, dtype=np.float64))
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"scale: expected finite positive per-head scales, got {s.tolist()}")
    kq = np.rint(s * math.log2(math.e) * (1 << EXP_ZF)).astype(np.int64)
    bad = ((kq < KQ_MIN) | (kq > KQ_MAX)) & (np.ones(s.shape, bool) if heads is None else np.asarray(heads, bool))
    if bad.any():
        h = int(np.flatnonzero(bad)[0])
        raise ValueError(f"scale: head {h} scale {s[h]:.6g} gives KQ = {kq[h]}, outside {KQ_MIN}..{KQ_MAX} "
                         f"(aie4ml's exact-exp kernel: (max - x) * KQ must fit int16 for a distance of "
                         f"{MAX_DIST}, and KQ = 0 makes every row uniform)")
    return kq


def scale_from_exp_kq(kq) -> np.ndarray:
    """The logit scale that KQ represents exactly: KQ / 2**8 / log2(e) (what the ONNX graph folds in)."""
    return np.asarray(kq, dtype=np.float64) / (1 << EXP_ZF) / math.log2(math.e)


def exp_term_spec(z: np.ndarray) -> np.ndarray:
    """E for log2 distances z = d * KQ (int32 array, 0..32640): Q14, 16384 at z = 0."""
    z = np.asarray(z, np.int32)
    octave, frac = z >> EXP_ZF, z & ((1 << EXP_ZF) - 1)
    inner = ((frac * EXP_A2) >> EXP_ZF) + EXP_B1
    e = ((inner * frac) >> EXP_ZF) + EXP_C0
    return np.where(octave >= EXP_ZERO_OCTAVE, 0, e >> (octave & (EXP_ZERO_OCTAVE - 1))).astype(np.int32)


def _spec(x3: np.ndarray, kq: np.ndarray, out: int) -> np.ndarray:
    xi = x3.astype(np.int32)
    d = xi.max(axis=-1, keepdims=True) - xi
    big_e = exp_term_spec(d * kq.astype(np.int32)[:, None, None])
    total = big_e.sum(axis=-1, keepdims=True, dtype=np.int32)
    if out == OUT_UINT8:
        return np.minimum((big_e * (UINT8_NUMERATOR // total)) >> INV_SHIFT, UINT8_MAX)
    return np.minimum(big_e * (INT16_NUMERATOR // total), INT16_MAX)


@numba.njit(cache=True, nogil=True, inline="always")
def _term(d, kq):
    z = np.int32(d * kq)
    octave = np.int32(z >> EXP_ZF)
    frac = np.int32(z & ((1 << EXP_ZF) - 1))
    inner = np.int32(np.int32(np.int32(frac * EXP_A2) >> EXP_ZF) + EXP_B1)
    e = np.int32(np.int32(np.int32(inner * frac) >> EXP_ZF) + EXP_C0)
    return np.int32(0) if octave >= EXP_ZERO_OCTAVE else np.int32(e >> (octave & (EXP_ZERO_OCTAVE - 1)))


@numba.njit(cache=True, nogil=True)
def aie_exp_rows2(x2, kq, out_code, out2, terms):
    """The kernel on every row of x2 (R, N) int8 into out2 (R, N), with one head's KQ; terms: int32 scratch of
    length N. Returns the sum of the row sums of E. Single thread."""
    rows, n = x2.shape
    numerator = np.int32(UINT8_NUMERATOR if out_code == OUT_UINT8 else INT16_NUMERATOR)
    shift = np.int32(INV_SHIFT if out_code == OUT_UINT8 else 0)
    cap = np.int32(UINT8_MAX if out_code == OUT_UINT8 else INT16_MAX)
    kq32 = np.int32(kq)
    grand_total = np.int64(0)
    for r in range(rows):
        m = np.int32(x2[r, 0])
        for i in range(1, n):
            v = np.int32(x2[r, i])
            m = v if v > m else m
        total = np.int32(0)
        for i in range(n):
            e = _term(np.int32(m - np.int32(x2[r, i])), kq32)
            terms[i] = e
            total = np.int32(total + e)
        grand_total += total
        inv = np.int32(numerator // total)
        for i in range(n):
            p = np.int32(np.int32(terms[i] * inv) >> shift)
            out2[r, i] = p if p < cap else cap
    return grand_total


def aie_exp_softmax(x: np.ndarray, kq, *, out: str = "uint8", impl: str = "numba") -> np.ndarray:
    """aie4ml's exact-exp Softmax of int8 logits (R, N) or (H, R, N); kq: one KQ or one per head (1..128, see
    :func:`exp_kq_from_scale`); out: "uint8" (the 2**-8 output aie4ml's uint8 kernel writes) or "int16";
    impl: "numba" or "numpy" (bit-identical). Returns out's dtype in x's shape."""
    out_code = code_of(OUT_CODES, "out", out)
    x3, _, squeeze = as_heads(x, None)
    if x3.shape[-1] > MAX_COLS:
        raise ValueError(f"x: rows of {x3.shape[-1]} elements exceed the int32 row sum ({MAX_COLS} max)")
    kq = per_head_in_range("kq", kq, x3.shape[0], KQ_MIN, KQ_MAX, "KQ")
    if impl == "numpy":
        result = _spec(x3, kq, out_code).astype(OUT_DTYPES[out])
    elif impl == "numba":
        x3 = np.ascontiguousarray(x3)
        result = np.empty(x3.shape, OUT_DTYPES[out])
        terms = np.empty(x3.shape[-1], np.int32)
        for h in range(x3.shape[0]):
            aie_exp_rows2(x3[h], kq[h], out_code, result[h], terms)
    else:
        raise ValueError(f"impl: expected 'numba' or 'numpy', got {impl!r}")
    return result[0] if squeeze else result


def predict_aie(params, x: np.ndarray, *, impl: str = "numba") -> np.ndarray:
    """The bits the AI Engine project of ``params`` (an HccsParams of profile "paper", as ``somatile build
    --top aie`` generates it) returns for int8 logits (H, R, cols): HCCS on calibrated heads (aie4ml's HCCS
    kernel follows :func:`hccs.hccs_int`), aie4ml's exact exp on fallback heads, which is what
    ``params.apply_int`` computes when the file says ``fallback_exp: aie4ml``. A file whose fallback heads
    name somatile's exp has no AI Engine project (ValueError naming the key)."""
    if params.profile != "paper":
        raise ValueError(f"params: profile {params.profile!r} has no AI Engine kernel; expected 'paper'")
    if params.fallback.any() and params.fallback_exp != "aie4ml":
        raise ValueError(f"params: key 'fallback_exp': {params.fallback_exp!r}; the AI Engine runs aie4ml's "
                         f"exact exp on fallback heads, so only a file with fallback_exp: aie4ml predicts its bits")
    if x.ndim != 3 or x.shape[0] != params.heads or x.shape[-1] != params.cols:
        raise ValueError(f"x: expected ({params.heads}, R, {params.cols}) logits, got {x.shape}")
    return params.apply_int(x, impl=impl)
