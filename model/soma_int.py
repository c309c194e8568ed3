"""Bit-exact integer Soma decode step: the readable numpy specification and the parameter helpers.

The step is written out in docs/numerics.md (section "Soma"); ``soma.prefill(..., impl="numpy")`` runs
:func:`run_spec` here, ``impl="numba"`` the fast path in :mod:`somatile.model.soma_nb`; both are
``np.array_equal``. Every integer step is a multiply, an add, a rounding right shift
(:func:`~somatile.model.soma_fixed.rshift_round`) or a saturation, with the normaliser row kernels of
:mod:`somatile.model.hccs` / :mod:`somatile.model.intexp` / :mod:`somatile.model.wide`.

``cfg`` is a :class:`somatile.model.soma.SomaConfig` and ``st`` a :class:`~somatile.model.soma.SomaState`;
this module reads them through their fields and methods and does not import somatile.model.soma, which
derives its integer parameters here and dispatches its integer runs to this module and to soma_nb.
"""

from __future__ import annotations

import math

import numpy as np

from somatile.model import hccs, intexp, wide
from somatile.model.soma_fixed import (FIELD_FRAC_BITS, GATE_FRAC_BITS, GATE_HALF, GATE_ONE, INT8_MAX, INT8_MIN,
                                       INT16_MAX, INT16_MIN, NORM_CODES, PARAM_ROWS, field_update, fixed_point,
                                       out_dtype, param_table, rshift_round, saturate)

WIDE_NORM_CODES = {"exp_int": wide.NORM_EXP, "hccs_int": wide.NORM_HCCS, "pwl2_int": wide.NORM_PWL2}
LIMITS = {"paper": dict(logit=(INT8_MIN, INT8_MAX), out=(INT8_MIN, INT8_MAX), prob_one=hccs.UINT8_MAX),
          "wide": dict(logit=(wide.LOGIT_MIN, wide.LOGIT_MAX), out=(INT16_MIN, INT16_MAX), prob_one=wide.PROB_ONE)}
"""Per profile: the normaliser input's saturation bounds, the output's, and the probability's 1.0."""


def norm_codes(cfg) -> np.ndarray:
    """The numba kernels' code of each query head's integer normaliser within the profile (int64 (H,)):
    the config's normaliser, the integer exp on ``fallback`` heads."""
    code = (WIDE_NORM_CODES if cfg.profile == "wide" else NORM_CODES)[cfg.normaliser]
    return np.where(np.array(cfg.fallback or (False,) * cfg.n_heads), wide.NORM_EXP, code).astype(np.int64)

def default_hccs_params(cfg):
    """Per-head (B, S, dmax) for rows of ``cfg.slots`` entries: the seed's single clip ``hccs_c`` (logit
    units) at ``logit_scale`` through :func:`somatile.model.quant.int_params_from_clip` (floor raised to the
    paper's minimum so that ``hccs.check_params`` holds)."""
    from somatile.model import quant
    try:
        return tuple(tuple(int(x) for x in a) for a in quant.int_params_from_clip(cfg.hccs_c, cfg.logit_scale,
                                                                                     cfg.slots))
    except ValueError as err:
        raise ValueError(f"SomaConfig.hccs_B: cannot derive HCCS parameters for rows of sinks + ring = "
                         f"{cfg.slots} slots from hccs_c and logit_scale ({err}); give hccs_B/hccs_S/hccs_dmax, "
                         f"or use normaliser='exp_int' or a smaller ring") from None


