"""Wide integer profile: the normaliser kernels (numba == numpy spec), hand-worked values, closeness to
softmax, and the Soma decode step in profile "wide" (numba == numpy spec), with its bad-input errors."""

import numpy as np
import pytest

from somatile.model import hccs, wide
from somatile.model.soma import SomaConfig, SomaState, prefill

CASES = [("exp", {}), ("pwl2", dict(S=256, dmax=wide.DMAX_MAX)), ("pwl2", dict(S=[200, 256, 300, 65535],
                                                                              dmax=[100, 3000, 65535, 0])),
         ("hccs", dict(B=32768, S=2048, dmax=4096)), ("hccs", dict(B=[1, 100, 32768, 20000], S=[0, 1, 65535, 5],
                                                                   dmax=[0, 25600, 128, 65535]))]


@pytest.mark.parametrize("normaliser,kw", CASES)
def test_numba_equals_spec(normaliser, kw):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, (4, 200, 96)) * rng.choice([0.1, 1, 10], (4, 200, 1))
    mask = rng.random(logits.shape) > 0.3
    mask[0, :3] = False                     # fully masked rows
    mask[1, 3, :] = False
    mask[1, 3, 7] = True                    # one valid element
    x = wide.logits_from_float(logits, mask)
    x[2, 5] = rng.integers(-32768, 32768, 96)   # the whole int16 range
    spec = wide.wide_softmax(x, normaliser, mask=mask, impl="numpy", **kw)
    fast = wide.wide_softmax(x, normaliser, mask=mask, impl="numba", **kw)
    assert spec.dtype == np.uint16
    assert np.array_equal(fast, spec)
    assert not spec[0, :3].any()
    assert spec[1, 3, 7] == wide.PROB_ONE and spec[1, 3].sum() == wide.PROB_ONE
    sums = spec.sum(axis=-1, dtype=np.int64)[mask.any(axis=-1)]
    # round half up per element: each element is off by at most 1/2 LSB plus the reciprocal's 2^-15
    assert np.all(np.abs(sums - wide.PROB_ONE) <= 96 // 2 + 2)


@pytest.mark.parametrize("normaliser,kw", CASES)
def test_unmasked_rows_and_row_kernel_match_spec(normaliser, kw):
    """The unmasked path of wide_rows2 (E stored once) and wide_row (one row, E recomputed, int32 out) against
    the numpy spec."""
    rng = np.random.default_rng(1)
    x = rng.integers(-32768, 32768, (4, 30, 77)).astype(np.int16) >> rng.integers(0, 12, (4, 30, 1)).astype(np.int16)
    spec = wide.wide_softmax(x, normaliser, impl="numpy", **kw)
    assert np.array_equal(wide.wide_softmax(x, normaliser, impl="numba", **kw), spec)
    B, S, dmax = wide.check_params(normaliser, kw.get("B", 0), kw.get("S", 256), kw.get("dmax", wide.DMAX_MAX), 4)
    mask = rng.random(x.shape) > 0.4
    masked = wide.wide_softmax(x, normaliser, mask=mask, impl="numpy", **kw)
    for h in range(4):
        for r in range(x.shape[1]):
            for valid, want in ((np.empty(0, bool), spec), (mask[h, r], masked)):
                got = np.full(x.shape[-1], -1, np.int32)
                wide.wide_row(x[h, r], valid, wide.NORM_CODES[normaliser], B[h], S[h], dmax[h], got)
                assert np.array_equal(got, want[h, r])


def test_hand_worked_exp_row():
    # t = 0, 256 (one bit), 512, 16*256 (shifted out): E = 32768, 16384, 8192, 0; total 57344
    x = np.array([[1000, 1000 - 256, 1000 - 512, 1000 - 4096]], np.int16)
    E = wide.weights_spec(np.array([0, 256, 512, 4096], np.int64), wide.NORM_EXP, 0, 0, 0)
    assert E.tolist() == [32768, 16384, 8192, 0]
    p = wide.wide_softmax(x, "exp", impl="numpy")
    # k = floor(log2 57344) - 15 = 0; inv = floor(2^31 / 57344) = 37449; p = (E*inv + 2^15) >> 16
    assert p.tolist() == [[(32768 * 37449 + 32768) >> 16, (16384 * 37449 + 32768) >> 16,
                           (8192 * 37449 + 32768) >> 16, 0]]


def test_pwl2_knots_and_continuity():
    t = np.arange(0, 8 * 256, dtype=np.int64)
    E = wide.weights_spec(t, wide.NORM_PWL2, 0, 256, wide.DMAX_MAX)
    assert E[0] == 32768 and E[256] == 16384 and E[64] == wide.PWL2_KNOTS[1]
    assert np.all(np.diff(E) <= 0)                       # never increases with the distance
    exact = 32768 * 2.0 ** (-t / 256)
    # 4 segments per octave: the chord's bow is (ln 2 / 4)^2 / 8 = 0.38 % (the interpolation's floor adds up to
    # 1 LSB of the first octave, 0.003 %); the octave shift's rounding adds 1/2 LSB
    assert np.all(np.abs(E - exact) <= 0.004 * exact + 0.5)


@pytest.mark.parametrize("normaliser", ["exp", "pwl2"])
def test_close_to_softmax(normaliser):
    # Real-model-like rows: std 2.5 nats, a few outliers. The tolerance is the Q15 output's resolution plus
    # the kernel's approximation (pwl2: 0.4 % relative per element, exp: the quadratic's 0.1 %).
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2.5, (1, 500, 256))
    logits[0, :, 0] += 15
    p = wide.wide_softmax(wide.logits_from_float(logits), normaliser, S=256) / wide.PROB_ONE
    ref = hccs.softmax(logits)
    assert np.max(np.abs(p - ref)) < 2e-3
    assert np.mean(0.5 * np.abs(p - ref).sum(-1)) < 4e-3


