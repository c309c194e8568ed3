"""The Metal integer Soma decode step against somatile.model.soma (numba fast path and numpy spec), bit for
bit: outputs and the whole state after every token, through both dispatch paths on the CPU emulator."""

import numpy as np
import pytest

from somatile.host import metal_backend, metal_emu
from somatile.model import soma

GEOMETRY = dict(n_heads=4, n_kv_heads=2, head_dim=16, ring=8)
CONFIGS = {
    "seed": dict(preset="seed", ring=8),
    "default_sinks_gqa": dict(preset="default", sinks=3, alpha=0.25),
    "gated_field": dict(preset="gated_field", sinks=1),
    "exp_int": dict(preset="default", normaliser="exp_int", alpha=0.1),
    "clb_recency": dict(preset="default", hccs_mode="clb", recency=0.3, sinks=2),
    "keys_field_no_self": dict(preset="default", include_self=False, field_source="keys", alpha=0.5),
}


def integer_config(name, **extra):
    kw = {**GEOMETRY, **CONFIGS[name], **extra}
    return soma.SomaConfig.preset(kw.pop("preset"), integer=True, profile="paper", **kw)


def tokens(rng, cfg, T, low=-128, high=128):
    q = rng.integers(low, high, (T, cfg.n_heads, cfg.head_dim)).astype(np.int8)
    k = rng.integers(low, high, (T, cfg.n_kv_heads, cfg.head_dim)).astype(np.int8)
    v = rng.integers(low, high, (T, cfg.n_kv_heads, cfg.head_dim)).astype(np.int8)
    return q, k, v


def assert_same_state(a, b):
    for (name, x), y in zip(a.to_arrays().items(), b.to_arrays().values()):
        assert np.array_equal(x, y), f"state {name} differs"


def assert_prefill_matches_model(runner, cfg, q, k, v):
    expected, expected_state = soma.prefill(cfg, q, k, v)
    got, state = metal_backend.soma_prefill(runner, cfg, q, k, v)
    assert np.array_equal(got, expected)
    assert_same_state(state, expected_state)


def assert_decode_steps_continue_a_loaded_state(runner, cfg, q, k, v, start: int):
    """Tokens start.. one decode step at a time from the model's state after tokens ..start, loaded back
    through to_arrays / from_arrays: every output (value and dtype) and the final state match the model."""
    _, state = soma.prefill(cfg, q[:start], k[:start], v[:start])
    loaded = soma.SomaState.from_arrays(cfg, state.to_arrays())
    for t in range(start, q.shape[0]):
        expected, state = soma.decode_step(cfg, state, q[t], k[t], v[t])
        got, loaded = metal_backend.soma_decode_step(runner, cfg, loaded, q[t], k[t], v[t])
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
    assert_same_state(loaded, state)


def assert_full_state_matches_model(runner, rng, cfg):
    """Two tokens from a loaded full state (random keys, values and fields, every ring slot and every sink
    valid, the write position inside the ring) match the model, outputs and state."""
    state = soma.SomaState.empty(cfg)
    for name in ("ring_k", "ring_v", "sink_k", "sink_v"):
        getattr(state, name)[...] = rng.integers(-128, 128, getattr(state, name).shape)
    for name in ("field", "gate_field"):
        getattr(state, name)[...] = rng.integers(-16384, 16384, getattr(state, name).shape)
    state.write_pos, state.fill, state.step = 17, cfg.ring, 100000
    expected_state = soma.SomaState.from_arrays(cfg, state.to_arrays())
    q, k, v = tokens(rng, cfg, 2)
    expected, expected_state = soma.prefill(cfg, q, k, v, state=expected_state)
    got, state = metal_backend.soma_prefill(runner, cfg, q, k, v, state=state)
    assert np.array_equal(got, expected)
    assert_same_state(state, expected_state)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_matches_model_through_ring_wraparound(runner, rng, name):
    cfg = integer_config(name)
    assert_prefill_matches_model(runner, cfg, *tokens(rng, cfg, 2 * cfg.ring + 5))


