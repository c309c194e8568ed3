"""Soma streaming attention: a ring of recent keys/values (plus optional sink tokens) and an EMA "field".

One decode step costs O((sinks + ring) * head_dim) per head whatever the sequence position, and the state
has a fixed size. Every choice on which the public variants of seed 000 disagree is an explicit field of
:class:`SomaConfig`; ``SomaConfig.preset("seed")`` reproduces the seed's literal definition.

Per query head h (KV head ``h // (n_heads // n_kv_heads)``) at token t:

- visible set: the filled sink slots and ring slots; with ``include_self`` the current token is written
  first (so it attends to itself), otherwise the ring is read before the write (the seed: t = 0 sees
  nothing and outputs zeros);
- near field: ``normalise(q.k / sqrt(head_dim) - recency * distance) @ V`` over the visible set (the
  recency bias applies to ring entries only; sinks keep bias 0 because they are kept as attention sinks);
- far field: ``alpha * F`` with F the EMA ``F <- gamma F + (1 - gamma) x`` of the keys or values of tokens
  before t (``field_source``), or with ``gating="query"`` ``alpha * g(q . F_k / sqrt(head_dim)) * F_v``,
  ``g(z) = clip(0.5 + z / 4, 0, 1)`` (hard sigmoid: one shift and a clamp in hardware);
- output = near + far; then the field is updated with token t.

Float arrays (T, H, D) / (H, D) for q and (T, Hkv, D) / (Hkv, D) for k, v go through the float reference
here; with ``cfg.integer=True`` int8 arrays go through the bit-exact integer path (``soma_int`` numpy
spec, ``soma_nb`` numba fast path; docs/numerics.md, Soma section). The state object is updated in place
and returned.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from somatile.model.soma_fixed import COUNTER_MAX, GAMMA_Q15_ONE, INT_MULT_MAX, INT_SHIFT_MAX, MAX_INT_HEAD_DIM

NORMALISERS = ("softmax", "hccs", "hccs_int", "exp_int", "pwl2_int")
INT_NORMALISERS = ("hccs_int", "exp_int", "pwl2_int")
PROFILES = ("paper", "wide")
"""Integer profiles of the contract (docs/numerics.md): "paper" is the HCCS paper's AI Engine kernel ABI
(int8 logits, uint8 probabilities, int8 output), "wide" keeps int16 base-2 logits, Q15 probabilities and an
int16 output (model/wide.py)."""
PROFILE_NORMALISERS = {"paper": ("hccs_int", "exp_int"), "wide": INT_NORMALISERS}
FIELD_SOURCES = ("keys", "values")
GATINGS = ("none", "query")
HCCS_MODES = ("div", "clb")

_PER_HEAD_INT_FIELDS = ("score_mult", "score_shift", "out_mult", "out_shift", "alpha_mult", "alpha_shift",
                        "gate_mult", "gate_shift", "recency_int", "hccs_B", "hccs_S", "hccs_dmax", "exp_mult")
_PER_HEAD_FLOAT_FIELDS = ("hccs_c", "logit_scale")
_DERIVED_FIELDS = ("hccs_B", "hccs_S", "hccs_dmax", "exp_mult", "gamma_q15")


@dataclass(frozen=True)
class SomaConfig:
    """Configuration of one Soma attention layer (frozen, validated).

    Geometry: ``n_heads`` query heads, ``n_kv_heads`` KV heads (grouped-query attention: n_heads must be a
    multiple), ``head_dim``; ``ring`` recent tokens and ``sinks`` first tokens kept per KV head
    (``0 <= sinks <= ring``; the first ``sinks`` tokens of the sequence go only to the sink slots).

    Far field: ``gamma`` in [0, 1), ``alpha`` its weight, ``field_source`` "keys" (the seed) or "values",
    ``gating`` "none" (far = alpha * F) or "query" (far = alpha * g(q . F_k / sqrt(D)) * F_v with the hard
    sigmoid g(z) = clip(0.5 + z/4, 0, 1); needs ``field_source="values"``; the state then keeps a second
    field of keys). ``include_self``: whether token t attends to itself. ``recency``: lambda >= 0 of the
    seed's temporal decay exp(-lambda * dt), applied as the additive logit bias -lambda * distance to ring
    entries.

    Near-field ``normaliser``: "softmax"; "hccs" (float HCCS of seed 003 with per-head clip ``hccs_c`` in
    logit units); "hccs_int" / "exp_int" / "pwl2_int" (the integer kernels of ``profile``; in the float
    path the logits are quantised to the profile's normaliser input and the probabilities read back as
    floats). ``profile``: "paper" (the HCCS paper's kernel ABI: int8 logits with per-head ``logit_scale``,
    uint8 probabilities, int8 output; normalisers hccs_int, exp_int) or "wide" (int16 logits in 2^-8 bit
    units, Q15 probabilities, int16 output; normalisers hccs_int, exp_int and the exp-free pwl2_int of
    somatile.model.wide). In the wide profile hccs_B/hccs_S/hccs_dmax are the wide normaliser's B, S (Q8),
    dmax (2^-8 bit units); pwl2_int uses S and dmax and ignores B; exp_mult is unused. ``fallback`` (wide
    profile): per head True = this head runs the integer exp instead of ``normaliser`` (a hybrid; None or
    all False = none).

    Integer path (``integer=True``, int8 q/k/v): per-query-head ``score_mult``/``score_shift`` (int32 score
    -> normaliser int8 input), ``recency_int`` (int8 logit units per token of distance), ``hccs_B``,
    ``hccs_S``, ``hccs_dmax``, ``hccs_mode`` (normaliser "hccs_int"; left at None they are derived from
    ``hccs_c`` and ``logit_scale`` for rows of ``sinks + ring`` slots), ``exp_mult`` (integer input scale M
    of somatile.model.intexp, normaliser "exp_int"; None derives it from ``logit_scale``), ``out_mult``/
    ``out_shift`` (int32 P.V -> int8 output), ``alpha_mult``/``alpha_shift`` (field, 7 fraction bits ->
    int8 output units), ``gate_mult``/``gate_shift`` (gate logit -> Q7 gate); ``gamma_q15`` (defaults to
    round(gamma * 2^15)). Multipliers are in [0, 2^15 - 1], shifts in [0, 47]. Per-head fields accept a
    scalar (broadcast) or one value per query head and are stored as tuples. :func:`integer_config`
    (somatile.model.soma_int) derives them from float scales; the Soma section of docs/numerics.md is the
    bit-exact contract.
    """

    n_heads: int = 1
    n_kv_heads: int | None = None
    head_dim: int = 64
    ring: int = 256
    sinks: int = 0
    gamma: float = 0.98
    alpha: float = 0.0
    field_source: str = "values"
    gating: str = "none"
    include_self: bool = True
    recency: float = 0.0
    normaliser: str = "softmax"
    profile: str = "paper"
    fallback: bool | Sequence[bool] | None = None
    hccs_c: float | Sequence[float] = 4.0
    hccs_mode: str = "div"
    logit_scale: float | Sequence[float] = 0.125
    integer: bool = False
    score_mult: int | Sequence[int] = 1
    score_shift: int | Sequence[int] = 0
    recency_int: int | Sequence[int] = 0
    hccs_B: int | Sequence[int] | None = None
    hccs_S: int | Sequence[int] | None = None
    hccs_dmax: int | Sequence[int] | None = None
    exp_mult: int | Sequence[int] | None = None
    out_mult: int | Sequence[int] = 1
    out_shift: int | Sequence[int] = 8
    alpha_mult: int | Sequence[int] = 0
    alpha_shift: int | Sequence[int] = 0
    gate_mult: int | Sequence[int] = 0
    gate_shift: int | Sequence[int] = 0
    gamma_q15: int | None = None

    def __post_init__(self):
        def bad(name, expected, value):
            raise ValueError(f"SomaConfig.{name}: expected {expected}, got {value!r}")

        # Fields left at None and derived below; replace() derives them again from the changed config.
        object.__setattr__(self, "_derived", frozenset(n for n in _DERIVED_FIELDS if getattr(self, n) is None))

        for name in ("n_heads", "head_dim", "ring"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                bad(name, "an integer >= 1", value)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if not isinstance(self.n_kv_heads, (int, np.integer)) or self.n_kv_heads < 1:
            bad("n_kv_heads", "an integer >= 1", self.n_kv_heads)
        if self.n_heads % self.n_kv_heads:
            bad("n_kv_heads", f"a divisor of n_heads={self.n_heads} (grouped-query attention)", self.n_kv_heads)
        if not isinstance(self.sinks, (int, np.integer)) or not 0 <= self.sinks <= self.ring:
            bad("sinks", f"an integer in [0, ring={self.ring}]", self.sinks)
        for name in ("include_self", "integer"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                bad(name, "True or False", getattr(self, name))
        if not (isinstance(self.gamma, (int, float)) and 0.0 <= self.gamma < 1.0):
            bad("gamma", "a number in [0, 1)", self.gamma)
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha)):
            bad("alpha", "a finite number", self.alpha)
        if not (isinstance(self.recency, (int, float)) and math.isfinite(self.recency) and self.recency >= 0):
            bad("recency", "a finite number >= 0", self.recency)
        for name, allowed in (("field_source", FIELD_SOURCES), ("gating", GATINGS),
                              ("normaliser", NORMALISERS), ("hccs_mode", HCCS_MODES), ("profile", PROFILES)):
            if getattr(self, name) not in allowed:
                bad(name, f"one of {allowed}", getattr(self, name))
        if self.gating == "query" and self.field_source != "values":
            bad("field_source", "'values' when gating='query' (the gate reads a separate key field)",
                self.field_source)
        if self.integer and self.normaliser not in INT_NORMALISERS:
            bad("normaliser", f"one of {INT_NORMALISERS} when integer=True", self.normaliser)
        if self.normaliser in INT_NORMALISERS and self.normaliser not in PROFILE_NORMALISERS[self.profile]:
            bad("normaliser", f"one of {PROFILE_NORMALISERS[self.profile]} in profile {self.profile!r}",
                self.normaliser)

        if self.fallback is not None:
            values = (self.fallback,) * self.n_heads if isinstance(self.fallback, (bool, np.bool_)) \
                else tuple(self.fallback)
            if len(values) != self.n_heads or not all(isinstance(x, (bool, np.bool_)) for x in values):
                bad("fallback", f"True/False or {self.n_heads} of them (one per query head)", self.fallback)
            values = tuple(bool(x) for x in values)
            if any(values) and (self.profile != "wide" or self.normaliser not in INT_NORMALISERS):
                bad("fallback", "no fallback heads unless profile='wide' with an integer normaliser (the paper "
                    "profile runs one normaliser per layer)", self.fallback)
            object.__setattr__(self, "fallback", values if any(values) else None)
        for name in _PER_HEAD_FLOAT_FIELDS:
            values = self._per_head(name, float)
            if not all(math.isfinite(x) and x > 0 for x in values):
                bad(name, "positive finite numbers", getattr(self, name))
            object.__setattr__(self, name, values)
        self._derive_normaliser_params(bad)
        for name in _PER_HEAD_INT_FIELDS:
            if getattr(self, name) is not None:
                object.__setattr__(self, name, self._per_head(name, int))
        if self.gamma_q15 is None:
            object.__setattr__(self, "gamma_q15", int(round(self.gamma * GAMMA_Q15_ONE)))
        if not isinstance(self.gamma_q15, (int, np.integer)) or not 0 <= self.gamma_q15 < GAMMA_Q15_ONE:
            bad("gamma_q15", f"an integer in [0, {GAMMA_Q15_ONE})", self.gamma_q15)
        if self.integer:
            self._check_integer_ranges(bad)

    def _per_head(self, name, kind):
        value = getattr(self, name)
        if isinstance(value, (int, float, np.integer, np.floating)):
            return (kind(value),) * self.n_heads
        values = tuple(value)
        if len(values) != self.n_heads:
            raise ValueError(f"SomaConfig.{name}: expected a scalar or {self.n_heads} values (one per query "
                             f"head), got {len(values)}")
        if kind is int and not all(float(x).is_integer() for x in values):
            raise ValueError(f"SomaConfig.{name}: expected integers, got {values!r}")
        return tuple(kind(x) for x in values)

    def _derive_normaliser_params(self, bad):
        """Fill the integer normaliser's parameters left at None from hccs_c and logit_scale."""
        given = [getattr(self, n) is not None for n in ("hccs_B", "hccs_S", "hccs_dmax")]
        if any(given) and not all(given):
            bad("hccs_B/hccs_S/hccs_dmax", "all three or none (derived from hccs_c and logit_scale)",
                (self.hccs_B, self.hccs_S, self.hccs_dmax))
        if self.normaliser not in INT_NORMALISERS:
            return
        from somatile.model import soma_int  # loads numba: only configs with an integer normaliser need it
        if self.profile == "wide":
            if not any(given):
                for name, values in zip(("hccs_B", "hccs_S", "hccs_dmax"), soma_int.default_wide_params(self)):
                    object.__setattr__(self, name, values)
            soma_int.check_wide_params(self)
            return
        if self.normaliser == "hccs_int":
            if not any(given):
                for name, values in zip(("hccs_B", "hccs_S", "hccs_dmax"), soma_int.default_hccs_params(self)):
                    object.__setattr__(self, name, values)
            soma_int.check_hccs_params(self)
        if self.normaliser == "exp_int" and self.exp_mult is None:
            object.__setattr__(self, "exp_mult", soma_int.default_exp_mult(self))

    def _check_integer_ranges(self, bad):
        if self.head_dim > MAX_INT_HEAD_DIM:
            bad("head_dim", f"at most {MAX_INT_HEAD_DIM} when integer=True (keeps q.k and q.F in int32)",
                self.head_dim)
        for name in ("score_mult", "out_mult", "alpha_mult", "gate_mult"):
            if not all(0 <= x <= INT_MULT_MAX for x in getattr(self, name)):
                bad(name, f"integers in [0, {INT_MULT_MAX}]", getattr(self, name))
        for name in ("score_shift", "out_shift", "alpha_shift", "gate_shift"):
            if not all(0 <= x <= INT_SHIFT_MAX for x in getattr(self, name)):
                bad(name, f"integers in [0, {INT_SHIFT_MAX}]", getattr(self, name))
        recency_max = 127 if self.profile == "paper" else (1 << 15) - 1
        if not all(0 <= x <= recency_max for x in self.recency_int):
            bad("recency_int", f"integers in [0, {recency_max}] (profile {self.profile!r})", self.recency_int)
        if self.profile == "paper" and self.exp_mult is not None:
            from somatile.model import intexp
            if not all(intexp.EXP_MULT_MIN <= x <= intexp.EXP_MULT_MAX for x in self.exp_mult):
                bad("exp_mult", f"integers in [{intexp.EXP_MULT_MIN}, {intexp.EXP_MULT_MAX}]", self.exp_mult)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def slots(self) -> int:
        """Key/value slots per KV head: sinks first, then the ring (the order of a normaliser row)."""
        return self.sinks + self.ring

    @property
    def gated(self) -> bool:
        return self.gating == "query"

    def replace(self, **changes) -> "SomaConfig":
        """A copy with some fields changed (validated again). Fields that were derived (gamma_q15 from gamma,
        the integer normaliser's parameters from hccs_c / logit_scale / slots) are derived again unless given."""
        rederive = {name: None for name in self._derived if name not in changes}
        return dataclasses.replace(self, **rederive, **changes)

    @classmethod
    def preset(cls, name: str, **overrides) -> "SomaConfig":
        """A named configuration; keyword overrides (e.g. n_heads, head_dim, integer) are applied on top.

        - ``seed``: seed 000 literally: ring 16 (its "248x" is 2n/(2k+1) at n=4096, so k=16), no sinks,
          ring read before write (t=0 outputs zeros), field of keys, ungated, alpha 0.1, gamma 0.98, softmax.
        - ``default``: what StreamingLLM shows works on real models: 4 sinks + 252 recent tokens (a 256-entry
          normaliser row), the token attends to itself, softmax, far field off (alpha 0) until the
          real-model evaluation shows that a field helps; the field is then a one-field change.
        - ``gated_field``: ``default`` plus a query-gated value field, alpha 0.1.

        With ``integer=True`` the integer parameters come from :func:`integer_config` at unit-free default
        scales unless given explicitly. The presets use ``profile="wide"`` (the integer contract that keeps a
        language model's accuracy, docs/results.md) unless ``profile`` is given; the hardware backends
        implement ``profile="paper"``.
        """
        presets = {
            "seed": dict(ring=16, sinks=0, include_self=False, field_source="keys", gating="none",
                         alpha=0.1, gamma=0.98, normaliser="softmax"),
            "default": dict(ring=252, sinks=4, include_self=True, field_source="values", gating="none",
                            alpha=0.0, gamma=0.98, normaliser="softmax"),
            "gated_field": dict(ring=252, sinks=4, include_self=True, field_source="values", gating="query",
                                alpha=0.1, gamma=0.98, normaliser="softmax"),
        }
        if name not in presets:
            raise ValueError(f"SomaConfig.preset: unknown preset {name!r}; expected one of {sorted(presets)}")
        params = {"profile": "wide", **presets[name], **overrides}
        integer = params.pop("integer", False)
        if integer:
            if params.get("normaliser", "softmax") not in INT_NORMALISERS:
                params["normaliser"] = "hccs_int"
            base = cls(**params)
            explicit = {k: v for k, v in overrides.items() if k in _PER_HEAD_INT_FIELDS or k == "gamma_q15"}
            from somatile.model.soma_int import integer_config
            scales = dict(DEFAULT_INT_SCALES)
            if base.profile == "wide":  # the int16 output keeps 8 bits below the int8 step of v
                scales["out_scale"] = scales["v_scale"] / 256
            return integer_config(base, **scales).replace(**explicit)
        return cls(**params)


