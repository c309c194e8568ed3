"""Integer-exp softmax for the heads that keep the exponential (HCCS fallback heads).

An I-BERT-style integer exponential (Kim et al., arXiv 2101.01321) rewritten in base 2 so that the range
reduction is a shift: with logits x * scale, the distance t = max - x (0..255) becomes a log2 distance
u = t * M in Q15 (M = round(scale * log2(e) * 2**15), the head's integer input scale), split into an integer
part z = u >> 15 and a fraction r = u & 0x7fff; 2**-(r / 2**15) comes from I-BERT's quadratic expressed in base
2 with both ends pinned (2**0 = 1 exactly, 2**-1 within 1 LSB), and E = e(r) >> z, rounded half up (a
floor there biases every small term down and costs long rows up to 2.5x the error). The row is then normalised
with one reciprocal per row as in HCCS div mode, after a leading-bit pre-shift that brings the row sum into
[2**14, 2**15). Every step is a shift, an add, a multiply or a small compare; docs/numerics.md (section
"Integer-exp softmax") lists widths and rounding.

Output: uint8 (255 = probability 1, the scale of HCCS div) or int16 (32767 = 1). Mask semantics as HCCS:
True = element takes part, masked elements output 0, a fully-masked row outputs all zeros.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from somatile.model import nbcache
from somatile.model.hccs import (INT16_MAX, OUT_CODES, OUT_DTYPES, OUT_UINT8, UINT8_MAX, as_heads, ashr_i32,
                                 code_of, flat_view, floor_log2, leading_bit, masked_max_at, mul_i32,
                                 per_head_in_range, shl_i32, sub_i32)

# Its kernels inline @njit code of these files: a change there must reach this module's numba cache.
nbcache.drop_stale(__file__, ("intexp.py", "hccs.py"))

EXP_FRAC_BITS = 15
"""Fraction bits of the log2 distance u and of the exponential e (Q15: 32768 = 1.0)."""
EXP_ONE = 1 << EXP_FRAC_BITS
EXP_MULT_MIN, EXP_MULT_MAX = 1, 65535
"""Integer input scale M (16 bit unsigned): largest representable scale is 65535 / 2**15 / log2(e) = 1.386."""
EXP_ZERO_SHIFT = 16
"""z >= 16 gives E = 0 (e <= 2**15 is shifted out)."""
POLY_B = 63969
"""b * 2**15, b = 1.952164 = I-BERT's 1.353 / ln 2 (refit with the ends pinned)."""
POLY_A = 5641
"""a * 2**15, a = 0.172157 = 0.5 / (2b - 1)."""
POLY_C = 11271
"""Chosen so that e(0) = 32768 exactly; e(32767) = 16385 >= e(0) / 2, so E never increases with t."""
SUM_NORM_BITS = 15
"""The row sum is pre-shifted into [2**14, 2**15) before the reciprocal."""
MAX_COLS = (1 << 31) // EXP_ONE - 1
"""Row length bound that keeps the int32 row sum of E <= 32768 per element from overflowing."""
UINT8_NUMERATOR = UINT8_MAX << 15
INT16_NUMERATOR = INT16_MAX << 15

WIDTHS = {
    "exp_frac_bits": EXP_FRAC_BITS, "exp_mult": (EXP_MULT_MIN, EXP_MULT_MAX), "dist_bits": 8,
    "log2_dist_bits": 24, "square_bits": 30, "exp_bits": 16, "sum_bits": 32, "sum_norm_bits": SUM_NORM_BITS,
    "inv_bits_uint8": 9, "inv_bits_int16": 17, "product_bits": 30, "max_cols": MAX_COLS,
}
"""Widths of every intermediate of the integer exponential (unsigned unless stated; see docs/numerics.md)."""


def exp_mult_from_scale(scale) -> np.ndarray:
    """Per-head integer input scale M = round_half_even(scale * log2(e) * 2**15) for logits = int8 * scale.

    Raises ValueError when a scale is not finite and positive or M falls outside 1..65535 (scale above 1.386
    or below 2.1e-5 per int8 step).
    """
    s = np.atleast_1d(np.asarray(scale, dtype=np.float64))
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"scale: expected finite positive per-head scales, got {s.tolist()}")
    mult = np.rint(s * math.log2(math.e) * EXP_ONE).astype(np.int64)
    bad = (mult < EXP_MULT_MIN) | (mult > EXP_MULT_MAX)
    if bad.any():
        h = int(np.flatnonzero(bad)[0])
        raise ValueError(f"scale: head {h} scale {s[h]:.6g} gives M = {mult[h]}, outside {EXP_MULT_MIN}.."
                         f"{EXP_MULT_MAX} (scales from 2.1e-5 to 1.386 per int8 step are representable)")
    return mult


