"""Normaliser kernels of the "wide" integer profile: int16 base-2 logits in, Q15 probabilities out.

The "paper" profile (:mod:`somatile.model.hccs`, :mod:`somatile.model.intexp`) is the HCCS paper's AI Engine
kernel ABI: int8 logits, an int16 row sum and uint8 probabilities. Every one of those narrowings costs a
language model accuracy (docs/numerics.md, "Wide profile", has the measurements). This profile keeps

- logits as **int16 in base-2 units with 8 fraction bits** (``x = logit * log2(e) * 256``): one step is
  1/256 of a bit (0.27 % in exp), the range +-128 bits covers every logit a real model produces, and the
  exponential's range reduction is a shift with no per-head input multiplier;
- a **32-bit row sum** and an exact reciprocal of it (one division per row, about 2^-15 relative error);
- **Q15 probabilities** (32768 = 1) into P.V.

Three normalisers share the row max, the distance ``t = m - x`` and the normalisation; they differ only in
the weight ``E(t)`` (0..32768) of an element:

- ``exp``: the integer exponential ``E = 2^(-t/256)`` in Q15: a shift by the integer part of t and I-BERT's
  quadratic (base 2, ends pinned; the polynomial of :mod:`somatile.model.intexp`) for the fraction;
- ``hccs``: HCCS's clipped line in the wide units, ``E = B - ((S * min(t, dmax)) >> 8)``;
- ``pwl2``: an exp-free member of the HCCS family: ``u = (S * min(t, dmax)) >> 8`` (S in Q8 is a per-head
  slope, 256 = the model's own temperature), then ``E`` is piecewise linear in u with ``PWL2_SEGMENTS``
  segments per octave between the knots ``2^(-j/K)`` and one shift per octave: no exponential, a 5-entry
  knot table and one small multiply (knot difference times offset) beyond HCCS's ``S * d``.

Masks as in HCCS: True = takes part; masked elements output 0; a row without a valid element outputs zeros.
Two implementations, ``impl="numpy"`` (the readable spec) and ``impl="numba"`` (the row kernel
:func:`wide_row` that the Soma decode step also calls), agree bit for bit. Every constant is here;
docs/numerics.md ("Wide profile") lists the steps with their widths and rounding.
"""

from __future__ import annotations

import numba
import numpy as np

from somatile.model import nbcache
from somatile.model.hccs import as_heads, floor_log2, leading_bit, per_head
from somatile.model.intexp import POLY_A, POLY_B, POLY_C

# Its kernels inline @njit code of these files: a change there must reach this module's numba cache.
nbcache.drop_stale(__file__, ("wide.py", "hccs.py", "intexp.py"))

LOGIT_BITS = 16
"""Logits enter as int16."""
LOGIT_FRAC_BITS = 8
"""Logit unit: 2^-8 of a bit (log2 units): x = logit_nats * log2(e) * 2^8."""
LOGIT_MIN, LOGIT_MAX = -(1 << 15), (1 << 15) - 1
PROB_BITS = 15
PROB_ONE = 1 << PROB_BITS
"""Probabilities and element weights are Q15: 32768 = 1 (unsigned 16 bit: 0..32768)."""
ZERO_SHIFT = 16
"""An octave shift z >= 16 moves every Q15 weight below 1/2 LSB: the weight is 0."""
DIST_MAX = (1 << 16) - 1
"""t = m - x of two int16 values: 0..65535 (unsigned 16 bit)."""
S_FRAC_BITS = 8
"""Slopes S are Q8 (256 = 1)."""
B_MIN, B_MAX = 1, PROB_ONE
S_MIN, S_MAX = 0, (1 << 16) - 1
DMAX_MIN, DMAX_MAX = 0, DIST_MAX
MAX_COLS = (1 << 16) - 1
"""Row length bound: N * 32768 < 2^31 keeps the row sum in int32."""
SUM_NORM_BITS = 16
"""The row sum is shifted (either way) into [2^15, 2^16) before the reciprocal."""
RECIP_BITS = 31
"""inv = floor(2^31 / normalised sum), in (2^15, 2^16]."""
PWL2_SEGMENTS = 4
PWL2_SEG_BITS = 2
"""log2(PWL2_SEGMENTS): the top two of the 8 fraction bits pick the segment, the other six interpolate."""
PWL2_KNOTS = tuple(int(round(PROB_ONE * 2.0 ** (-j / PWL2_SEGMENTS))) for j in range(PWL2_SEGMENTS + 1))
"""Q15 knots 2^(-j/4), j = 0..4: (32768, 27554, 23170, 19484, 16384); the last is exactly half the first,
so consecutive octaves join without a step."""

