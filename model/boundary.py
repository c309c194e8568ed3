"""The float <-> int8 boundary of one attention layer: calibrated static scales, K smoothing, per-channel scales.

The integer decode step (:mod:`somatile.model.soma_int`) takes int8 q, k, v and per-head multipliers; what
the boundary does before it is where most of the accuracy of an integer attention is won or lost
(docs/numerics.md, "Wide profile: the boundary"). Every lever here is exact algebra on the float side and
costs nothing inside the integer step:

- **K smoothing** (SageAttention): ``k - mu`` with ``mu`` the calibrated per-channel mean of the keys (after
  RoPE). ``q . mu`` is the same for every key of a row, so it cancels under softmax and under every
  normaliser that subtracts the row maximum. On hardware ``mu`` folds into the key projection's bias.
- **Per-channel K scales** moved into q (SmoothQuant's migration): ``q . k = (q * s) . (k / s)``, so k is
  quantised per channel and q per head after multiplying by s. On hardware ``s`` folds into the query and
  key projection weights.
- **Per-channel V scales**: the attention output is a convex combination of values, so it has the values'
  per-channel scale; the output's dequantisation scale is per channel and folds into the output projection.
- The output is int16 in the wide profile: ``out_scale = v_scale / 2^out_extra_bits``.

Scales are static (from calibration tokens only; evaluation data never enters them): ``max |x| / 127`` over
the calibration tokens, so an evaluation token outside that range saturates, as it would on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from somatile.model.soma import SomaConfig
from somatile.model.soma_fixed import INT8_MAX, INT8_MIN
from somatile.model.soma_int import integer_config

LEVERS = ("smooth_k", "per_channel")


def _peak(x: np.ndarray, axes) -> np.ndarray:
    m = np.abs(x).max(axis=axes)
    return np.where(m > 0, m, 1.0) / INT8_MAX


def _int8(x) -> np.ndarray:
    return np.clip(np.rint(x), INT8_MIN, INT8_MAX).astype(np.int8)


@dataclass(frozen=True)
class Boundary:
    """Static quantisation of one layer: int8 q = rint(q * k_scale[kv] / q_scale), k = rint((k - k_mean) /
    k_scale), v = rint(v / v_scale) (saturated); float output = int output * out_scale.

    Shapes: q_scale (H,), k_mean, k_scale, v_scale (Hkv, D), out_scale (H, D). ``out_unit`` is the output
    LSB in units of the value LSB (1 for an int8 output, 2^-8 for the wide profile's int16).
    """

    q_scale: np.ndarray
    k_mean: np.ndarray
    k_scale: np.ndarray
    v_scale: np.ndarray
    out_unit: float
    group: int

    @classmethod
    def calibrate(cls, cfg: SomaConfig, q, k, v, *, smooth_k: bool = True, per_channel: bool = True,
                  out_bits: int | None = None) -> "Boundary":
        """Scales of ``cfg``'s layer from calibration q (T, H, D), k, v (T, Hkv, D) (float).

        ``smooth_k``: subtract the per-channel key mean; ``per_channel``: per-channel K and V scales
        (otherwise one per KV head); ``out_bits``: bits of the integer output (default: 16 for the wide
        profile, 8 for the paper profile)."""
        q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
        out_bits = out_bits or (16 if cfg.profile == "wide" else 8)
        if out_bits not in (8, 16):
            raise ValueError(f"out_bits: expected 8 or 16, got {out_bits}")
        mean = k.mean(axis=0) if smooth_k else np.zeros(k.shape[1:])
        ks = k - mean
        if per_channel:
            k_scale, v_scale = _peak(ks, 0), _peak(v, 0)
        else:
            k_scale = np.repeat(_peak(ks, (0, 2))[:, None], k.shape[2], axis=1)
            v_scale = np.repeat(_peak(v, (0, 2))[:, None], v.shape[2], axis=1)
        kv = np.arange(cfg.n_heads) // cfg.group
        q_scale = _peak(q * k_scale[kv], (0, 2))
        return cls(q_scale=q_scale, k_mean=mean, k_scale=k_scale, v_scale=v_scale,
                   out_unit=2.0 ** -(out_bits - 8), group=cfg.group)

    @property
    def out_scale(self) -> np.ndarray:
        return np.repeat(self.v_scale, self.group, axis=0) * self.out_unit

    def quantize(self, q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Float q (T, H, D), k, v (T, Hkv, D) -> the int8 inputs of the integer step."""
        kv_of_q = np.repeat(self.k_scale, self.group, axis=0)
        return (_int8(np.asarray(q, np.float64) * kv_of_q / self.q_scale[:, None]),
                _int8((np.asarray(k, np.float64) - self.k_mean) / self.k_scale),
                _int8(np.asarray(v, np.float64) / self.v_scale))

    def dequantize(self, out: np.ndarray) -> np.ndarray:
        """Integer output (T, H, D) -> float32."""
        return (out.astype(np.float64) * self.out_scale).astype(np.float32)

    def integer_config(self, cfg: SomaConfig) -> SomaConfig:
        """``cfg`` (float, with its normaliser and profile) as an integer config reading this boundary's
        int8 inputs: k and v are in their own LSBs (scale 1), q in ``q_scale``, the output in ``out_unit``."""
        if cfg.alpha and cfg.field_source == "keys":
            raise ValueError("Boundary: a far field of keys has per-channel key units; use field_source='values'")
        return integer_config(cfg, q_scale=self.q_scale, k_scale=1.0, v_scale=1.0, out_scale=self.out_unit)