def scale_from_exp_mult(mult) -> np.ndarray:
    """The logit scale that an integer input scale M represents exactly: M / 2**15 / log2(e)."""
    return np.asarray(mult, dtype=np.float64) / EXP_ONE / math.log2(math.e)


def exp2_frac_spec(r: np.ndarray) -> np.ndarray:
    """e(r) ~ 2**(-r / 2**15) * 2**15 for r in 0..32767 (int32 in, int32 out, floor at each shift)."""
    w = (POLY_B - r) >> 1
    square = (w * w) >> 13
    return ((POLY_A * square) >> 15) + POLY_C


def _intexp_spec(x3, valid3, mult, out: int) -> np.ndarray:
    xi = x3.astype(np.int32)
    valid = np.ones(xi.shape, bool) if valid3 is None else valid3
    m = np.where(valid, xi, -(1 << 8)).max(axis=-1, keepdims=True)
    t = np.where(valid, m - xi, 0)
    u = t * mult.astype(np.int32)[:, None, None]
    z = np.minimum(u >> EXP_FRAC_BITS, EXP_ZERO_SHIFT)
    r = u & (EXP_ONE - 1)
    rounded = (exp2_frac_spec(r) + ((1 << z) >> 1)) >> z
    big_e = np.where(valid & (z < EXP_ZERO_SHIFT), rounded, 0).astype(np.int32)
    total = big_e.sum(axis=-1, keepdims=True, dtype=np.int32)
    pre_shift = np.maximum(floor_log2(np.maximum(total, 1)) - (SUM_NORM_BITS - 1), 0)
    total_norm = total >> pre_shift
    numerator = UINT8_NUMERATOR if out == OUT_UINT8 else INT16_NUMERATOR
    inv = np.where(total > 0, numerator // np.maximum(total_norm, 1), 0).astype(np.int32)
    return ((big_e >> pre_shift) * inv) >> 15


@numba.njit(cache=True, nogil=True, inline="always")
def _exp_term(m, x, mult):
    """E of steps 2-7 (docs/numerics.md) for the valid element x of a row with max m, in int32: every
    intermediate fits (u < 2**24, w*w < 2**30). The shifts, multiplies and subtractions are int32 ones
    (:func:`hccs.ashr_i32` and its siblings): numba types them int64, and LLVM then keeps several of them
    in 64-bit lanes."""
    u = mul_i32(sub_i32(m, np.int32(x)), mult)
    z = ashr_i32(u, EXP_FRAC_BITS)
    w = ashr_i32(sub_i32(POLY_B, np.int32(u & (EXP_ONE - 1))), 1)
    e = np.int32(ashr_i32(mul_i32(POLY_A, ashr_i32(mul_i32(w, w), 13)), 15) + POLY_C)
    shift = z if z < EXP_ZERO_SHIFT else np.int32(EXP_ZERO_SHIFT)
    rounded = ashr_i32(np.int32(e + np.int32(shl_i32(np.int32(1), shift) >> 1)), shift)
    return rounded if z < EXP_ZERO_SHIFT else np.int32(0)


@numba.njit(cache=True, nogil=True)
def intexp_row(x_row, valid_row, mult, out_code, out_row):
    """Integer-exp softmax of one row, callable from other ``@njit`` code; returns the row sum of E.

    x_row: int8 array of length N (or any integer array holding int8 values); valid_row: bool (N,) with
    True = takes part, or length 0 (every element takes part); mult: the head's integer input scale M
    (1..65535); out_code: OUT_UINT8 or OUT_INT16; out_row: integer array (N,) receiving the output (0 at
    masked positions and in a fully-masked row). E is computed twice rather than stored, so that nothing is
    allocated; many rows of a head go faster through :func:`intexp_rows2` with a scratch row.
    """
    return _intexp_flat(np.ascontiguousarray(x_row), np.ascontiguousarray(valid_row), valid_row.shape[0] == 0,
                        1, x_row.shape[0], mult, out_code, out_row, np.empty(0, np.int32))


@numba.njit(cache=True, nogil=True)
def intexp_rows2(x2, valid2, mult, out_code, out2, terms):
    """:func:`intexp_row` of every row of x2 (R, N) into out2 (R, N), C-contiguous, with one head's integer
    input scale; valid2 (R, N), or (R, 0) when every element takes part; terms: int32 scratch of length >= N
    that receives each row's E once (the exponential costs more than the rest of the row), or of length 0:
    E is then computed twice per element, so that nothing is allocated. Returns the sum of the row sums of
    E. Single thread.

    The loops are written out here, with rows addressed by unsigned offsets into the flat arrays, for the
    reasons of :func:`hccs.hccs_rows2` (reference counting of array arguments, negative-index wrap-around);
    each variant (masked or not, E stored or not) has its own loop, so that no loop body branches. (A
    per-head table of E by distance, 256 entries, was measured slower: the lookups do not vectorise.)
    """
    rows, n = x2.shape
    return _intexp_flat(flat_view(x2), flat_view(valid2), valid2.shape[1] == 0, rows, n, mult, out_code,
                        flat_view(out2), terms)


@numba.njit(cache=True, nogil=True, inline="always")
def _intexp_flat(x, valid, every, rows, n, mult, out_code, out, terms):
    """The rows of :func:`intexp_rows2` over the flat arrays x and out (rows * n elements) and valid (the
    same, or ignored when ``every``)."""
    stored = terms.shape[0] >= n
    mult32 = np.int32(mult)
    numerator = np.uint32(UINT8_NUMERATOR if out_code == OUT_UINT8 else INT16_NUMERATOR)
    grand_total = np.int64(0)
    for r in range(rows):
        x0 = np.uint64(r * n)
        m, count = masked_max_at(x, valid, x0, n, every)
        if count == 0:
            for i in range(n):
                out[x0 + np.uint64(i)] = 0
            continue
        total = np.int32(0)
        if stored and every:
            for i in range(n):
                big_e = _exp_term(m, x[x0 + np.uint64(i)], mult32)
                terms[i] = big_e
                total = np.int32(total + big_e)
        elif stored:
            for i in range(n):
                big_e = _exp_term(m, x[x0 + np.uint64(i)], mult32)
                big_e = big_e if valid[x0 + np.uint64(i)] else np.int32(0)
                terms[i] = big_e
                total = np.int32(total + big_e)
        elif every:
            for i in range(n):
                total = np.int32(total + _exp_term(m, x[x0 + np.uint64(i)], mult32))
        else:
            for i in range(n):
                big_e = _exp_term(m, x[x0 + np.uint64(i)], mult32)
                total = np.int32(total + (big_e if valid[x0 + np.uint64(i)] else np.int32(0)))
        grand_total += total
        pre_shift = np.int32(max(leading_bit(total) - (SUM_NORM_BITS - 1), 0))
        inv = np.int32(numerator // np.uint32(total >> pre_shift))
        if stored:
            for i in range(n):
                out[x0 + np.uint64(i)] = np.int32(np.int32(ashr_i32(terms[i], pre_shift) * inv) >> 15)
        elif every:
            for i in range(n):
                out[x0 + np.uint64(i)] = np.int32(np.int32(ashr_i32(_exp_term(m, x[x0 + np.uint64(i)], mult32),
                                                                    pre_shift) * inv) >> 15)
        else:
            for i in range(n):
                p = np.int32(np.int32(ashr_i32(_exp_term(m, x[x0 + np.uint64(i)], mult32), pre_shift) * inv) >> 15)
                out[x0 + np.uint64(i)] = p if valid[x0 + np.uint64(i)] else 0
    return grand_total


@numba.njit(cache=True, nogil=True)
def intexp_heads(x3, valid3, mult, out_code, out3):
    """:func:`intexp_rows2` of every head of x3 (H, R, N) with head h's M = mult[h], in one call from
    Python; valid3 (H, R, N) or (H, R, 0)."""
    terms = np.empty(x3.shape[2], np.int32)
    for h in range(x3.shape[0]):
        intexp_rows2(x3[h], valid3[h], mult[h], out_code, out3[h], terms)


def intexp_softmax(x: np.ndarray, mult, *, out: str = "uint8", mask=None, impl: str = "numba") -> np.ndarray:
    """Integer-exp softmax of int8 logits (bit-exact contract: docs/numerics.md, "Integer-exp softmax").

    x: int8 (R, N) or (H, R, N), logits = x * scale; mult: integer input scale M per head (int or length-H
    sequence, see :func:`exp_mult_from_scale`); out: "uint8" (255 = 1) or "int16" (32767 = 1); mask: bool
    of x's shape, True = takes part; impl: "numba" or "numpy" (bit-identical). Returns uint8/int16 of x's
    shape; rows sum to at most the output's 1.0 (floor rounding).
    """
    out_code = code_of(OUT_CODES, "out", out)
    x3, valid3, squeeze = as_heads(x, mask)
    if x3.shape[-1] > MAX_COLS:
        raise ValueError(f"x: rows of {x3.shape[-1]} elements exceed the int32 row sum ({MAX_COLS} max)")
    mult = per_head_in_range("mult", mult, x3.shape[0], EXP_MULT_MIN, EXP_MULT_MAX, "M")
    if impl == "numpy":
        result = _intexp_spec(x3, valid3, mult, out_code).astype(OUT_DTYPES[out])
    elif impl == "numba":
        result = np.empty(x3.shape, OUT_DTYPES[out])
        x3 = np.ascontiguousarray(x3)
        valid = np.empty(x3.shape[:2] + (0,), np.bool_) if valid3 is None else np.ascontiguousarray(valid3)
        intexp_heads(x3, valid, mult, out_code, result)
    else:
        raise ValueError(f"impl: expected 'numba' or 'numpy', got {impl!r}")
    return result[0] if squeeze else result