def test_bad_parameters():
    x = np.zeros((2, 4), np.int16)
    with pytest.raises(ValueError, match="B - \\(\\(S\\*dmax\\) >> 8\\)"):
        wide.wide_softmax(x, "hccs", B=100, S=256, dmax=101)
    with pytest.raises(ValueError, match="S = 70000 is outside 0..65535"):
        wide.wide_softmax(x, "pwl2", S=70000)
    with pytest.raises(ValueError, match="normaliser: expected one of"):
        wide.wide_softmax(x, "softmax")
    with pytest.raises(TypeError, match="expected dtype int16"):
        wide.wide_softmax(x.astype(np.int8), "exp")


@pytest.mark.parametrize("normaliser", ["exp_int", "pwl2_int", "hccs_int"])
@pytest.mark.parametrize("extra", [{}, dict(alpha=0.1, gating="query"),
                                   dict(include_self=False, recency=0.05, alpha=0.2, field_source="keys")])
def test_soma_wide_numba_equals_spec(normaliser, extra):
    rng = np.random.default_rng(1)
    cfg = SomaConfig.preset("default", n_heads=4, n_kv_heads=2, head_dim=16, ring=12, sinks=2, integer=True,
                            profile="wide", normaliser=normaliser, **extra)
    T = 40
    q = rng.integers(-128, 128, (T, 4, 16)).astype(np.int8)
    k = rng.integers(-128, 128, (T, 2, 16)).astype(np.int8)
    v = rng.integers(-128, 128, (T, 2, 16)).astype(np.int8)
    a, sa = prefill(cfg, q, k, v, impl="numpy")
    b, sb = prefill(cfg, q, k, v, impl="numba")
    assert a.dtype == np.int16 and np.array_equal(a, b)
    assert all(np.array_equal(getattr(sa, n), getattr(sb, n)) for n in SomaState.ARRAYS)
    assert np.abs(a).max() > 127          # the int16 output carries bits below the int8 step


def test_profile_errors():
    with pytest.raises(ValueError, match="SomaConfig.profile: expected one of \\('paper', 'wide'\\)"):
        SomaConfig(profile="fast")
    with pytest.raises(ValueError, match="normaliser: expected one of \\('hccs_int', 'exp_int'\\) in profile 'paper'"):
        SomaConfig(normaliser="pwl2_int", integer=True)
    with pytest.raises(ValueError, match="exp_mult: expected integers in \\[1, 65535\\]"):
        SomaConfig.preset("default", integer=True, profile="paper", normaliser="exp_int", exp_mult=70000)
    with pytest.raises(ValueError, match="profile 'wide', hccs_int"):
        SomaConfig(profile="wide", normaliser="hccs_int", hccs_B=10, hccs_S=256, hccs_dmax=11)


def test_soma_wide_fallback_heads():
    """A hybrid: heads 1 and 3 run the integer exp, the others HCCS; numba == spec, and each head's output
    equals the run of its own normaliser on every head."""
    rng = np.random.default_rng(5)
    base = SomaConfig.preset("default", n_heads=4, n_kv_heads=2, head_dim=16, ring=10, sinks=2, integer=True,
                             profile="wide", normaliser="hccs_int")
    hybrid = base.replace(fallback=(False, True, False, True))
    T = 30
    q = rng.integers(-128, 128, (T, 4, 16)).astype(np.int8)
    k = rng.integers(-128, 128, (T, 2, 16)).astype(np.int8)
    v = rng.integers(-128, 128, (T, 2, 16)).astype(np.int8)
    a = prefill(hybrid, q, k, v, impl="numpy")[0]
    assert np.array_equal(a, prefill(hybrid, q, k, v, impl="numba")[0])
    hccs_out = prefill(base, q, k, v)[0]
    exp_out = prefill(base.replace(normaliser="exp_int", hccs_B=None, hccs_S=None, hccs_dmax=None), q, k, v)[0]
    assert np.array_equal(a[:, [0, 2]], hccs_out[:, [0, 2]]) and np.array_equal(a[:, [1, 3]], exp_out[:, [1, 3]])
    assert not np.array_equal(hccs_out[:, 1], exp_out[:, 1])
    with pytest.raises(ValueError, match="SomaConfig.fallback: expected no fallback heads unless profile='wide'"):
        SomaConfig.preset("default", n_heads=2, integer=True, profile="paper", fallback=(True, False))
    with pytest.raises(ValueError, match="SomaConfig.fallback: expected True/False or 4 of them"):
        base.replace(fallback=(True, False))