def default_wide_params(cfg):
    """Per-head wide (B, S, dmax): "pwl2_int" the model's own slope without a clip (S = 256, dmax = 65535);
    "hccs_int" the seed's single clip ``hccs_c`` (nats) as a line from 32768 at distance 0 to 0 at the clip;
    "exp_int" takes no parameters (zeros)."""
    H = cfg.n_heads
    if cfg.normaliser == "pwl2_int":
        return (0,) * H, (256,) * H, (wide.DMAX_MAX,) * H
    if cfg.normaliser == "exp_int":
        return (0,) * H, (0,) * H, (0,) * H
    dmax = [min(max(int(round(c * math.log2(math.e) * (1 << wide.LOGIT_FRAC_BITS))), 1), wide.DMAX_MAX)
            for c in cfg.hccs_c]
    slope = [min((wide.PROB_ONE << wide.S_FRAC_BITS) // d, wide.S_MAX) for d in dmax]
    return (wide.PROB_ONE,) * H, tuple(slope), tuple(dmax)


def check_wide_params(cfg):
    if cfg.slots > wide.MAX_COLS:
        raise ValueError(f"SomaConfig.ring: sinks + ring = {cfg.slots} exceeds the wide row limit {wide.MAX_COLS}")
    try:
        wide.check_params(cfg.normaliser.removesuffix("_int"), cfg.hccs_B, cfg.hccs_S, cfg.hccs_dmax, cfg.n_heads)
    except ValueError as err:
        raise ValueError(f"SomaConfig.hccs_B/hccs_S/hccs_dmax (profile 'wide', {cfg.normaliser}): {err}") from None


def check_hccs_params(cfg):
    try:
        hccs.check_params(cfg.hccs_B, cfg.hccs_S, cfg.hccs_dmax, cfg.slots, cfg.n_heads)
    except ValueError as err:
        raise ValueError(f"SomaConfig.hccs_B/hccs_S/hccs_dmax (rows of sinks + ring = {cfg.slots} slots): "
                         f"{err}") from None


def default_exp_mult(cfg):
    if cfg.slots > intexp.MAX_COLS:
        raise ValueError(f"SomaConfig.ring: sinks + ring = {cfg.slots} exceeds the integer exp row limit "
                         f"{intexp.MAX_COLS}")
    try:
        return tuple(int(m) for m in intexp.exp_mult_from_scale(cfg.logit_scale))
    except ValueError as err:
        raise ValueError(f"SomaConfig.logit_scale: {err}") from None


def _per(value, n: int, name: str) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(value, np.float64))
    if arr.size == 1:
        arr = np.repeat(arr, n)
    if arr.shape != (n,) or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name}: expected a positive scale or {n} positive per-head scales, got {value!r}")
    return arr


def integer_config(cfg, *, q_scale, k_scale, v_scale, out_scale, logit_scale=None):
    """The integer twin of a float config: q = q_int * q_scale (per query head), k, v per KV head,
    output = out_int * out_scale (per query head); ``logit_scale`` (default cfg.logit_scale) is the step of
    the normaliser's int8 input (profile "paper"; the wide profile's logit step is fixed at 2^-8 bit).
    Returns ``cfg`` with ``integer=True`` and every multiplier/shift derived (:func:`fixed_point`); a float
    "softmax"/"hccs" normaliser becomes "hccs_int".
    """
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    qs, ls, os_ = _per(q_scale, H, "q_scale"), _per(logit_scale or cfg.logit_scale, H, "logit_scale"), \
        _per(out_scale, H, "out_scale")
    kv = np.arange(H) // cfg.group
    ks, vs = _per(k_scale, Hkv, "k_scale")[kv], _per(v_scale, Hkv, "v_scale")[kv]
    field_scale = ks if cfg.field_source == "keys" else vs
    if cfg.profile == "wide":  # logits in 2^-8 bit units: the step is log(2) / 256 nats for every head
        ls = np.full(H, math.log(2) / (1 << wide.LOGIT_FRAC_BITS))
    prob_one = LIMITS[cfg.profile]["prob_one"]
    params = {n: [] for n in ("score", "out", "alpha", "gate")}
    for h in range(H):
        params["score"].append(fixed_point(qs[h] * ks[h] / (math.sqrt(D) * ls[h]), "score factor"))
        params["out"].append(fixed_point(vs[h] / (prob_one * os_[h]), "output factor"))
        params["alpha"].append(fixed_point(abs(cfg.alpha) * field_scale[h] / (2 ** FIELD_FRAC_BITS * os_[h]),
                                           "alpha factor"))
        # gate (Q7) = 64 + 32 z with z = q.F_k / sqrt(D) and F_k carrying 7 fraction bits
        params["gate"].append(fixed_point(qs[h] * ks[h] / (4 * math.sqrt(D)), "gate factor"))
    if cfg.alpha < 0:
        raise ValueError("alpha: the integer path needs alpha >= 0 (the multiplier is unsigned)")
    recency = [int(round(cfg.recency / s)) for s in ls]
    if cfg.profile == "paper" and max(recency) > 127:
        raise ValueError(f"recency: {cfg.recency} / logit_scale exceeds 127 int8 steps per token")
    normaliser = cfg.normaliser if cfg.normaliser in WIDE_NORM_CODES else "hccs_int"
    fields = {}
    for n in ("score", "out", "alpha", "gate"):
        fields[f"{n}_mult"] = tuple(m for m, _ in params[n])
        fields[f"{n}_shift"] = tuple(s for _, s in params[n])
    return cfg.replace(integer=True, normaliser=normaliser, logit_scale=tuple(ls), recency_int=tuple(recency),
                       **fields)


def quantize(x, scale, name: str = "x") -> np.ndarray:
    """Float (..., H, D) -> int8 with per-head ``scale`` (H,): round half to even of x / scale, saturated."""
    x = np.asarray(x, np.float64)
    s = _per(scale, x.shape[-2], f"{name} scale")[:, None]
    return np.clip(np.rint(x / s), INT8_MIN, INT8_MAX).astype(np.int8)


