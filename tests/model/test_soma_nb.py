"""The numba Soma step's blocked paths against the numpy spec: head dimensions that are a multiple of
soma_nb.DOT_CHUNK (constant-trip dot and P.V loops), ring lengths around soma_nb.PV_SLOTS, KV-head groups of
3, both profiles, masked early positions, the ring's wrap-around and the single-token decode entry point."""

import numpy as np
import pytest

from somatile.model import soma_nb
from somatile.model.soma import SomaConfig, SomaState, decode_step, prefill


def int_tokens(rng, cfg, T, lo=-128, hi=127):
    return (rng.integers(lo, hi + 1, (T, cfg.n_heads, cfg.head_dim), dtype=np.int8),
            rng.integers(lo, hi + 1, (T, cfg.n_kv_heads, cfg.head_dim), dtype=np.int8),
            rng.integers(lo, hi + 1, (T, cfg.n_kv_heads, cfg.head_dim), dtype=np.int8))


def assert_same_run(cfg, q, k, v):
    a, sa = prefill(cfg, q, k, v, impl="numpy")
    b, sb = prefill(cfg, q, k, v, impl="numba")
    np.testing.assert_array_equal(b, a)
    for name, value in sa.to_arrays().items():
        np.testing.assert_array_equal(sb.to_arrays()[name], value, err_msg=name)
    return a


SHAPES = {
    "d64_ring_multiple_of_4": dict(head_dim=soma_nb.DOT_CHUNK, ring=12, sinks=4),
    "d128_ring_remainder": dict(head_dim=2 * soma_nb.DOT_CHUNK, ring=soma_nb.PV_SLOTS * 3 + 3, sinks=1),
    "d64_no_sinks_ring1": dict(head_dim=soma_nb.DOT_CHUNK, ring=1, sinks=0),
    "d48_generic": dict(head_dim=48, ring=7, sinks=2),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", [dict(), dict(hccs_mode="clb"), dict(normaliser="exp_int"),
                                     dict(preset="gated_field"),
                                     dict(preset="seed", include_self=True, recency_int=5),
                                     dict(profile="wide", normaliser="pwl2_int")])
def test_blocked_paths_equal_spec(rng, shape, variant):
    kw = {"profile": "paper", **variant}
    cfg = SomaConfig.preset(kw.pop("preset", "default"), n_heads=6, n_kv_heads=2, integer=True, alpha=0.3,
                            **SHAPES[shape], **kw)
    q, k, v = int_tokens(rng, cfg, 2 * cfg.slots + 5)
    out = assert_same_run(cfg, q, k, v)
    assert np.unique(out).size > 3, "outputs should not collapse to a constant"


def test_saturating_keys_and_values(rng):
    """Every key and value at an int8 extreme: the int32 dot and P.V sums at their largest."""
    cfg = SomaConfig.preset("default", n_heads=6, n_kv_heads=2, head_dim=2 * soma_nb.DOT_CHUNK, ring=10,
                            sinks=2, integer=True, profile="paper", score_shift=20)
    for extreme in (-128, 127):
        q, k, v = int_tokens(rng, cfg, 30)
        q[:], k[:], v[:] = -128, extreme, extreme
        assert_same_run(cfg, q, k, v)


def test_decode_steps_equal_prefill(rng):
    cfg = SomaConfig.preset("default", n_heads=9, n_kv_heads=3, head_dim=soma_nb.DOT_CHUNK, ring=20, sinks=4,
                            integer=True, profile="paper")
    q, k, v = int_tokens(rng, cfg, 50)
    expected, _ = prefill(cfg, q, k, v, impl="numpy")
    state = SomaState.empty(cfg)
    steps = [decode_step(cfg, state, q[t], k[t], v[t])[0] for t in range(q.shape[0])]
    np.testing.assert_array_equal(np.stack(steps), expected)


def test_decode_step_rejects_bad_tokens_by_name(rng):
    cfg = SomaConfig.preset("default", n_heads=4, n_kv_heads=2, head_dim=16, ring=6, sinks=2, integer=True,
                            profile="paper")
    q, k, v = (a[0] for a in int_tokens(rng, cfg, 1))
    state = SomaState.empty(cfg)
    with pytest.raises(ValueError, match=r"Soma input 'q': expected int8 \(cfg.integer=True\), got int16"):
        decode_step(cfg, state, q.astype(np.int16), k, v)
    with pytest.raises(ValueError, match=r"Soma input 'v': expected shape \(2, 16\), got \(2, 15\)"):
        decode_step(cfg, state, q, k, v[:, :15])
    short = SomaState.empty(cfg)
    short.ring_k = short.ring_k[:, :5]
    with pytest.raises(ValueError, match="Soma state: ring_k int8 \\(2, 5, 16\\)"):
        decode_step(cfg, short, q, k, v)
    assert state.step == 0 and short.step == 0
    strided = np.repeat(q, 2, axis=1)[:, ::2]   # a view with a column stride of 2 passes the fast test
    out, _ = decode_step(cfg, state, strided, k, v)
    np.testing.assert_array_equal(out, prefill(cfg, q[None], k[None], v[None], impl="numpy")[0][0])


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 2), (10, 2), (9, 3)])
@pytest.mark.parametrize("head_dim", [soma_nb.DOT_CHUNK, 40])
@pytest.mark.parametrize("profile", ["paper", "wide"])
def test_head_groups_around_pv_heads(rng, heads, head_dim, profile):
    """KV-head groups of 1, 2, 4 and 5 query heads (P.V takes them soma_nb.PV_HEADS at a time, the rest one
    at a time) and 3, at the head dimension the kernels specialise on and another."""
    n_heads, n_kv_heads = heads
    cfg = SomaConfig.preset("default", n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, ring=9,
                            sinks=2, integer=True, profile=profile, alpha=0.3)
    assert_same_run(cfg, *int_tokens(rng, cfg, 2 * cfg.slots + 3))


def test_wide_probability_of_one(rng):
    """Wide rows whose probability reaches 32768 (the first steps, with one valid slot) take the general
    int32 multiply of P.V, later rows the narrow one: both equal the spec in one run."""
    cfg = SomaConfig.preset("default", n_heads=6, n_kv_heads=2, head_dim=soma_nb.DOT_CHUNK, ring=8, sinks=1,
                            integer=True, profile="wide", normaliser="exp_int")
    q, k, v = int_tokens(rng, cfg, 40)
    x = np.zeros((cfg.n_heads, 1, 3), np.int16)
    valid = np.array([True, False, False])
    assert soma_nb.normalise_int(cfg, x, np.broadcast_to(valid, x.shape)).max() == 1 << 15
    assert np.abs(assert_same_run(cfg, q, k, v)).max() > 0