NORM_EXP, NORM_HCCS, NORM_PWL2 = 0, 1, 2
NORM_CODES = {"exp": NORM_EXP, "hccs": NORM_HCCS, "pwl2": NORM_PWL2}

WIDTHS = {
    "logit_bits": LOGIT_BITS, "logit_frac_bits": LOGIT_FRAC_BITS, "dist_bits": 16, "prob_bits": PROB_BITS,
    "weight_bits": 16, "slope_product_bits": 32, "sum_bits": 32, "sum_norm_bits": SUM_NORM_BITS,
    "recip_bits": RECIP_BITS, "inv_bits": 17, "product_bits": 32, "max_cols": MAX_COLS,
    "B": (B_MIN, B_MAX), "S": (S_MIN, S_MAX), "dmax": (DMAX_MIN, DMAX_MAX), "pwl2_knots": PWL2_KNOTS,
}
"""Every width and range of the wide normalisers (unsigned unless stated; docs/numerics.md)."""

_KNOTS = np.array(PWL2_KNOTS, np.int64)


def check_params(normaliser: str, B, S, dmax, heads: int):
    """Per-head (B, S, dmax) as int64 (heads,) for ``normaliser``; ValueError naming the head and the rule.

    ``exp`` takes no parameters (pass zeros). ``hccs``: 1 <= B <= 32768, 0 <= S, dmax <= 65535 and
    ``B - ((S*dmax) >> 8) >= 0`` (weights never negative). ``pwl2``: B unused (0 allowed),
    0 <= S, dmax <= 65535.
    """
    if normaliser not in NORM_CODES:
        raise ValueError(f"normaliser: expected one of {sorted(NORM_CODES)}, got {normaliser!r}")
    B, S, dmax = (per_head(n, v, heads) for n, v in (("B", B), ("S", S), ("dmax", dmax)))
    if normaliser == "exp":
        return B, S, dmax
    for h in range(heads):
        where = f"head {h}: " if heads > 1 else ""
        checks = [("S", int(S[h]), S_MIN, S_MAX), ("dmax", int(dmax[h]), DMAX_MIN, DMAX_MAX)]
        if normaliser == "hccs":
            checks.insert(0, ("B", int(B[h]), B_MIN, B_MAX))
        for name, val, lo, hi in checks:
            if not lo <= val <= hi:
                raise ValueError(f"{where}{name} = {val} is outside {lo}..{hi} ({normaliser}, wide profile)")
        if normaliser == "hccs" and int(B[h]) - ((int(S[h]) * int(dmax[h])) >> S_FRAC_BITS) < 0:
            raise ValueError(f"{where}B - ((S*dmax) >> 8) = {B[h]} - (({S[h]}*{dmax[h]}) >> 8) < 0; rule: "
                             f"weights never negative (lower S or dmax)")
    return B, S, dmax


def _octave_round(v, z):
    """v >> z rounded half up, 0 from z = 16 on (numpy spec; v, z int64 arrays)."""
    zc = np.minimum(z, ZERO_SHIFT)
    return np.where(z < ZERO_SHIFT, (v + ((np.int64(1) << zc) >> 1)) >> zc, 0)


