"""The integer constants and fixed-point helpers of Soma, shared by every implementation of the integer path.

The numpy spec (:mod:`somatile.model.soma_int`), the numba fast path (:mod:`somatile.model.soma_nb`), the
configuration checks of :mod:`somatile.model.soma`, the RTL (``hw/soma.py``), the tile's golden model and the
Metal kernels take these from here; docs/numerics.md (section "Soma") is the contract they implement. Only
numpy is imported, so that validating a configuration does not load numba.

``cfg`` below is a :class:`somatile.model.soma.SomaConfig` (read through its fields only).
"""

from __future__ import annotations

import math

import numpy as np

INT8_MIN, INT8_MAX = -128, 127
INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
INT_MULT_MAX = (1 << 15) - 1
INT_SHIFT_MAX = 47
GAMMA_Q15_ONE = 1 << 15
FIELD_FRAC_BITS = 7
GATE_FRAC_BITS = 7
GATE_ONE = 1 << GATE_FRAC_BITS
GATE_HALF = GATE_ONE // 2
COUNTER_MAX = (1 << 31) - 1
MAX_INT_HEAD_DIM = 256
NORM_HCCS = 0
NORM_EXP = 1
NORM_CODES = {"hccs_int": NORM_HCCS, "exp_int": NORM_EXP}
PROFILE_PAPER, PROFILE_WIDE = 0, 1
PROFILE_CODES = {"paper": PROFILE_PAPER, "wide": PROFILE_WIDE}

PARAM_ROWS = ("score_mult", "score_shift", "recency_int", "hccs_B", "hccs_S", "hccs_dmax", "exp_mult",
              "out_mult", "out_shift", "alpha_mult", "alpha_shift", "gate_mult", "gate_shift")
"""Row order of the (13, n_heads) int64 parameter table that the numba kernel (and the tile) reads."""


def rshift_round(x, shift):
    """Round-half-up arithmetic right shift: (x + (2^shift >> 1)) >> shift (shift 0 leaves x). int64."""
    x = np.asarray(x, np.int64)
    shift = np.asarray(shift, np.int64)
    return (x + ((np.int64(1) << shift) >> 1)) >> shift


def saturate(x, lo, hi):
    """Clamp to [lo, hi] (the saturation of every narrowing step)."""
    return np.clip(x, lo, hi)


def fixed_point(factor: float, name: str) -> tuple[int, int]:
    """(mult, shift) with mult / 2^shift ~ factor, mult in [0, 2^15 - 1] as large as possible, shift <= 47.

    Round half to even on the multiplier; a factor too large for shift 0 raises ValueError naming ``name``.
    """
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"{name}: expected a finite factor >= 0, got {factor!r}")
    if factor == 0:
        return 0, 0
    exponent = math.frexp(factor)[1]
    shift = min(max(15 - exponent, 0), INT_SHIFT_MAX)
    mult = round(factor * 2.0 ** shift)
    if mult > INT_MULT_MAX:
        shift -= 1
        mult = round(factor * 2.0 ** shift)
    if shift < 0 or mult > INT_MULT_MAX:
        raise ValueError(f"{name}: factor {factor:.6g} exceeds the largest multiplier {INT_MULT_MAX}")
    return int(mult), int(shift)


def field_update(f: np.ndarray, x: np.ndarray, gamma_q15: int) -> np.ndarray:
    """F <- (gamma * F + (2^15 - gamma) * (x << 7) + 2^14) >> 15: int16 F (7 fraction bits), int8 x."""
    acc = gamma_q15 * f.astype(np.int64) + (GAMMA_Q15_ONE - gamma_q15) * (x.astype(np.int64) << FIELD_FRAC_BITS)
    return rshift_round(acc, 15).astype(np.int16)


def param_table(cfg) -> np.ndarray:
    """The per-query-head integer parameters as int64 (len(PARAM_ROWS), n_heads); unused rows are 0."""
    rows = [getattr(cfg, name) or (0,) * cfg.n_heads for name in PARAM_ROWS]
    return np.array(rows, np.int64)


def out_dtype(cfg) -> np.dtype:
    """dtype of the integer path's attention output: int8 (profile "paper") or int16 ("wide")."""
    return np.dtype(np.int16 if cfg.profile == "wide" else np.int8)