def __getattr__(name):
    """Integer helpers live in soma_int (loaded on first use): integer_config, quantize, scales_for."""
    if name in ("integer_config", "quantize", "scales_for"):
        from somatile.model import soma_int
        return getattr(soma_int, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_INT_SCALES = dict(q_scale=1 / 32, k_scale=1 / 32, v_scale=1 / 32, out_scale=1 / 32)


@dataclass
class SomaState:
    """Fixed-size state of one Soma layer; the same class holds the float and the integer state.

    Arrays (Hkv = n_kv_heads, D = head_dim):

    - ``ring_k``, ``ring_v``: (Hkv, ring, D), int8 (integer) or the float dtype;
    - ``sink_k``, ``sink_v``: (Hkv, sinks, D), same dtype;
    - ``field``: (Hkv, D), EMA of ``field_source`` (integer: int16 with 7 fraction bits);
    - ``gate_field``: (Hkv, D) EMA of keys when ``gating="query"``, else (Hkv, 0);
    - counters ``write_pos`` (next ring slot), ``fill`` (valid ring slots), ``step`` (tokens seen,
      saturating at 2^31 - 1; the sink slots filled are min(step, sinks)), int32 in ``to_arrays``.
    """

    ring_k: np.ndarray
    ring_v: np.ndarray
    sink_k: np.ndarray
    sink_v: np.ndarray
    field: np.ndarray
    gate_field: np.ndarray
    write_pos: int = 0
    fill: int = 0
    step: int = 0

    ARRAYS = ("ring_k", "ring_v", "sink_k", "sink_v", "field", "gate_field")
    COUNTERS = ("write_pos", "fill", "step")

    @classmethod
    def empty(cls, cfg: SomaConfig, dtype=np.float32) -> "SomaState":
        """A fresh state (everything zero) for ``cfg``; ``dtype`` is ignored for integer configs."""
        kv_dtype, field_dtype = state_dtypes(cfg, dtype)
        hk, d = cfg.n_kv_heads, cfg.head_dim
        return cls(ring_k=np.zeros((hk, cfg.ring, d), kv_dtype), ring_v=np.zeros((hk, cfg.ring, d), kv_dtype),
                   sink_k=np.zeros((hk, cfg.sinks, d), kv_dtype), sink_v=np.zeros((hk, cfg.sinks, d), kv_dtype),
                   field=np.zeros((hk, d), field_dtype),
                   gate_field=np.zeros((hk, d if cfg.gated else 0), field_dtype))

    @property
    def sink_fill(self) -> int:
        return min(self.step, self.sink_k.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the state as stored: the arrays plus three int32 counters."""
        return sum(getattr(self, a).nbytes for a in self.ARRAYS) + 4 * len(self.COUNTERS)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The state as named arrays (copies), in the layout order of docs/numerics.md."""
        out = {a: getattr(self, a).copy() for a in self.ARRAYS}
        out.update({c: np.array(getattr(self, c), np.int32) for c in self.COUNTERS})
        return out

    @classmethod
    def from_arrays(cls, cfg: SomaConfig, arrays: dict, dtype=np.float32) -> "SomaState":
        """Rebuild a state from ``to_arrays()`` output, checking every name, shape, dtype and counter range."""
        template = cls.empty(cfg, dtype)
        missing = [n for n in cls.ARRAYS + cls.COUNTERS if n not in arrays]
        if missing:
            raise ValueError(f"SomaState.from_arrays: missing arrays {missing}")
        kwargs = {}
        for name in cls.ARRAYS:
            want, got = getattr(template, name), np.asarray(arrays[name])
            if got.shape != want.shape or got.dtype != want.dtype:
                raise ValueError(f"SomaState.from_arrays: {name!r} expected {want.dtype} {want.shape}, "
                                 f"got {got.dtype} {got.shape}")
            kwargs[name] = got.copy()
        limits = {"write_pos": cfg.ring - 1, "fill": cfg.ring, "step": COUNTER_MAX}
        for name in cls.COUNTERS:
            value = np.asarray(arrays[name])
            if value.shape != () or not np.issubdtype(value.dtype, np.integer) or not 0 <= value <= limits[name]:
                raise ValueError(f"SomaState.from_arrays: {name!r} expected an integer scalar in "
                                 f"[0, {limits[name]}], got {value!r}")
            kwargs[name] = int(value)
        return cls(**kwargs)

    def copy(self) -> "SomaState":
        return dataclasses.replace(self, **{a: getattr(self, a).copy() for a in self.ARRAYS})

    def write(self, k, v) -> None:
        """Store one token's k, v (Hkv, D): in the next sink slot while sinks are filling, else in the ring
        slot ``write_pos`` (which then advances); the float path and the integer spec share this."""
        sinks, ring = self.sink_k.shape[1], self.ring_k.shape[1]
        if self.step < sinks:
            self.sink_k[:, self.step], self.sink_v[:, self.step] = k, v
        else:
            self.ring_k[:, self.write_pos], self.ring_v[:, self.write_pos] = k, v
            self.write_pos = (self.write_pos + 1) % ring
            self.fill = min(self.fill + 1, ring)
        self.step = min(self.step + 1, COUNTER_MAX)

    def ring_distances(self, after_write: bool) -> np.ndarray:
        """Token distance of each ring slot from the current token: the slot written last is 0 when the
        current token has just been written (include_self) and 1 otherwise."""
        ring = self.ring_k.shape[1]
        age = (self.write_pos - 1 - np.arange(ring)) % ring
        return age + (0 if after_write else 1)


def state_dtypes(cfg: SomaConfig, float_dtype=np.float32) -> tuple[np.dtype, np.dtype]:
    """(key/value dtype, field dtype) of the state as stored."""
    if cfg.integer:
        return np.dtype(np.int8), np.dtype(np.int16)
    return np.dtype(float_dtype), np.dtype(float_dtype)


def check_inputs(cfg: SomaConfig, q, k, v, seq: bool):
    """q, k, v as arrays of the shapes ``cfg`` asks for (with a leading T axis when ``seq``), or ValueError
    naming the tensor and the expected shape. Every backend of prefill/decode_step calls this first."""
    lead = "(T, " if seq else "("
    shapes = {"q": (cfg.n_heads, cfg.head_dim), "k": (cfg.n_kv_heads, cfg.head_dim),
              "v": (cfg.n_kv_heads, cfg.head_dim)}
    arrays = {"q": np.asarray(q), "k": np.asarray(k), "v": np.asarray(v)}
    length = None
    for name, a in arrays.items():
        want = shapes[name]
        if a.ndim != len(want) + seq or a.shape[seq:] != want:
            raise ValueError(f"Soma input {name!r}: expected shape {lead}{want[0]}, {want[1]}), got {a.shape}")
        if seq:
            if length is not None and a.shape[0] != length:
                raise ValueError(f"Soma input {name!r}: expected T={length} tokens like q, got {a.shape[0]}")
            length = a.shape[0]
        if cfg.integer:
            if a.dtype != np.int8:
                raise ValueError(f"Soma input {name!r}: expected int8 (cfg.integer=True), got {a.dtype}")
        else:
            if not np.issubdtype(a.dtype, np.floating):
                raise ValueError(f"Soma input {name!r}: expected a float array (cfg.integer=False), got {a.dtype}"
                                 " (set integer=True for int8 inputs)")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"Soma input {name!r}: contains NaN or infinity")
    if seq and length == 0:
        raise ValueError("Soma input 'q': expected at least one token, got T=0")
    return arrays["q"], arrays["k"], arrays["v"]


_INT8 = np.dtype(np.int8)


def _int8_step_fits(cfg: SomaConfig, state: SomaState, q, k, v) -> bool:
    """True when an integer decode step's token and state pass what check_inputs and check_state test, tested
    by type, dtype identity and shape alone: the per-token path, where those two checks cost 5-9 us of a
    30-48 us step whose caches another job has evicted, and this test 2-4 us. Anything else takes the
    checks, which name what is wrong."""
    kv_shape = (cfg.n_kv_heads, cfg.head_dim)
    ring_k = state.ring_k if type(state) is SomaState else None
    return (type(q) is np.ndarray and type(k) is np.ndarray and type(v) is np.ndarray and ring_k is not None
            and q.dtype is _INT8 and k.dtype is _INT8 and v.dtype is _INT8 and ring_k.dtype is _INT8
            and q.shape == (cfg.n_heads, cfg.head_dim) and k.shape == kv_shape and v.shape == kv_shape
            and ring_k.shape == (cfg.n_kv_heads, cfg.ring, cfg.head_dim) and state.sink_k.shape[1] == cfg.sinks
            and (not cfg.gated or state.gate_field.shape[1] == cfg.head_dim))


def _float_dtype(*arrays) -> np.dtype:
    return np.result_type(np.float32, *[a.dtype for a in arrays])


def check_state(cfg: SomaConfig, state: SomaState, dtype):
    """ValueError naming the state array whose shape or dtype does not match ``cfg`` (``dtype`` None: the
    configuration's own); shared by every backend that takes a SomaState."""
    kv_dtype, _ = state_dtypes(cfg, dtype)
    want = (cfg.n_kv_heads, cfg.ring, cfg.head_dim)
    if not isinstance(state, SomaState):
        raise TypeError(f"Soma state: expected a SomaState, got {type(state).__name__}")
    if state.ring_k.shape != want or state.ring_k.dtype != kv_dtype or state.sink_k.shape[1] != cfg.sinks:
        raise ValueError(f"Soma state: ring_k {state.ring_k.dtype} {state.ring_k.shape} / {state.sink_k.shape[1]} "
                         f"sinks does not match the config ({kv_dtype} {want}, sinks={cfg.sinks})")
    if cfg.gated and state.gate_field.shape[1] != cfg.head_dim:
        raise ValueError("Soma state: gate_field is empty but cfg.gating='query'")


def prefill(cfg: SomaConfig, q, k, v, *, state: SomaState | None = None, impl: str = "numba"):
    """Run a sequence through Soma attention from a fresh state (or continue ``state``).

    q: (T, n_heads, head_dim), k and v: (T, n_kv_heads, head_dim); float, or int8 when ``cfg.integer``.
    Returns (out (T, n_heads, head_dim) in q's float dtype, or :func:`~somatile.model.soma_fixed.out_dtype`
    (int8 / int16), state). The result equals T calls of :func:`decode_step`. The float path from a fresh state is evaluated in blocks of queries (vectorised);
    ``impl`` ("numba" default or "numpy") selects the integer implementation; both are bit-identical.
    """
    q, k, v = check_inputs(cfg, q, k, v, seq=True)
    if cfg.integer:
        state = SomaState.empty(cfg) if state is None else state
        check_state(cfg, state, None)
        return _run_integer(cfg, state, q, k, v, impl), state
    dtype = _float_dtype(q, k, v)
    q, k, v = q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)
    if state is not None:
        check_state(cfg, state, dtype)
        out = np.empty(q.shape, dtype)
        for t in range(q.shape[0]):
            out[t] = _float_step(cfg, state, q[t], k[t], v[t])
        return out, state
    return _float_prefill(cfg, q, k, v)


