"""Float Soma reference: streaming equals batch, the causal-attention limit, the seed preset, memory, errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from somatile.model import soma
from somatile.model.soma import SomaConfig, SomaState, decode_step, prefill, state_bytes

# Float64 throughout: the vectorised prefill and the step loop sum in different orders, so they agree to
# rounding (about 1e-15 relative); 1e-10 leaves room for long rows without hiding a wrong token or weight.
ATOL = 1e-10


def qkv(rng, T, cfg, dtype=np.float64):
    shape_q, shape_kv = (T, cfg.n_heads, cfg.head_dim), (T, cfg.n_kv_heads, cfg.head_dim)
    return (rng.standard_normal(shape_q).astype(dtype), rng.standard_normal(shape_kv).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype))


def causal_attention(q, k, v, include_self=True):
    """Standard causal softmax attention written independently of model/soma.py (GQA by head repeat)."""
    T, H, D = q.shape
    kr = np.repeat(k, H // k.shape[1], axis=1)
    vr = np.repeat(v, H // v.shape[1], axis=1)
    logits = np.einsum("thd,uhd->htu", q, kr) / np.sqrt(D)
    allowed = np.tril(np.ones((T, T), bool), 0 if include_self else -1)
    logits = np.where(allowed, logits, -np.inf)
    with np.errstate(invalid="ignore"):  # a row with nothing allowed (t = 0 without self) becomes NaN
        w = np.exp(logits - logits.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
    return np.einsum("htu,uhd->thd", w, vr)


configs = st.builds(
    lambda kv, group, d, ring, sinks_frac, include_self, field, alpha, recency, normaliser: SomaConfig(
        n_heads=kv * group, n_kv_heads=kv, head_dim=d, ring=ring, sinks=int(sinks_frac * ring),
        include_self=include_self, field_source="values" if field == "gated" else field,
        gating="query" if field == "gated" else "none", alpha=alpha, recency=recency, normaliser=normaliser),
    kv=st.integers(1, 2), group=st.integers(1, 3), d=st.sampled_from([1, 4, 8]), ring=st.integers(1, 12),
    sinks_frac=st.floats(0, 1), include_self=st.booleans(), field=st.sampled_from(["keys", "values", "gated"]),
    alpha=st.sampled_from([0.0, 0.1, 0.7]), recency=st.sampled_from([0.0, 0.3]),
    normaliser=st.sampled_from(["softmax", "hccs"]))


@settings(max_examples=60, deadline=None)
@given(cfg=configs, T=st.integers(1, 40), split=st.floats(0, 1), seed=st.integers(0, 2 ** 31))
def test_decode_after_prefill_equals_prefill_of_whole_sequence(cfg, T, split, seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, T, cfg)
    whole, whole_state = prefill(cfg, q, k, v)
    cut = int(split * T)
    parts = []
    if cut:
        first, state = prefill(cfg, q[:cut], k[:cut], v[:cut])
        parts.append(first)
    else:
        state = SomaState.empty(cfg, np.float64)
    for t in range(cut, T):
        out, state = decode_step(cfg, state, q[t], k[t], v[t])
        parts.append(out[None])
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=ATOL)
    for name, value in whole_state.to_arrays().items():
        np.testing.assert_allclose(state.to_arrays()[name], value, rtol=0, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("cfg", [
    SomaConfig(n_heads=2, head_dim=4, ring=300, sinks=3, recency=0.01, alpha=0.2, gating="query"),
    SomaConfig(n_heads=4, n_kv_heads=2, head_dim=4, ring=40, sinks=40, include_self=False, field_source="keys",
               alpha=0.1),
])
def test_multi_block_prefill_equals_steps(rng, cfg):
    """600 tokens: the vectorised prefill runs three query blocks of 256, each over its own key window."""
    q, k, v = qkv(rng, 600, cfg)
    whole, _ = prefill(cfg, q, k, v)
    state = SomaState.empty(cfg, np.float64)
    stepped = np.stack([decode_step(cfg, state, q[t], k[t], v[t])[0] for t in range(600)])
    np.testing.assert_allclose(stepped, whole, rtol=0, atol=ATOL)


@pytest.mark.parametrize("kv,group", [(1, 1), (2, 3), (1, 4)])
def test_full_ring_no_sinks_no_field_is_causal_attention(rng, kv, group):
    T = 50
    cfg = SomaConfig(n_heads=kv * group, n_kv_heads=kv, head_dim=16, ring=T, sinks=0, alpha=0.0,
                     include_self=True)
    q, k, v = qkv(rng, T, cfg)
    out, _ = prefill(cfg, q, k, v)
    # Same maths in another summation order: agreement to float64 rounding.
    np.testing.assert_allclose(out, causal_attention(q, k, v), rtol=0, atol=1e-12)
    state = SomaState.empty(cfg, np.float64)
    stepped = np.stack([decode_step(cfg, state, q[t], k[t], v[t])[0] for t in range(T)])
    np.testing.assert_allclose(stepped, out, rtol=0, atol=1e-12)


def test_truncating_ring_differs_from_causal_attention(rng):
    cfg = SomaConfig(n_heads=2, head_dim=8, ring=4, alpha=0.0)
    q, k, v = qkv(rng, 20, cfg)
    out, _ = prefill(cfg, q, k, v)
    ref = causal_attention(q, k, v)
    np.testing.assert_allclose(out[:4], ref[:4], rtol=0, atol=1e-12)
    assert np.abs(out[4:] - ref[4:]).max() > 1e-3


def test_seed_preset_literally(rng):
    cfg = SomaConfig.preset("seed", n_heads=2, head_dim=8)
    assert (cfg.ring, cfg.sinks, cfg.include_self, cfg.field_source, cfg.gating, cfg.alpha, cfg.gamma) == \
        (16, 0, False, "keys", "none", 0.1, 0.98)
    q, k, v = qkv(rng, 40, cfg)
    out, state = prefill(cfg, q, k, v)
    assert np.array_equal(out[0], np.zeros_like(out[0])), "t = 0 reads an empty ring and a zero field"
    # t = 1: one visible token (weight 1), field = (1 - gamma) k_0.
    np.testing.assert_allclose(out[1], v[0] + 0.1 * 0.02 * k[0], rtol=0, atol=1e-12)
    # t = 30: attention over tokens 14..29 only (the 16 before t) plus alpha * EMA of keys 0..29.
    field = np.zeros_like(k[0])
    for t in range(30):
        field = 0.98 * field + 0.02 * k[t]
    near = causal_attention(q[14:31], k[14:31], v[14:31], include_self=False)[-1]
    np.testing.assert_allclose(out[30], near + 0.1 * field, rtol=0, atol=1e-12)
    assert state.fill == 16 and state.step == 40 and state.write_pos == 40 % 16


def test_sinks_are_kept_forever_and_not_duplicated(rng):
    cfg = SomaConfig(n_heads=1, head_dim=4, ring=3, sinks=2, alpha=0.0)
    q, k, v = qkv(rng, 12, cfg)
    out, state = prefill(cfg, q, k, v)
    np.testing.assert_array_equal(state.sink_k[0], k[:2, 0])
    assert sorted(map(tuple, state.ring_k[0])) == sorted(map(tuple, k[9:12, 0]))
    keep = [0, 1, 9, 10, 11]
    ref = causal_attention(q[keep], k[keep], v[keep])[-1]
    np.testing.assert_allclose(out[11], ref, rtol=0, atol=1e-12)


def test_recency_bias_is_the_seeds_temporal_decay(rng):
    cfg = SomaConfig(n_heads=1, head_dim=4, ring=8, recency=0.5, alpha=0.0)
    q, k, v = qkv(rng, 6, cfg)
    out, _ = prefill(cfg, q, k, v)
    logits = k[:, 0] @ q[5, 0] / 2.0 - 0.5 * (5 - np.arange(6))
    w = np.exp(logits - logits.max())
    np.testing.assert_allclose(out[5, 0], (w / w.sum()) @ v[:, 0], rtol=0, atol=1e-12)


def test_gated_field_uses_hard_sigmoid_of_query_and_key_field(rng):
    cfg = SomaConfig(n_heads=1, head_dim=4, ring=2, alpha=0.5, gating="query", field_source="values")
    q, k, v = qkv(rng, 5, cfg)
    out, _ = prefill(cfg, q, k, v)
    fk = fv = np.zeros(4)
    for t in range(4):
        fk, fv = 0.98 * fk + 0.02 * k[t, 0], 0.98 * fv + 0.02 * v[t, 0]
    g = np.clip(0.5 + (q[4, 0] @ fk / 2.0) / 4, 0, 1)
    near = causal_attention(q[3:5], k[3:5], v[3:5])[-1, 0]
    np.testing.assert_allclose(out[4, 0], near + 0.5 * g * fv, rtol=0, atol=1e-12)


def test_float_hccs_normaliser_matches_seed_definition(rng):
    cfg = SomaConfig(n_heads=1, head_dim=4, ring=8, normaliser="hccs", hccs_c=2.0)
    q, k, v = qkv(rng, 8, cfg)
    out, _ = prefill(cfg, q, k, v)
    x = k[:, 0] @ q[7, 0] / 2.0
    score = np.maximum(x - x.max(), -2.0) + 2.0
    np.testing.assert_allclose(out[7, 0], (score / score.sum()) @ v[:, 0], rtol=0, atol=1e-12)


def test_float_path_with_integer_normaliser_stays_close_to_softmax(rng):
    base = SomaConfig(n_heads=2, head_dim=16, ring=32, sinks=4, logit_scale=1 / 16)
    q, k, v = qkv(rng, 64, base)
    ref, _ = prefill(base, q, k, v)
    for normaliser in ("exp_int", "hccs_int"):
        out, _ = prefill(base.replace(normaliser=normaliser), q, k, v)
        # exp_int: uint8 probabilities (1/255 steps) of a faithful exp; hccs_int: a clipped-linear surrogate.
        limit = 0.05 if normaliser == "exp_int" else 0.5
        assert np.abs(out - ref).mean() < limit, normaliser


def test_float32_inputs_stay_float32(rng):
    cfg = SomaConfig(n_heads=2, head_dim=8, ring=4, alpha=0.1)
    q, k, v = qkv(rng, 10, cfg, np.float32)
    out, state = prefill(cfg, q, k, v)
    assert out.dtype == np.float32 and state.ring_k.dtype == np.float32
    assert decode_step(cfg, state, q[0], k[0], v[0])[0].dtype == np.float32


def test_state_roundtrip_through_arrays(rng):
    cfg = SomaConfig.preset("gated_field", n_heads=4, n_kv_heads=2, head_dim=8, ring=6, sinks=2)
    q, k, v = qkv(rng, 20, cfg)
    _, state = prefill(cfg, q[:15], k[:15], v[:15])
    copy = SomaState.from_arrays(cfg, state.to_arrays(), np.float64)
    a, _ = prefill(cfg, q[15:], k[15:], v[15:], state=state)
    b, _ = prefill(cfg, q[15:], k[15:], v[15:], state=copy)
    np.testing.assert_array_equal(a, b)


def test_state_bytes_formula_and_seed_ratio():
    cfg = SomaConfig.preset("seed", n_heads=28, n_kv_heads=4, head_dim=128)
    s = state_bytes(cfg, 4096, n_layers=28)
    assert s.soma_layer == SomaState.empty(cfg).nbytes == 2 * 4 * 16 * 128 * 4 + 4 * 128 * 4 + 12
    assert s.full_kv_layer == 2 * 4096 * 4 * 128 * 4
    assert s.soma_model == 28 * s.soma_layer and s.full_kv_model == 28 * s.full_kv_layer
    assert round(s.seed_ratio) == 248
    assert s.ratio == pytest.approx(s.full_kv_layer / s.soma_layer)
    icfg = SomaConfig.preset("gated_field", n_heads=8, n_kv_heads=2, head_dim=64, integer=True)
    si = state_bytes(icfg, 65536)
    assert (si.kv_dtype, si.field_dtype) == ("int8", "int16")
    assert si.soma_layer == SomaState.empty(icfg).nbytes == 2 * 2 * 256 * 64 + 2 * 2 * 64 * 2 + 12


@pytest.mark.parametrize("changes,field", [
    (dict(ring=0), "ring"), (dict(ring=4, sinks=5), "sinks"), (dict(n_heads=6, n_kv_heads=4), "n_kv_heads"),
    (dict(gamma=1.0), "gamma"), (dict(gamma=-0.1), "gamma"), (dict(field_source="queries"), "field_source"),
    (dict(gating="query", field_source="keys"), "field_source"), (dict(normaliser="relu"), "normaliser"),
    (dict(recency=-1.0), "recency"), (dict(alpha=float("nan")), "alpha"), (dict(logit_scale=(1.0,)), "logit_scale"),
    (dict(integer=True, normaliser="softmax"), "normaliser"), (dict(head_dim=0), "head_dim"),
    (dict(hccs_B=10), "hccs_B"), (dict(include_self="no"), "include_self"), (dict(integer=1), "integer"),
])
def test_config_errors_name_the_field(changes, field):
    with pytest.raises(ValueError, match=f"SomaConfig.{field}"):
        SomaConfig(**{**dict(n_heads=2, head_dim=8, ring=8), **changes})


def test_replace_derives_derived_fields_again():
    cfg = SomaConfig(n_heads=2, head_dim=8, ring=252, sinks=4, normaliser="hccs_int")
    assert cfg.replace(gamma=0.5).gamma_q15 == 16384
    short = cfg.replace(ring=12)
    assert short.hccs_B == SomaConfig(n_heads=2, head_dim=8, ring=12, sinks=4, normaliser="hccs_int").hccs_B
    assert short.hccs_B != cfg.hccs_B
    fixed = cfg.replace(gamma_q15=100)
    assert fixed.replace(gamma=0.5).gamma_q15 == 100, "an explicit value stays"
    exp = cfg.replace(normaliser="exp_int")
    assert exp.replace(logit_scale=0.25).exp_mult == (11819, 11819)


def test_preset_unknown_name():
    with pytest.raises(ValueError, match="unknown preset 'fast'"):
        SomaConfig.preset("fast")


def test_input_errors_name_the_tensor(rng):
    cfg = SomaConfig(n_heads=4, n_kv_heads=2, head_dim=8, ring=4)
    q, k, v = qkv(rng, 3, cfg)
    with pytest.raises(ValueError, match=r"'k': expected shape \(T, 2, 8\)"):
        prefill(cfg, q, q, v)
    with pytest.raises(ValueError, match="'v': expected T=3"):
        prefill(cfg, q, k, v[:2])
    with pytest.raises(ValueError, match="'q': expected a float array"):
        prefill(cfg, q.astype(np.int8), k, v)
    bad = q.copy()
    bad[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="'q': contains NaN"):
        prefill(cfg, bad, k, v)
    with pytest.raises(ValueError, match="at least one token"):
        prefill(cfg, q[:0], k[:0], v[:0])
    with pytest.raises(ValueError, match=r"'q': expected shape \(4, 8\)"):
        decode_step(cfg, SomaState.empty(cfg), q, k[0], v[0])
    other = SomaState.empty(cfg.replace(ring=5), np.float64)
    with pytest.raises(ValueError, match="Soma state: ring_k"):
        decode_step(cfg, other, q[0], k[0], v[0])
    arrays = SomaState.empty(cfg).to_arrays()
    arrays["fill"] = np.array(9, np.int32)
    with pytest.raises(ValueError, match="'fill' expected an integer scalar in \\[0, 4\\]"):
        SomaState.from_arrays(cfg, arrays)
    del arrays["field"]
    with pytest.raises(ValueError, match="missing arrays \\['field'\\]"):
        SomaState.from_arrays(cfg, arrays)


def test_integer_helpers_are_exported():
    assert soma.integer_config is not None and soma.quantize is not None
    with pytest.raises(AttributeError):
        soma.no_such_helper