def weights_spec(t, code: int, B, S, dmax):
    """Element weights E (int64, 0..32768) of distances t (int64 >= 0) for one normaliser (numpy spec);
    B, S, dmax broadcast against t."""
    if code == NORM_EXP:
        r = (t & 0xFF) << (15 - LOGIT_FRAC_BITS)
        w = (POLY_B - r) >> 1
        e = ((POLY_A * ((w * w) >> 13)) >> 15) + POLY_C
        return _octave_round(e, t >> LOGIT_FRAC_BITS)
    d = np.minimum(t, dmax)
    if code == NORM_HCCS:
        return B - ((S * d) >> S_FRAC_BITS)
    u = (S * d) >> S_FRAC_BITS
    f = u & 0xFF
    seg = f >> (LOGIT_FRAC_BITS - PWL2_SEG_BITS)
    g = f & ((1 << (LOGIT_FRAC_BITS - PWL2_SEG_BITS)) - 1)
    hi, lo = _KNOTS[seg], _KNOTS[seg + 1]
    v = hi - (((hi - lo) * g) >> (LOGIT_FRAC_BITS - PWL2_SEG_BITS))
    return _octave_round(v, u >> LOGIT_FRAC_BITS)


def normalise_spec(E, valid):
    """Q15 probabilities (int64) of weights E (..., N) over bool ``valid``; steps 5-8 of docs/numerics.md."""
    E = np.where(valid, E, 0).astype(np.int64)
    total = E.sum(axis=-1, keepdims=True)
    k = floor_log2(np.maximum(total, 1)).astype(np.int64) - (SUM_NORM_BITS - 1)
    tn = np.where(k >= 0, total >> np.maximum(k, 0), total << np.maximum(-k, 0))
    inv = (np.int64(1) << RECIP_BITS) // np.maximum(tn, 1)
    s = SUM_NORM_BITS + k
    p = np.minimum((E * inv + ((np.int64(1) << s) >> 1)) >> s, PROB_ONE)
    return np.where(valid & (total > 0), p, 0)


def _spec(x3, valid3, code, B, S, dmax):
    xi = x3.astype(np.int64)
    valid = np.ones(xi.shape, bool) if valid3 is None else valid3
    m = np.where(valid, xi, LOGIT_MIN).max(axis=-1, keepdims=True)
    t = np.where(valid, m - xi, 0)
    B, S, dmax = (p.astype(np.int64)[:, None, None] for p in (B, S, dmax))
    return normalise_spec(weights_spec(t, code, B, S, dmax), valid)


@numba.njit(cache=True, nogil=True, inline="always")
def _octave(v, z):
    """rshr(v, z), 0 from z = 16 on: v >= 0 and z >= 0 are uint32 (v <= 32768), so every lane stays 32 bit."""
    zc = z if z < ZERO_SHIFT else np.uint32(ZERO_SHIFT)
    r = (v + ((np.uint32(1) << zc) >> np.uint32(1))) >> zc
    return r if z < ZERO_SHIFT else np.uint32(0)


@numba.njit(cache=True, nogil=True, inline="always")
def _exp_weight(t):
    r = (t & np.uint32(0xFF)) << np.uint32(15 - LOGIT_FRAC_BITS)
    w = (np.uint32(POLY_B) - r) >> np.uint32(1)
    e = ((np.uint32(POLY_A) * ((w * w) >> np.uint32(13))) >> np.uint32(15)) + np.uint32(POLY_C)
    return _octave(e, t >> np.uint32(LOGIT_FRAC_BITS))


@numba.njit(cache=True, nogil=True, inline="always")
def _pwl2_weight(t, s, dm):
    d = t if t < dm else dm
    u = (s * d) >> np.uint32(S_FRAC_BITS)            # S*d < 2^32: exact in uint32
    f = u & np.uint32(0xFF)
    g = f & np.uint32((1 << (LOGIT_FRAC_BITS - PWL2_SEG_BITS)) - 1)
    seg = f >> np.uint32(LOGIT_FRAC_BITS - PWL2_SEG_BITS)
    # the 5-entry knot table as selects (a gather would keep the loop from vectorising)
    hi = np.uint32(PWL2_KNOTS[0]) if seg == 0 else (np.uint32(PWL2_KNOTS[1]) if seg == 1 else (
        np.uint32(PWL2_KNOTS[2]) if seg == 2 else np.uint32(PWL2_KNOTS[3])))
    lo = np.uint32(PWL2_KNOTS[1]) if seg == 0 else (np.uint32(PWL2_KNOTS[2]) if seg == 1 else (
        np.uint32(PWL2_KNOTS[3]) if seg == 2 else np.uint32(PWL2_KNOTS[4])))
    v = hi - (((hi - lo) * g) >> np.uint32(LOGIT_FRAC_BITS - PWL2_SEG_BITS))
    return _octave(v, u >> np.uint32(LOGIT_FRAC_BITS))


