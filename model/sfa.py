"""SFA: the three-channel enhancement of seed 001, added to a layer's attention output, token by token.

Per layer, for the attention output x_t (hidden,) of token t (everything float32):

1. ring buffer: write x_t into a ring of the last ``ring`` (16) outputs; ``ring_mean`` = mean of the filled
   entries (x_t included);
2. EMA field: ``field <- gamma * field + (1 - gamma) * x_t`` (gamma 0.98), read after the update;
3. semantic pool (``slots`` = 64): the seeds never write it (that channel was always zero there); here,
   each time the ring wraps (after every ``ring``-th write) its mean is written into the next slot,
   round-robin. Read: ``semantic = softmax(P q / temperature) P`` over the filled slots P with query
   ``q = ring_mean`` and ``temperature`` = sqrt(hidden) unless set (scaled dot product); zero while empty;
4. fusion: ``fused = ring_mean + 0.5 * field + 0.5 * semantic``;
5. alpha decay: ``alpha_l = alpha_base * (0.3 + 0.7 * l / (L - 1)) * cross_decay ** l`` (l / (L - 1) is 0
   for a one-layer model);
6. clip: ``enhancement = clip(alpha_l * fused, -0.5, 0.5)`` (``clip_order="alpha_then_clip"``, the seed's
   order "fusion, then alpha scaling and +-0.5 clipping") or ``alpha_l * clip(fused, -0.5, 0.5)``
   (``"clip_then_alpha"``).

The layer output is ``x_t + enhancement``. Each stage is its own function with a float32 contract so that
the Metal kernels (one per stage) are checked stage by stage.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

CLIP_ORDERS = ("alpha_then_clip", "clip_then_alpha")
F32 = np.float32


@dataclass(frozen=True)
class SfaConfig:
    """SFA settings shared by all layers of a model (validated; errors name the field)."""

    n_layers: int
    alpha_base: float = 0.1
    cross_decay: float = 0.8
    gamma: float = 0.98
    ring: int = 16
    slots: int = 64
    temperature: float | None = None
    field_weight: float = 0.5
    semantic_weight: float = 0.5
    clip: float = 0.5
    clip_order: str = "alpha_then_clip"

    def __post_init__(self):
        def bad(name, expected):
            raise ValueError(f"SfaConfig.{name}: expected {expected}, got {getattr(self, name)!r}")

        for name in ("n_layers", "ring", "slots"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                bad(name, "an integer >= 1")
        if not 0.0 <= self.gamma < 1.0:
            bad("gamma", "a number in [0, 1)")
        for name in ("alpha_base", "cross_decay", "field_weight", "semantic_weight"):
            if not math.isfinite(getattr(self, name)):
                bad(name, "a finite number")
        if not (math.isfinite(self.clip) and self.clip > 0):
            bad("clip", "a positive finite number")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature > 0):
            bad("temperature", "None (sqrt(hidden)) or a positive finite number")
        if self.clip_order not in CLIP_ORDERS:
            bad("clip_order", f"one of {CLIP_ORDERS}")

    def replace(self, **changes) -> "SfaConfig":
        return dataclasses.replace(self, **changes)


@dataclass
class SfaState:
    """State of one layer: ``ring`` (ring, hidden), ``field`` (hidden,), ``pool`` (slots, hidden), all
    float32, and the counters ``ring_pos``, ``ring_fill``, ``pool_pos``, ``pool_fill``. Updated in place."""

    ring: np.ndarray
    field: np.ndarray
    pool: np.ndarray
    ring_pos: int = 0
    ring_fill: int = 0
    pool_pos: int = 0
    pool_fill: int = 0

    @classmethod
    def new(cls, cfg: SfaConfig, hidden: int) -> "SfaState":
        if not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"SfaState.new: hidden expected an integer >= 1, got {hidden!r}")
        return cls(ring=np.zeros((cfg.ring, hidden), F32), field=np.zeros(hidden, F32),
                   pool=np.zeros((cfg.slots, hidden), F32))

    @property
    def hidden(self) -> int:
        return self.field.shape[0]

    @property
    def nbytes(self) -> int:
        return self.ring.nbytes + self.field.nbytes + self.pool.nbytes + 4 * 4


def ring_update(ring: np.ndarray, pos: int, fill: int, x: np.ndarray):
    """Stage 1. Write x (hidden,) at ``pos`` of ring (R, hidden) in place.

    Returns (ring_mean (hidden,) = sum of the filled rows / fill, new pos, new fill, wrapped) where
    ``wrapped`` is True when this write filled the last slot (pos returns to 0).
    """
    ring[pos] = x
    pos = (pos + 1) % ring.shape[0]
    fill = min(fill + 1, ring.shape[0])
    ring_mean = (ring[:fill].sum(axis=0, dtype=F32) / F32(fill)).astype(F32)
    return ring_mean, pos, fill, pos == 0


def ema_field(field: np.ndarray, x: np.ndarray, gamma: float) -> np.ndarray:
    """Stage 2. field <- gamma * field + (1 - gamma) * x, in place (float32); returns field."""
    g = F32(gamma)
    field *= g
    field += (F32(1) - g) * x
    return field


def pool_write(pool: np.ndarray, pos: int, fill: int, ring_mean: np.ndarray, wrapped: bool):
    """Stage 3a (write rule). When ``wrapped``, store ring_mean in slot ``pos`` (round-robin).
    Returns (pos, fill)."""
    if not wrapped:
        return pos, fill
    pool[pos] = ring_mean
    return (pos + 1) % pool.shape[0], min(fill + 1, pool.shape[0])


def semantic_read(pool: np.ndarray, fill: int, query: np.ndarray, temperature: float) -> np.ndarray:
    """Stage 3b. softmax(pool[:fill] . query / temperature) @ pool[:fill] (float32); zeros when fill = 0."""
    if fill == 0:
        return np.zeros(pool.shape[1], F32)
    slots = pool[:fill]
    logits = (slots @ query) / F32(temperature)
    w = np.exp(logits - logits.max())
    return ((w / w.sum()) @ slots).astype(F32)


def fusion(ring_mean, field, semantic, field_weight: float = 0.5, semantic_weight: float = 0.5):
    """Stage 4. ring_mean + field_weight * field + semantic_weight * semantic (float32)."""
    return (ring_mean + F32(field_weight) * field + F32(semantic_weight) * semantic).astype(F32)


def alpha_decay(layer: int, n_layers: int, alpha_base: float, cross_decay: float) -> float:
    """Stage 5. alpha_l = alpha_base * (0.3 + 0.7 * l / (L - 1)) * cross_decay ** l (ratio 0 when L = 1)."""
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer: expected 0 <= layer < n_layers={n_layers}, got {layer}")
    ratio = layer / (n_layers - 1) if n_layers > 1 else 0.0
    return alpha_base * (0.3 + 0.7 * ratio) * cross_decay ** layer


def clip(x: np.ndarray, limit: float) -> np.ndarray:
    """Stage 6. Clip to [-limit, limit] (float32)."""
    return np.clip(x, F32(-limit), F32(limit)).astype(F32)


def scale_and_clip(cfg: SfaConfig, fused: np.ndarray, alpha: float) -> np.ndarray:
    """Stages 5-6 in ``cfg.clip_order``."""
    a = F32(alpha)
    if cfg.clip_order == "alpha_then_clip":
        return clip(a * fused, cfg.clip)
    return (a * clip(fused, cfg.clip)).astype(F32)


def check_x(state: SfaState, x, name: str = "x") -> np.ndarray:
    """``x`` as an array of shape (hidden,) or (T, hidden) for this SFA state, or ValueError naming it."""
    x = np.asarray(x)
    if x.ndim not in (1, 2) or x.shape[-1] != state.hidden:
        raise ValueError(f"SFA input {name!r}: expected shape (hidden,) or (T, hidden) with hidden="
                         f"{state.hidden}, got {x.shape}")
    if not np.issubdtype(x.dtype, np.floating) or not np.all(np.isfinite(x)):
        raise ValueError(f"SFA input {name!r}: expected finite floats, got dtype {x.dtype}")
    return x.astype(F32, copy=False)


def sfa_step(cfg: SfaConfig, state: SfaState, layer: int, x) -> tuple[np.ndarray, SfaState]:
    """Enhancement (hidden,) float32 for one token's attention output x (hidden,); state in place."""
    x = check_x(state, x)
    if x.ndim != 1:
        raise ValueError(f"SFA input 'x': sfa_step takes one token (hidden,), got {x.shape}; use sfa_apply")
    alpha = alpha_decay(layer, cfg.n_layers, cfg.alpha_base, cfg.cross_decay)
    return _step(cfg, state, alpha, x), state


