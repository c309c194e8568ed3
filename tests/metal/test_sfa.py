"""The six float SFA kernels against somatile.model.sfa, stage by stage and end to end.

Tolerance: float32 results agree to rtol 1e-5 / atol 1e-6. The kernels compute the model's formulas in
float32 but associate sums differently (a GPU thread per element, threadgroup reductions for the pool's
softmax), exp() and the alpha power may differ in the last bits, and the ring and field feed back from
token to token; the differences measured here stay within a few float32 ulps (about 2e-7 on unit-scale data).
"""

import math

import numpy as np
import pytest

from somatile.host import metal_backend
from somatile.model import sfa

TOL = dict(rtol=1e-5, atol=1e-6)


def test_alpha_decay_stage(runner):
    cfg = sfa.SfaConfig(n_layers=7, alpha_base=0.3, cross_decay=0.8)
    expected = [sfa.alpha_decay(layer, 7, 0.3, 0.8) for layer in range(7)]
    np.testing.assert_allclose(metal_backend.sfa_alphas(runner, cfg), expected, **TOL)
    one = sfa.SfaConfig(n_layers=1, alpha_base=0.5)
    np.testing.assert_allclose(metal_backend.sfa_alphas(runner, one), [sfa.alpha_decay(0, 1, 0.5, 0.8)], **TOL)


@pytest.mark.parametrize("clip_order", sfa.CLIP_ORDERS)
def test_each_stage_of_one_step(runner, rng, clip_order):
    """One token from a state with a full pool and a ring about to wrap: every stage's result."""
    cfg = sfa.SfaConfig(n_layers=4, ring=4, slots=3, alpha_base=3.0, clip_order=clip_order)
    hidden = 70
    state = sfa.SfaState.new(cfg, hidden)
    state.ring[...] = rng.standard_normal(state.ring.shape)
    state.field[...] = rng.standard_normal(hidden)
    state.pool[...] = rng.standard_normal(state.pool.shape)
    state.ring_pos, state.ring_fill, state.pool_pos, state.pool_fill = 3, 4, 1, 2
    x = rng.standard_normal(hidden).astype(np.float32)
    expected_state = sfa.SfaState(state.ring.copy(), state.field.copy(), state.pool.copy(), 3, 4, 1, 2)

    ring_mean, pos, fill, wrapped = sfa.ring_update(expected_state.ring, 3, 4, x)
    field = sfa.ema_field(expected_state.field, x, cfg.gamma)
    pool_pos, pool_fill = sfa.pool_write(expected_state.pool, 1, 2, ring_mean, wrapped)
    semantic = sfa.semantic_read(expected_state.pool, pool_fill, ring_mean, math.sqrt(hidden))
    fused = sfa.fusion(ring_mean, field, semantic)
    expected = sfa.scale_and_clip(cfg, fused, 0.7)
    assert wrapped and pool_fill == 3

    got = metal_backend.sfa_enhancement(runner, cfg, state, 0.7, x)
    np.testing.assert_allclose(state.ring, expected_state.ring, **TOL)
    np.testing.assert_allclose(state.field, field, **TOL)
    np.testing.assert_allclose(state.pool, expected_state.pool, **TOL)
    assert (state.ring_pos, state.ring_fill, state.pool_pos, state.pool_fill) == (pos, fill, pool_pos, pool_fill)
    np.testing.assert_allclose(got, expected, **TOL)
    assert np.abs(got).max() <= cfg.clip * (0.7 if clip_order == "clip_then_alpha" else 1) + 1e-7


@pytest.mark.parametrize("layer", [0, 2])
def test_sequence_matches_model_through_ring_and_pool_wraparound(runner, rng, layer):
    cfg = sfa.SfaConfig(n_layers=3, ring=4, slots=3, alpha_base=1.5, temperature=2.0)
    x = rng.standard_normal((30, 48)).astype(np.float32)
    expected, expected_state = sfa.sfa_apply(cfg, sfa.SfaState.new(cfg, 48), layer, x)
    got, state = metal_backend.sfa_apply(runner, cfg, sfa.SfaState.new(cfg, 48), layer, x)
    np.testing.assert_allclose(got, expected, **TOL)
    np.testing.assert_allclose(state.pool, expected_state.pool, **TOL)
    assert state.pool_fill == expected_state.pool_fill == 3
    single, _ = metal_backend.sfa_apply(runner, cfg, state, layer, x[0])
    np.testing.assert_allclose(single, sfa.sfa_apply(cfg, expected_state, layer, x[0])[0], **TOL)


def test_sfa_bad_input(runner):
    cfg = sfa.SfaConfig(n_layers=2)
    state = sfa.SfaState.new(cfg, 8)
    with pytest.raises(ValueError, match="SFA input 'x': expected shape"):
        metal_backend.sfa_apply(runner, cfg, state, 0, np.zeros(9, np.float32))
    with pytest.raises(ValueError, match="layer: expected 0 <= layer < n_layers=2"):
        metal_backend.sfa_apply(runner, cfg, state, 2, np.zeros(8, np.float32))
    big = sfa.SfaConfig(n_layers=1, slots=2000)
    with pytest.raises(ValueError, match="SfaConfig.slots: 2000 exceeds"):
        metal_backend.sfa_apply(runner, big, sfa.SfaState.new(big, 8), 0, np.zeros(8, np.float32))