@numba.njit(cache=True, nogil=True)
def _store_weights(x_row, valid_row, every, m, code, B, S, dmax, out_row):
    """E of every element into out_row (0 where masked; E <= 32768 fits any output dtype of 16 unsigned bits
    or more), one specialised loop per normaliser; returns the row sum (< 2^31)."""
    n = x_row.shape[0]
    mu = np.int32(m)
    s_, dm, b = np.uint32(S), np.uint32(dmax), np.uint32(B)
    total = np.int64(0)
    if code == NORM_EXP:
        for i in range(n):
            e = _exp_weight(np.uint32(mu - np.int32(x_row[i])))
            e = e if every or valid_row[i] else np.uint32(0)
            out_row[i] = e
            total += e
    elif code == NORM_HCCS:
        for i in range(n):
            t = np.uint32(mu - np.int32(x_row[i]))
            d = t if t < dm else dm
            e = b - ((s_ * d) >> np.uint32(S_FRAC_BITS))
            e = e if every or valid_row[i] else np.uint32(0)
            out_row[i] = e
            total += e
    else:
        for i in range(n):
            e = _pwl2_weight(np.uint32(mu - np.int32(x_row[i])), s_, dm)
            e = e if every or valid_row[i] else np.uint32(0)
            out_row[i] = e
            total += e
    return total