def scales_for(x, name: str = "x") -> np.ndarray:
    """Symmetric per-head scales max|x| / 127 over every axis but the head axis (-2) of (..., H, D)."""
    x = np.asarray(x, np.float64)
    m = np.abs(x).reshape(-1, x.shape[-2], x.shape[-1]).max(axis=(0, 2))
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name}: contains NaN or infinity")
    return np.where(m > 0, m / INT8_MAX, 1.0)


def _normalise_spec(cfg, x8: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(H, N) logits of the profile -> (H, N) probabilities through the normaliser's numpy spec."""
    mask = np.broadcast_to(valid, x8.shape)
    if cfg.profile == "wide":
        zeros = (0,) * cfg.n_heads
        B, S, dmax = cfg.hccs_B or zeros, cfg.hccs_S or zeros, cfg.hccs_dmax or zeros
        names = {code: name for name, code in wide.NORM_CODES.items()}
        return np.stack([wide.wide_softmax(x8[h, None], names[c], B[h], S[h], dmax[h], mask=mask[h, None],
                                           impl="numpy")[0] for h, c in enumerate(norm_codes(cfg))])
    if cfg.normaliser == "hccs_int":
        return hccs.hccs_int(x8[:, None], cfg.hccs_B, cfg.hccs_S, cfg.hccs_dmax, mode=cfg.hccs_mode,
                             mask=mask[:, None], impl="numpy")[:, 0]
    return intexp.intexp_softmax(x8[:, None], cfg.exp_mult, mask=mask[:, None], impl="numpy")[:, 0]


def step_spec(cfg, st, p: np.ndarray, q, k, v) -> np.ndarray:
    """One integer decode step (numpy spec). q int8 (H, D), k, v int8 (Hkv, D), p = param_table(cfg).
    Returns (H, D) of ``out_dtype(cfg)`` (int8 "paper", int16 "wide"); updates ``st`` in place."""
    P = dict(zip(PARAM_ROWS, (row[:, None] for row in p)))
    lim = LIMITS[cfg.profile]
    if cfg.include_self:
        st.write(k, v)
    kv = np.arange(cfg.n_heads) // cfg.group
    keys = np.concatenate([st.sink_k, st.ring_k], axis=1).astype(np.int64)[kv]
    vals = np.concatenate([st.sink_v, st.ring_v], axis=1).astype(np.int64)[kv]
    valid = np.concatenate([np.arange(cfg.sinks) < st.sink_fill, np.arange(cfg.ring) < st.fill])
    dist = np.concatenate([np.zeros(cfg.sinks, np.int64), st.ring_distances(cfg.include_self)])

    scores = np.einsum("hd,hnd->hn", q.astype(np.int64), keys)
    logits = rshift_round(scores * P["score_mult"], P["score_shift"]) - P["recency_int"] * dist
    x8 = np.where(valid, saturate(logits, *lim["logit"]), 0).astype(np.int16 if cfg.profile == "wide" else np.int8)
    prob = _normalise_spec(cfg, x8, valid).astype(np.int64)
    acc = np.einsum("hn,hnd->hd", prob, vals)
    near = saturate(rshift_round(acc * P["out_mult"], P["out_shift"]), INT16_MIN, INT16_MAX)

    field_ = st.field.astype(np.int64)[kv]
    if cfg.gated:
        z = np.sum(q.astype(np.int64) * st.gate_field.astype(np.int64)[kv], axis=-1, keepdims=True)
        gate = saturate(GATE_HALF + rshift_round(z * P["gate_mult"], P["gate_shift"]), 0, GATE_ONE)
    else:
        gate = GATE_ONE
    far = saturate(rshift_round(field_ * P["alpha_mult"] * gate, P["alpha_shift"] + GATE_FRAC_BITS),
                   INT16_MIN, INT16_MAX)
    out = saturate(near + far, *lim["out"]).astype(out_dtype(cfg))

    if not cfg.include_self:
        st.write(k, v)
    st.field[...] = field_update(st.field, k if cfg.field_source == "keys" else v, cfg.gamma_q15)
    if cfg.gated:
        st.gate_field[...] = field_update(st.gate_field, k, cfg.gamma_q15)
    return out


def run_spec(cfg, st, q, k, v) -> np.ndarray:
    """T integer decode steps of the spec: q int8 (T, H, D), k, v int8 (T, Hkv, D) -> (T, H, D) of
    ``out_dtype(cfg)``; ``st`` in place."""
    p = param_table(cfg)
    out = np.empty(q.shape, out_dtype(cfg))
    for t in range(q.shape[0]):
        out[t] = step_spec(cfg, st, p, q[t], k[t], v[t])
    return out