def decode_step(cfg: SomaConfig, state: SomaState, q, k, v, *, impl: str = "numba"):
    """One token: q (n_heads, head_dim), k, v (n_kv_heads, head_dim). Returns (out (n_heads, head_dim), state).

    Cost and memory do not depend on the sequence position. ``state`` (from :func:`prefill`,
    :meth:`SomaState.empty` or :meth:`SomaState.from_arrays`) is updated in place and returned.
    """
    if cfg.integer and _int8_step_fits(cfg, state, q, k, v):
        return _run_integer(cfg, state, q[None], k[None], v[None], impl)[0], state
    q, k, v = check_inputs(cfg, q, k, v, seq=False)
    if cfg.integer:
        check_state(cfg, state, None)
        return _run_integer(cfg, state, q[None], k[None], v[None], impl)[0], state
    dtype = _float_dtype(q, k, v)
    check_state(cfg, state, dtype)
    return _float_step(cfg, state, q.astype(dtype), k.astype(dtype), v.astype(dtype)), state


def _run_integer(cfg: SomaConfig, state: SomaState, q, k, v, impl: str) -> np.ndarray:
    """T integer decode steps through the numpy spec (``impl="numpy"``) or the numba fast path ("numba");
    both are bit-identical. ``state`` is updated in place."""
    if impl == "numpy":
        from somatile.model import soma_int
        return soma_int.run_spec(cfg, state, q, k, v)
    if impl == "numba":
        from somatile.model import soma_nb
        return soma_nb.run(cfg, state, q, k, v)
    raise ValueError(f"impl: expected 'numba' or 'numpy', got {impl!r}")