@numba.njit(cache=True, nogil=True)
def wide_row(x_row, valid_row, code, B, S, dmax, out_row):
    """One row of the wide normaliser, callable from other ``@njit`` code; returns the row sum of E.

    x_row: int16 logits (or any integer array holding int16 values) of length N <= 65535; valid_row: bool
    (N,) or length 0 (every element takes part); code: NORM_EXP / NORM_HCCS / NORM_PWL2 with parameters
    that passed :func:`check_params`; out_row: integer array (N,) of at least 16 unsigned bits receiving Q15
    probabilities (0 where masked, the whole row 0 when nothing takes part). E is stored in out_row and
    normalised in place, so no scratch row is needed; every lane is 32 bit (docs/numerics.md widths).
    """
    n = x_row.shape[0]
    every = valid_row.shape[0] == 0
    m = np.int32(LOGIT_MIN)
    count = 0
    for i in range(n):
        ok = every or valid_row[i]
        xi = np.int32(x_row[i]) if ok else np.int32(LOGIT_MIN)
        m = xi if xi > m else m
        count += 1 if ok else 0
    if count == 0:
        for i in range(n):
            out_row[i] = 0
        return np.int64(0)
    total = _store_weights(x_row, valid_row, every, m, code, B, S, dmax, out_row)
    k = np.int64(leading_bit(total)) - (SUM_NORM_BITS - 1)
    tn = total >> k if k >= 0 else total << -k
    inv = np.uint32((np.int64(1) << RECIP_BITS) // tn)
    s = np.uint32(SUM_NORM_BITS + k)
    half = (np.uint32(1) << s) >> np.uint32(1)
    one = np.uint32(PROB_ONE)
    for i in range(n):
        p = (np.uint32(out_row[i]) * inv + half) >> s     # E * inv <= 2^31, + half < 2^32
        out_row[i] = p if p < one else one
    return total


@numba.njit(cache=True, nogil=True)
def _rows(x3, valid3, code, B, S, dmax, out3):
    for h in range(x3.shape[0]):
        for r in range(x3.shape[1]):
            wide_row(x3[h, r], valid3[h, r], code, B[h], S[h], dmax[h], out3[h, r])


def as_wide_logits(x, mask, name: str = "x"):
    """Check int16 logits (R, N) / (H, R, N) and a mask; returns (x3, valid3, squeeze) like hccs.as_heads."""
    x3, valid3, squeeze = as_heads(x, mask, name, dtype=np.int16)
    if x3.shape[-1] > MAX_COLS:
        raise ValueError(f"{name}: rows of {x3.shape[-1]} elements exceed the int32 row sum ({MAX_COLS} max)")
    return x3, valid3, squeeze


def wide_softmax(x: np.ndarray, normaliser: str = "exp", B=0, S=256, dmax=DMAX_MAX, *, mask=None,
                 impl: str = "numba") -> np.ndarray:
    """Wide-profile normaliser of int16 base-2 logits (bit-exact contract: docs/numerics.md, "Wide profile").

    x: int16 (R, N) or (H, R, N), logits in 2^-8 bit units; normaliser: "exp", "hccs" or "pwl2"; B, S,
    dmax: ints or per-head sequences (see :func:`check_params`; ignored by "exp"); mask: bool of x's shape,
    True = takes part; impl: "numba" or "numpy" (bit-identical). Returns uint16 Q15 probabilities (32768 =
    1) of x's shape; a row sums to 32768 within about N/2 LSB (round half up per element).
    """
    x3, valid3, squeeze = as_wide_logits(x, mask)
    B, S, dmax = check_params(normaliser, B, S, dmax, x3.shape[0])
    code = NORM_CODES[normaliser]
    if impl == "numpy":
        result = _spec(x3, valid3, code, B, S, dmax).astype(np.uint16)
    elif impl == "numba":
        result = np.empty(x3.shape, np.uint16)
        valid = np.empty(x3.shape[:2] + (0,), np.bool_) if valid3 is None else np.ascontiguousarray(valid3)
        _rows(np.ascontiguousarray(x3), valid, code, B, S, dmax, result)
    else:
        raise ValueError(f"impl: expected 'numba' or 'numpy', got {impl!r}")
    return result[0] if squeeze else result


def logits_from_float(logits, mask=None) -> np.ndarray:
    """Float logits (nats) -> int16 wide logits: round_half_even(logit * log2(e) * 256), saturated; masked
    positions become -32768 (they take no part anyway)."""
    x3, valid3, squeeze = as_heads(np.asarray(logits), mask, "logits", floating=True)
    valid = np.ones(x3.shape, bool) if valid3 is None else valid3
    q = np.rint(np.where(valid, x3.astype(np.float64), 0.0) * (np.log2(np.e) * (1 << LOGIT_FRAC_BITS)))
    q = np.where(valid, np.clip(q, LOGIT_MIN, LOGIT_MAX), LOGIT_MIN).astype(np.int16)
    return q[0] if squeeze else q


def float_reference(logits, normaliser: str, B, S, dmax, mask=None) -> np.ndarray:
    """The float family that the wide integers represent, on float logits (H, R, N) in nats (float64 out):
    hccs: ``B - S' * min(d, dmax')`` normalised, with ``S' = S/256 * log2(e) * 256`` per nat and ``dmax' =
    dmax / (log2(e) * 256)`` nats; pwl2: ``exp(-(S/256) * min(d, dmax'))`` normalised (the exponential its
    segments interpolate); exp: softmax."""
    from somatile.model.hccs import float_distances, hccs_float_bsd, softmax
    if normaliser == "exp":
        return softmax(logits, mask)
    per_nat = np.log2(np.e) * (1 << LOGIT_FRAC_BITS)
    heads = np.asarray(logits).shape[0]
    B, S, dmax = (per_head(n, v, heads).astype(np.float64) for n, v in (("B", B), ("S", S), ("dmax", dmax)))
    if normaliser == "hccs":
        return hccs_float_bsd(logits, B, S / (1 << S_FRAC_BITS) * per_nat, dmax / per_nat, mask)
    dist, valid, squeeze = float_distances(logits, mask)
    d = np.minimum(np.where(valid, dist, 0.0), (dmax / per_nat)[:, None, None])
    e = np.where(valid, np.exp(-(S / (1 << S_FRAC_BITS))[:, None, None] * d), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return p[0] if squeeze else p
