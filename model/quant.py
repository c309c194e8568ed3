"""Quantisation helpers between float attention logits and the integer HCCS / integer-exp kernels.

Rounding (also in docs/numerics.md): logits -> int8 is ``round(logit / scale)`` with ties to even (numpy's
rint; ``rounding="half_away"`` rounds ties away from zero) and saturation to -128..127. The per-head scale is
symmetric: ``max |valid logit| / 127``. Masked positions quantise to -128 (they take no part anyway).
"""

from __future__ import annotations

import numpy as np

from somatile.model import hccs
from somatile.model.hccs import as_heads

ROUNDINGS = ("half_even", "half_away")


def choose_scales(logits: np.ndarray, mask=None) -> np.ndarray:
    """Per-head symmetric int8 scale (H,) float64: max |valid logit| / 127 (1/127 for an all-zero head)."""
    x3, valid3, _ = as_heads(logits, mask, "logits", floating=True)
    valid = np.ones(x3.shape, bool) if valid3 is None else valid3
    peak = np.where(valid, np.abs(np.where(valid, x3, 0.0)), 0.0).max(axis=(1, 2)).astype(np.float64)
    return np.where(peak > 0, peak, 1.0) / 127.0


def quantize_logits(logits: np.ndarray, scale, mask=None, *, rounding: str = "half_even") -> np.ndarray:
    """Float logits (R, N) or (H, R, N) -> int8 of the same shape with a per-head scale (float or (H,)).

    q = saturate(round(logit / scale), -128, 127); ties to even by default (``rounding="half_away"``: away from
    zero). Masked positions become -128.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding: expected one of {ROUNDINGS}, got {rounding!r}")
    x3, valid3, squeeze = as_heads(logits, mask, "logits", floating=True)
    s = np.asarray(scale, dtype=np.float64).reshape(-1)
    if s.size == 1:
        s = np.repeat(s, x3.shape[0])
    if s.size != x3.shape[0] or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"scale: expected one positive finite scale or {x3.shape[0]} per head, got {s.tolist()}")
    valid = np.ones(x3.shape, bool) if valid3 is None else valid3
    v = np.where(valid, x3.astype(np.float64), 0.0) / s[:, None, None]
    q = np.rint(v) if rounding == "half_even" else np.sign(v) * np.floor(np.abs(v) + 0.5)
    q = np.where(valid, np.clip(q, -128, 127), -128).astype(np.int8)
    return q[0] if squeeze else q


def max_b(cols: int) -> int:
    """Largest B the row-mass rule allows for rows of ``cols`` elements."""
    return hccs.MAX_ROW_MASS // cols


def min_floor(cols: int) -> int:
    """Smallest B - S*Dmax the floor-mass rule allows for rows of ``cols`` elements."""
    return -(-hccs.MIN_FLOOR_MASS // cols)


def int_params_for(dmax: int, floor_fraction: float, cols: int) -> tuple[int, int, int] | None:
    """Integer (B, S, dmax) for a clip of ``dmax`` int8 steps whose clipped tokens score ``floor_fraction`` of
    the top score, legal for ``cols``; None when no S >= 1 fits.

    S is the largest slope with S*dmax <= (1 - f) * B_cap (B_cap = 32767 // cols, S <= 127) and
    B = S*dmax + max(round(f / (1 - f) * S*dmax), floor-mass minimum): B follows S, so the floor fraction
    stays close to f for every dmax (with B fixed at B_cap it would jump with the rounding of S).
    """
    if not 0.0 <= floor_fraction < 1.0:
        raise ValueError(f"floor_fraction: expected a fraction in [0, 1), got {floor_fraction}")
    b_cap, floor_min = max_b(cols), min_floor(cols)
    s = min(int((1.0 - floor_fraction) * b_cap) // dmax, hccs.S_MAX)
    while s >= 1:
        b = s * dmax + max(round(floor_fraction / (1.0 - floor_fraction) * s * dmax), floor_min)
        if b <= b_cap:
            return b, s, dmax
        s -= 1
    return None


def dmax_cap(cols: int) -> int:
    """Largest dmax with a legal S >= 1 for rows of ``cols`` elements; ValueError when there is none."""
    cap = min(hccs.DMAX_MAX, max_b(cols) - min_floor(cols))
    if cap < 1:
        raise ValueError(f"cols = {cols}: no legal HCCS parameters (rows longer than "
                         f"{hccs.MAX_ROW_MASS // (1 + min_floor(cols))} elements break the row-mass rule)")
    return cap


def int_params_from_float(B, S, dmax, scale, cols: int):
    """Float (B, S, dmax) of :func:`hccs.hccs_float_bsd` in logit units -> integer (B, S, dmax) per head.

    Returns three int64 arrays (H,) that pass :func:`hccs.check_params` for ``cols``: dmax in int8 steps is
    round(dmax / scale) clamped to 1..:func:`dmax_cap` (0 would make every score equal; long rows limit B and
    with it the clip), and B, S come from :func:`int_params_for` with the float floor fraction
    (B - S*dmax) / B, so the zero floor of the seed's form becomes the floor-mass minimum.
    """
    heads = np.broadcast(np.atleast_1d(B), np.atleast_1d(S), np.atleast_1d(dmax), np.atleast_1d(scale)).shape[0]
    Bf, Sf, Df, sc = (np.broadcast_to(np.atleast_1d(np.asarray(v, np.float64)), (heads,)) for v in (B, S, dmax, scale))
    d_cap = dmax_cap(cols)
    out = np.zeros((3, heads), np.int64)
    for h in range(heads):
        if not (Bf[h] > 0 and Sf[h] >= 0 and Df[h] >= 0 and sc[h] > 0 and Bf[h] >= Sf[h] * Df[h]):
            raise ValueError(f"head {h}: expected B > 0, S >= 0, dmax >= 0, scale > 0, B >= S*dmax; got "
                             f"{Bf[h]}, {Sf[h]}, {Df[h]}, {sc[h]}")
        d = int(min(max(round(Df[h] / sc[h]), 1), d_cap))
        params = int_params_for(d, min((Bf[h] - Sf[h] * Df[h]) / Bf[h], 0.999), cols)
        if params is None:
            raise ValueError(f"head {h}: no legal integer parameters for dmax {d} at cols = {cols}")
        out[:, h] = params
    hccs.check_params(out[0], out[1], out[2], cols, heads)
    return out[0], out[1], out[2]


def int_params_from_clip(c, scale, cols: int):
    """The seed's clip range c (logit units, one or per head) -> integer (B, S, dmax) for ``cols``: the
    single-c form B = dmax = c, S = 1 through :func:`int_params_from_float` (floor raised to the minimum)."""
    return int_params_from_float(c, 1.0, c, scale, cols)


def float_params_from_int(B, S, dmax, scale):
    """Integer (B, S, dmax) and scale -> the float (B, S, dmax) in logit units that they represent exactly
    (before rounding): distances are in int8 steps of ``scale``."""
    B, S, dmax, scale = (np.asarray(v, np.float64) for v in (B, S, dmax, scale))
    return B, S / scale, dmax * scale