def integer_attention(cfg: SomaConfig, q, k, v, *, impl: str = "numba"):
    """Float q (T, H, D), k, v (T, Hkv, D) through the integer path with scales taken from these tensors.

    Dynamic symmetric quantisation: per-head ``scales_for`` of q, k and v; the output scale of query head h
    covers what its output can reach, ``v_scale + |alpha| * field_scale`` of its KV head (attention output
    is a convex combination of values, the far field adds at most alpha times the field's source). ``cfg``
    is a float config; its normaliser becomes "hccs_int" unless it is already an integer one. Returns
    (float output (T, H, D) = int8 output * out_scale, the integer config used, the integer state).
    """
    from somatile.model.soma_int import integer_config, quantize, scales_for
    qs, ks, vs = scales_for(q, "q"), scales_for(k, "k"), scales_for(v, "v")
    kv = np.arange(cfg.n_heads) // cfg.group
    out_scale = vs[kv] + abs(cfg.alpha) * (ks if cfg.field_source == "keys" else vs)[kv]
    icfg = integer_config(cfg, q_scale=qs, k_scale=ks, v_scale=vs, out_scale=out_scale)
    out, state = prefill(icfg, quantize(q, qs, "q"), quantize(k, ks, "k"), quantize(v, vs, "v"), impl=impl)
    return out * out_scale[:, None], icfg, state


