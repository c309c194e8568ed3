"""SFA enhancement: each stage against its definition, the pool write rule, clip order, errors."""

import math

import numpy as np
import pytest

from somatile.model import sfa
from somatile.model.sfa import SfaConfig, SfaState, sfa_apply, sfa_step

# Everything is float32; references are computed in float64, so agreement is to float32 rounding
# (relative 1e-6 of values of order 1 over at most 64 terms).
ATOL = 1e-5


def reference_enhancements(x, cfg, layer, temperature):
    """The definition of model/sfa.py written out directly in float64 (one layer, tokens in order)."""
    ring, pool, field = [], [], np.zeros(x.shape[1])
    writes = 0
    alpha = cfg.alpha_base * (0.3 + 0.7 * layer / (cfg.n_layers - 1)) * cfg.cross_decay ** layer
    out = []
    for t in range(x.shape[0]):
        ring = (ring + [x[t]])[-cfg.ring:]
        writes += 1
        ring_mean = np.mean(ring, axis=0)
        field = cfg.gamma * field + (1 - cfg.gamma) * x[t]
        if writes % cfg.ring == 0:
            pool = (pool + [ring_mean])[-cfg.slots:]
        semantic = np.zeros_like(field)
        if pool:
            P = np.array(pool)
            w = np.exp(P @ ring_mean / temperature - (P @ ring_mean / temperature).max())
            semantic = (w / w.sum()) @ P
        fused = ring_mean + 0.5 * field + 0.5 * semantic
        out.append(np.clip(alpha * fused, -cfg.clip, cfg.clip))
    return np.array(out)


def test_sequence_matches_definition_with_pool_writes(rng):
    cfg = SfaConfig(n_layers=6, ring=4, slots=3, alpha_base=2.0)
    hidden = 8
    x = rng.standard_normal((40, hidden)).astype(np.float32)
    state = SfaState.new(cfg, hidden)
    out, state = sfa_apply(cfg, state, 3, x)
    ref = reference_enhancements(x.astype(np.float64), cfg, 3, math.sqrt(hidden))
    np.testing.assert_allclose(out - x, ref, rtol=0, atol=ATOL)
    assert state.pool_fill == 3 and state.pool_pos == (40 // 4) % 3
    assert np.any(np.abs(ref) >= 0.5 - 1e-12), "alpha 2 must reach the clip"


def test_step_and_apply_agree(rng):
    cfg = SfaConfig(n_layers=2)
    x = rng.standard_normal((20, 5)).astype(np.float32)
    a, _ = sfa_apply(cfg, SfaState.new(cfg, 5), 1, x)
    state = SfaState.new(cfg, 5)
    b = np.stack([x[t] + sfa_step(cfg, state, 1, x[t])[0] for t in range(20)])
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32


def test_semantic_pool_is_written_only_when_the_ring_wraps(rng):
    cfg = SfaConfig(n_layers=1, ring=16, slots=64)
    state = SfaState.new(cfg, 4)
    x = rng.standard_normal((15, 4)).astype(np.float32)
    sfa_apply(cfg, state, 0, x)
    assert state.pool_fill == 0 and not state.pool.any()
    sfa_apply(cfg, state, 0, x[:1])
    assert state.pool_fill == 1
    np.testing.assert_allclose(state.pool[0], np.concatenate([x, x[:1]]).mean(axis=0), rtol=1e-6)


def test_alpha_decay_schedule():
    assert sfa.alpha_decay(0, 24, 0.1, 0.8) == pytest.approx(0.03)
    assert sfa.alpha_decay(23, 24, 0.1, 0.8) == pytest.approx(0.1 * 0.8 ** 23)
    assert sfa.alpha_decay(0, 1, 0.1, 0.8) == pytest.approx(0.03)
    with pytest.raises(ValueError, match="layer: expected 0 <= layer < n_layers=4"):
        sfa.alpha_decay(4, 4, 0.1, 0.8)


def test_clip_order():
    fused = np.array([2.0, -0.2, 0.4], np.float32)
    a = SfaConfig(n_layers=1, clip_order="alpha_then_clip")
    b = a.replace(clip_order="clip_then_alpha")
    np.testing.assert_allclose(sfa.scale_and_clip(a, fused, 0.5), [0.5, -0.1, 0.2], rtol=1e-6)
    np.testing.assert_allclose(sfa.scale_and_clip(b, fused, 0.5), [0.25, -0.1, 0.2], rtol=1e-6)


def test_stage_functions():
    ring = np.zeros((3, 2), np.float32)
    mean, pos, fill, wrapped = sfa.ring_update(ring, 0, 0, np.array([3, 6], np.float32))
    np.testing.assert_array_equal(mean, [3, 6])
    assert (pos, fill, wrapped) == (1, 1, False)
    sfa.ring_update(ring, 1, 1, np.ones(2, np.float32))
    mean, pos, fill, wrapped = sfa.ring_update(ring, 2, 2, np.ones(2, np.float32))
    np.testing.assert_allclose(mean, [5 / 3, 8 / 3])
    assert (pos, fill, wrapped) == (0, 3, True)
    field = np.ones(2, np.float32)
    sfa.ema_field(field, np.zeros(2, np.float32), 0.98)
    np.testing.assert_allclose(field, 0.98)
    np.testing.assert_array_equal(sfa.semantic_read(np.ones((4, 2), np.float32), 0, np.ones(2, np.float32), 1.0),
                                  [0, 0])
    np.testing.assert_allclose(sfa.fusion(np.ones(2), np.ones(2), np.ones(2)), [2, 2])


def test_errors():
    with pytest.raises(ValueError, match="SfaConfig.gamma"):
        SfaConfig(n_layers=2, gamma=1.0)
    with pytest.raises(ValueError, match="SfaConfig.clip_order"):
        SfaConfig(n_layers=2, clip_order="both")
    with pytest.raises(ValueError, match="SfaConfig.ring"):
        SfaConfig(n_layers=2, ring=0)
    cfg = SfaConfig(n_layers=2)
    state = SfaState.new(cfg, 4)
    with pytest.raises(ValueError, match=r"'x': expected shape \(hidden,\) or \(T, hidden\) with hidden=4"):
        sfa_apply(cfg, state, 0, np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="finite floats"):
        sfa_apply(cfg, state, 0, np.full(4, np.nan, np.float32))
    with pytest.raises(ValueError, match="use sfa_apply"):
        sfa_step(cfg, state, 0, np.zeros((2, 4), np.float32))