@pytest.mark.parametrize("order", tuple(metal_emu.THREAD_ORDERS))
def test_decode_in_every_thread_order_against_the_numpy_spec(rng, order):
    cfg = integer_config("gated_field", n_heads=6, n_kv_heads=3, head_dim=40, ring=37)
    q, k, v = tokens(rng, cfg, 45)
    expected, _ = soma.prefill(cfg, q, k, v, impl="numpy")
    runner = metal_backend.make_runner("pyobjc", emulate=True, order=order, seed=4)
    assert np.array_equal(metal_backend.soma_prefill(runner, cfg, q, k, v)[0], expected)


def test_adversarial_tokens_saturate_like_the_model(runner):
    """Scores at the int32 extremes of int8 inputs, logits saturating at both int8 ends, all-equal rows."""
    cfg = integer_config("default_sinks_gqa", score_mult=32767, score_shift=4, out_mult=32767, out_shift=6,
                         alpha_mult=32767, alpha_shift=0)
    T = cfg.slots + 3
    extremes = [np.full((T, h, cfg.head_dim), value, np.int8) for h, value in
                ((cfg.n_heads, 127), (cfg.n_kv_heads, -128), (cfg.n_kv_heads, 127))]
    same = [np.full((T, h, cfg.head_dim), 5, np.int8) for h in (cfg.n_heads, cfg.n_kv_heads, cfg.n_kv_heads)]
    for q, k, v in (extremes, same):
        assert_prefill_matches_model(runner, cfg, q, k, v)


def test_decode_step_continues_a_loaded_state(runner, rng):
    cfg = integer_config("clb_recency")
    assert_decode_steps_continue_a_loaded_state(runner, cfg, *tokens(rng, cfg, 14), start=11)


def test_soma_bad_input_names_the_field(runner, rng):
    cfg = integer_config("seed")
    q, k, v = tokens(rng, cfg, 2)
    with pytest.raises(ValueError, match="Soma input 'k': expected shape"):
        metal_backend.soma_prefill(runner, cfg, q, k[:, :1], v)
    with pytest.raises(ValueError, match="SomaConfig.integer"):
        metal_backend.soma_prefill(runner, soma.SomaConfig.preset("seed", **GEOMETRY), q * 1.0, k * 1.0, v * 1.0)
    big = soma.SomaConfig.preset("default", integer=True, profile="paper", n_heads=1, head_dim=8, ring=5000,
                                 normaliser="exp_int")
    with pytest.raises(ValueError, match="exceeds the 4096 slots"):
        metal_backend.soma_prefill(runner, big, *tokens(rng, big, 1))


def test_edge_shifts_and_gate_saturation(runner, rng):
    """Shifts at both ends of their range (score and far-field products shifted by 47 + 7 bits in int64,
    outputs unshifted and saturating) and a gate driven to both clamps."""
    for shifts in (dict(score_shift=47, out_shift=0, alpha_shift=47, gate_shift=0),
                   dict(score_shift=0, out_shift=47, alpha_shift=0, gate_shift=47)):
        cfg = integer_config("gated_field", score_mult=32767, out_mult=32767, alpha_mult=32767, gate_mult=32767,
                             recency_int=127, **shifts)
        assert_prefill_matches_model(runner, cfg, *tokens(rng, cfg, cfg.ring + 3))


def test_largest_row_the_kernel_holds(runner, rng):
    """sinks + ring = SOMA_MAX_SLOTS slots of head_dim 256 (the model's integer limit), from a loaded full
    state: every slot valid, the threadgroup memory of the kernel used to its end."""
    from somatile.host import metal_kernels

    cfg = soma.SomaConfig.preset("default", integer=True, profile="paper", n_heads=2, n_kv_heads=1, head_dim=256, sinks=96,
                                 ring=metal_kernels.SOMA_MAX_SLOTS - 96, normaliser="exp_int")
    assert_full_state_matches_model(runner, rng, cfg)