def hard_sigmoid(z):
    """g(z) = clip(0.5 + z / 4, 0, 1): the field gate (the integer path computes the same in Q7)."""
    return np.clip(0.5 + 0.25 * z, 0.0, 1.0)


def normalise(cfg: SomaConfig, logits: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Near-field probabilities of float ``logits`` (..., H, N) over ``valid`` (broadcastable bool).

    Rows with no valid entry give all zeros. Masked entries get probability 0. The head axis is -2.
    """
    valid = np.broadcast_to(valid, logits.shape)
    if cfg.normaliser == "softmax":
        x = np.where(valid, logits, -np.inf)
        m = np.max(x, axis=-1, keepdims=True)
        e = np.where(valid, np.exp(x - np.where(np.isfinite(m), m, 0)), 0)
        s = e.sum(axis=-1, keepdims=True)
        return np.divide(e, s, out=np.zeros_like(e), where=s > 0)
    from somatile.model import hccs, quant, soma_nb
    heads, n = logits.shape[-2:]
    rows = np.moveaxis(logits, -2, 0).reshape(heads, -1, n)
    mask = np.ascontiguousarray(np.moveaxis(valid, -2, 0).reshape(rows.shape))
    if cfg.normaliser == "hccs":
        with np.errstate(invalid="ignore"):  # rows with no valid entry (t = 0 without self) come back as zeros
            p = hccs.hccs_float(rows, cfg.hccs_c, mask)
    elif cfg.profile == "wide":
        from somatile.model import wide
        p = soma_nb.normalise_int(cfg, wide.logits_from_float(rows, mask), mask) / float(wide.PROB_ONE)
    else:
        p = soma_nb.normalise_int(cfg, quant.quantize_logits(rows, cfg.logit_scale, mask), mask) / 255.0
    lead = logits.shape[:-2]
    return np.moveaxis(p.reshape((heads,) + lead + (n,)), 0, -2).astype(logits.dtype)


def _near(cfg: SomaConfig, q, keys, vals, valid, bias):
    """q (T, H, D) over keys/vals (Hkv, N, D) shared by the T queries; valid, bias (T, 1, N) -> (T, H, D).

    The query heads of a KV head are stacked into one matrix so that both products are one matrix
    multiplication per KV head."""
    T, hk, g, d = q.shape[0], cfg.n_kv_heads, cfg.group, cfg.head_dim
    stacked = np.ascontiguousarray(q.reshape(T, hk, g, d).transpose(1, 0, 2, 3)).reshape(hk, T * g, d)
    keys_t = np.ascontiguousarray(keys.transpose(0, 2, 1))
    logits = np.matmul(stacked, keys_t) / np.sqrt(d).astype(q.dtype)
    logits = logits.reshape(hk, T, g, -1).transpose(1, 0, 2, 3).reshape(T, cfg.n_heads, -1) - bias
    p = normalise(cfg, logits, valid)
    p = np.ascontiguousarray(p.reshape(T, hk, g, -1).transpose(1, 0, 2, 3)).reshape(hk, T * g, -1)
    out = np.matmul(p, np.ascontiguousarray(vals))
    return out.reshape(hk, T, g, d).transpose(1, 0, 2, 3).reshape(q.shape)


def _far(cfg: SomaConfig, q, field_, gate_field):
    """alpha * F (ungated) or alpha * g(q . F_k / sqrt(D)) * F_v; q (..., H, D), fields (..., Hkv, D)."""
    if cfg.alpha == 0:
        return np.zeros_like(q)
    f = np.repeat(field_, cfg.group, axis=-2)
    if not cfg.gated:
        return (cfg.alpha * f).astype(q.dtype)
    fk = np.repeat(gate_field, cfg.group, axis=-2)
    z = np.sum(q * fk, axis=-1, keepdims=True) / np.sqrt(cfg.head_dim)
    return (cfg.alpha * hard_sigmoid(z) * f).astype(q.dtype)


def _float_step(cfg: SomaConfig, st: SomaState, q, k, v):
    if cfg.include_self:
        st.write(k, v)
    keys = np.concatenate([st.sink_k, st.ring_k], axis=1)
    vals = np.concatenate([st.sink_v, st.ring_v], axis=1)
    valid = np.concatenate([np.arange(cfg.sinks) < st.sink_fill, np.arange(cfg.ring) < st.fill])
    bias = np.concatenate([np.zeros(cfg.sinks), cfg.recency * st.ring_distances(cfg.include_self)])
    near = _near(cfg, q[None], keys, vals, valid[None, None], bias[None, None].astype(q.dtype))[0]
    out = near + _far(cfg, q, st.field, st.gate_field)
    if not cfg.include_self:
        st.write(k, v)
    _update_fields(cfg, st, k, v)
    return out


def _update_fields(cfg: SomaConfig, st: SomaState, k, v):
    g = st.field.dtype.type(cfg.gamma)
    src = k if cfg.field_source == "keys" else v
    st.field[...] = g * st.field + (1 - g) * src
    if cfg.gated:
        st.gate_field[...] = g * st.gate_field + (1 - g) * k


def _float_prefill(cfg: SomaConfig, q, k, v, block: int = 256):
    """Vectorised prefill from a fresh state: queries in blocks, each over the keys it can see."""
    T = q.shape[0]
    dtype = q.dtype
    st = SomaState.empty(cfg, dtype)
    fields = np.zeros((T, cfg.n_kv_heads, cfg.head_dim), dtype)
    gate_fields = np.zeros((T, cfg.n_kv_heads, cfg.head_dim if cfg.gated else 0), dtype)
    src = k if cfg.field_source == "keys" else v
    g = dtype.type(cfg.gamma)
    for t in range(T):
        fields[t] = st.field
        st.field[...] = g * st.field + (1 - g) * src[t]
        if cfg.gated:
            gate_fields[t] = st.gate_field
            st.gate_field[...] = g * st.gate_field + (1 - g) * k[t]
    off = 0 if cfg.include_self else 1
    out = np.empty_like(q)
    kt, vt = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    for a in range(0, T, block):
        b = min(a + block, T)
        lo = max(cfg.sinks, a - cfg.ring - off)
        cols = np.concatenate([np.arange(min(cfg.sinks, b)), np.arange(lo, b)])
        t = np.arange(a, b)[:, None]
        u = cols[None, :]
        dist = t - u
        is_sink = u < cfg.sinks
        valid = (dist >= off) & (is_sink | (dist < cfg.ring + off))
        bias = np.where(is_sink, 0, cfg.recency * dist).astype(dtype)
        out[a:b] = _near(cfg, q[a:b], kt[:, cols], vt[:, cols], valid[:, None, :], bias[:, None, :])
        out[a:b] += _far(cfg, q[a:b], fields[a:b], gate_fields[a:b])
    for t in range(T):
        st.write(k[t], v[t])
    return out, st


@dataclass(frozen=True)
class StateBytes:
    """Memory of Soma against a full KV cache, in the dtypes actually stored (see :func:`state_bytes`)."""

    seq_len: int
    n_layers: int
    kv_dtype: str
    field_dtype: str
    soma_layer: int
    full_kv_layer: int
    seed_ratio: float
    formula: str

    @property
    def soma_model(self) -> int:
        return self.soma_layer * self.n_layers

    @property
    def full_kv_model(self) -> int:
        return self.full_kv_layer * self.n_layers

    @property
    def ratio(self) -> float:
        """Full KV cache bytes / Soma state bytes."""
        return self.full_kv_layer / self.soma_layer


def state_bytes(cfg: SomaConfig, seq_len: int, *, n_layers: int = 1, float_dtype=np.float32) -> StateBytes:
    """Bytes of one layer's Soma state (and of ``n_layers`` layers) against a full KV cache of ``seq_len``
    tokens holding keys and values in the same dtype (int8 for the integer path, ``float_dtype`` otherwise):

        soma   = 2 * Hkv * (sinks + ring) * D * b_kv + (1 + gated) * Hkv * D * b_field + 3 * 4
        full   = 2 * seq_len * Hkv * D * b_kv

    The seeds' "248x" is 2n / (2k + 1) at n = 4096, k = 16 (``seed_ratio``: keys + values per token against
    a ring of k pairs plus one field vector, all in one dtype, counters ignored).
    """
    if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ValueError(f"state_bytes: seq_len expected an integer >= 1, got {seq_len!r}")
    if not isinstance(n_layers, (int, np.integer)) or n_layers < 1:
        raise ValueError(f"state_bytes: n_layers expected an integer >= 1, got {n_layers!r}")
    kv_dtype, field_dtype = state_dtypes(cfg, float_dtype)
    hk, d = cfg.n_kv_heads, cfg.head_dim
    soma = (2 * hk * cfg.slots * d * kv_dtype.itemsize + (1 + cfg.gated) * hk * d * field_dtype.itemsize
            + 4 * len(SomaState.COUNTERS))
    full = 2 * seq_len * hk * d * kv_dtype.itemsize
    formula = (f"soma = 2*{hk}*({cfg.sinks}+{cfg.ring})*{d}*{kv_dtype.itemsize} + {1 + cfg.gated}*{hk}*{d}*"
               f"{field_dtype.itemsize} + 12 = {soma} B; full = 2*{seq_len}*{hk}*{d}*{kv_dtype.itemsize} = {full} B")
    return StateBytes(seq_len=int(seq_len), n_layers=int(n_layers), kv_dtype=str(kv_dtype),
                      field_dtype=str(field_dtype), soma_layer=soma, full_kv_layer=full,
                      seed_ratio=2 * seq_len / (2 * cfg.ring + 1), formula=formula)