def _step(cfg: SfaConfig, st: SfaState, alpha: float, x: np.ndarray) -> np.ndarray:
    ring_mean, st.ring_pos, st.ring_fill, wrapped = ring_update(st.ring, st.ring_pos, st.ring_fill, x)
    ema_field(st.field, x, cfg.gamma)
    st.pool_pos, st.pool_fill = pool_write(st.pool, st.pool_pos, st.pool_fill, ring_mean, wrapped)
    temperature = cfg.temperature or math.sqrt(st.hidden)
    semantic = semantic_read(st.pool, st.pool_fill, ring_mean, temperature)
    fused = fusion(ring_mean, st.field, semantic, cfg.field_weight, cfg.semantic_weight)
    return scale_and_clip(cfg, fused, alpha)


def sfa_apply(cfg: SfaConfig, state: SfaState, layer: int, x) -> tuple[np.ndarray, SfaState]:
    """x + enhancement for one token (hidden,) or a sequence (T, hidden) of layer ``layer``'s attention
    outputs, in order; returns (float32 array of x's shape, state). The state is updated in place."""
    x = check_x(state, x)
    alpha = alpha_decay(layer, cfg.n_layers, cfg.alpha_base, cfg.cross_decay)
    if x.ndim == 1:
        return x + _step(cfg, state, alpha, x), state
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        out[t] = x[t] + _step(cfg, state, alpha, x[t])
    return out, state
