"""The Metal kernels of the "wide" integer profile against somatile.model, bit for bit: the row normaliser
(host/metal/wide.metal) against wide.wide_softmax's numpy spec, and the wide Soma decode step against
soma.prefill / decode_step (numba fast path and numpy spec), outputs and the whole state.

The kernels run on the CPU emulator: directly in every thread order, and through both dispatch paths of the
metal:// backend (MLX body-only kernels, PyObjC full kernels) over the emulator's stand-ins.
"""

import numpy as np
import pytest

from somatile.host import metal_backend, metal_emu, metal_kernels
from somatile.model import soma, wide

from .test_soma import (assert_decode_steps_continue_a_loaded_state, assert_full_state_matches_model,
                        assert_prefill_matches_model, assert_same_state, tokens)

ORDERS = tuple(metal_emu.THREAD_ORDERS)
NORMALISERS = tuple(wide.NORM_CODES)
LOW, HIGH = wide.LOGIT_MIN, wide.LOGIT_MAX


def random_params(rng, normaliser, heads):
    """Per-head (B, S, dmax) across the legal range of ``normaliser`` (check_params' rules)."""
    if normaliser == "exp":
        return [0] * heads, [0] * heads, [0] * heads
    S = rng.integers(0, wide.S_MAX + 1, heads)
    dmax = rng.integers(0, wide.DMAX_MAX + 1, heads)
    if normaliser == "pwl2":
        return [0] * heads, S.tolist(), dmax.tolist()
    floor = (S * dmax) >> wide.S_FRAC_BITS                      # B >= floor keeps every weight >= 0
    dmax = np.where(floor > wide.B_MAX, (wide.B_MAX << wide.S_FRAC_BITS) // np.maximum(S, 1), dmax)
    floor = (S * dmax) >> wide.S_FRAC_BITS
    B = rng.integers(np.maximum(floor, wide.B_MIN), wide.B_MAX + 1)
    return B.tolist(), S.tolist(), dmax.tolist()


def adversarial_rows(cols):
    """Rows at the int16 ends (the largest distance 65535, a max of -32768), a spike at either end, an
    alternating row, a ramp over the whole range, a near-tie and exp's zero octave (distances >= 16 bits)."""
    i = np.arange(cols)
    return np.array([
        np.zeros(cols), np.full(cols, HIGH), np.full(cols, LOW), np.where(i == 0, HIGH, LOW),
        np.where(i == cols - 1, HIGH, LOW), np.where(i % 2, LOW, HIGH), (i * 4099) % 65536 + LOW,
        np.where(i == cols - 1, 6, 5), np.where(i == 0, 0, -(16 << wide.LOGIT_FRAC_BITS)),
    ], dtype=np.int64).astype(np.int16)


def adversarial_mask(x):
    """Every row masked in some way, and rows with nothing or one element valid (that one at an int16 end)."""
    mask = np.ones(x.shape, bool)
    mask[..., 1::3] = False
    mask[..., 0, :] = False                                      # a fully masked row outputs zeros
    mask[..., 1, :] = False
    mask[..., 1, -1] = True                                      # one valid element: p = 32768
    mask[..., 2, :] = False
    mask[..., 2, 0] = True                                       # one valid element at -32768
    return mask


def run_library(library, x3, mask3, normaliser, B, S, dmax, order, seed=1):
    heads, rows, cols = x3.shape
    result = np.zeros(x3.shape, np.uint16)
    valid = np.ones(1, np.uint8) if mask3 is None else mask3.astype(np.uint8)
    threads = metal_backend.row_threads(cols)
    shape = np.array([cols, rows, wide.NORM_CODES[normaliser], mask3 is not None], np.int32)
    library.dispatch("wide_softmax", [x3, valid, shape, np.array([B, S, dmax], np.int32).T.copy(), result],
                     (threads, heads * rows), (threads, 1), order=order, seed=seed)
    return result


def assert_kernel_matches_spec(library, x, mask, normaliser, B, S, dmax, order, seed=1):
    expected = wide.wide_softmax(x, normaliser, B, S, dmax, mask=mask, impl="numpy")
    got = run_library(library, x, mask, normaliser, B, S, dmax, order, seed)
    assert np.array_equal(got, expected), (normaliser, B, S, dmax)
    return got


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize("cols", [1, 31, 77, 300])
def test_wide_kernel_random_rows(libraries, rng, order, normaliser, cols):
    x = rng.integers(LOW, HIGH + 1, size=(3, 5, cols)).astype(np.int16)
    x[1] //= 64                                                  # narrow rows: ties and unclipped distances
    mask = rng.random(x.shape) < 0.7
    mask[0, 0] = False
    B, S, dmax = random_params(rng, normaliser, 3)
    for m in (None, mask):
        assert_kernel_matches_spec(libraries["wide"], x, m, normaliser, B, S, dmax, order, seed=cols)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("normaliser", NORMALISERS)
def test_wide_kernel_adversarial_rows_and_edge_parameters(libraries, order, normaliser):
    """Int16 extremes, masked and single-element rows (output exactly 32768, the bound of the min) and
    parameters at their ends: S * dmax up to 65535^2 (all 32 bits of the product), B = 32768."""
    x = adversarial_rows(45)[None]
    mask = adversarial_mask(x)
    edges = {"exp": [(0, 0, 0)],
             "hccs": [(wide.B_MAX, 0, 0), (wide.B_MAX, wide.S_MAX, wide.B_MAX * 256 // wide.S_MAX),
                      (wide.B_MIN, 0, wide.DMAX_MAX), (wide.B_MAX, 1, wide.DMAX_MAX), (200, 256, 200)],
             "pwl2": [(0, 256, wide.DMAX_MAX), (0, wide.S_MAX, wide.DMAX_MAX), (0, 0, 0), (0, 1, 300),
                      (0, 4096, 1000)]}[normaliser]
    for B, S, dmax in edges:
        for m in (None, mask):
            got = assert_kernel_matches_spec(libraries["wide"], x, m, normaliser, B, S, dmax, order)
            if m is not None:
                assert not got[0, 0].any() and got[0, 1, -1] == wide.PROB_ONE and got[0, 2, 0] == wide.PROB_ONE


@pytest.mark.parametrize("normaliser", NORMALISERS)
def test_wide_kernel_longest_rows(libraries, rng, normaliser):
    """Rows of MAX_COLS = 65535 elements: an all-equal row sums to 65535 * 32768 = 2^31 - 2^15 (the int32
    row sum at its end) and a random row; 256 threads stride each row."""
    cols = wide.MAX_COLS
    x = np.stack([np.full(cols, HIGH), rng.integers(LOW, HIGH + 1, cols), rng.integers(-300, 300, cols)])
    x = x.astype(np.int16)[None]
    mask = rng.random(x.shape) < 0.9
    B, S, dmax = {"exp": (0, 0, 0), "hccs": (wide.B_MAX, 0, 0), "pwl2": (0, 256, wide.DMAX_MAX)}[normaliser]
    for m in (None, mask):
        assert_kernel_matches_spec(libraries["wide"], x, m, normaliser, [B], [S], [dmax], "random", seed=3)


@pytest.mark.parametrize("normaliser", NORMALISERS)
def test_backend_wide_softmax_through_both_dispatch_paths(runner, rng, normaliser):
    x = rng.integers(LOW, HIGH + 1, size=(2, 9, 70)).astype(np.int16)
    x[0] //= 128
    mask = rng.random(x.shape) < 0.8
    B, S, dmax = random_params(rng, normaliser, 2)
    for m in (None, mask):
        expected = wide.wide_softmax(x, normaliser, B, S, dmax, mask=m, impl="numpy")
        assert np.array_equal(metal_backend.wide_softmax(runner, x, normaliser, B, S, dmax, mask=m), expected)
    one_head = metal_backend.wide_softmax(runner, x[0], normaliser, B[0], S[0], dmax[0])
    assert np.array_equal(one_head, wide.wide_softmax(x[0], normaliser, B[0], S[0], dmax[0], impl="numpy"))
    assert np.array_equal(metal_backend.wide_softmax(runner, x[1]), wide.wide_softmax(x[1], impl="numpy"))


def test_backend_wide_softmax_rejects_bad_input_with_the_models_errors(runner):
    x = np.zeros((4, 8), np.int16)
    with pytest.raises(TypeError, match="x: expected dtype int16"):
        metal_backend.wide_softmax(runner, x.astype(np.int8))
    with pytest.raises(ValueError, match="normaliser: expected one of"):
        metal_backend.wide_softmax(runner, x, "softmax")
    with pytest.raises(ValueError, match="weights never negative"):
        metal_backend.wide_softmax(runner, x, "hccs", 100, 256, 200)
    with pytest.raises(ValueError, match="exceed the int32 row sum"):
        metal_backend.wide_softmax(runner, np.zeros((1, wide.MAX_COLS + 1), np.int16))


GEOMETRY = dict(n_heads=4, n_kv_heads=2, head_dim=16, ring=8)
CONFIGS = {
    "seed_exp": dict(preset="seed", normaliser="exp_int"),
    "default_hccs_sinks_gqa": dict(preset="default", normaliser="hccs_int", sinks=3, alpha=0.25),
    "gated_pwl2": dict(preset="gated_field", normaliser="pwl2_int", sinks=1),
    "keys_field_no_self_pwl2": dict(preset="default", normaliser="pwl2_int", include_self=False,
                                    field_source="keys", alpha=0.5, sinks=2),
    "fallback_hccs_recency": dict(preset="default", normaliser="hccs_int", fallback=(True, False, False, True),
                                  recency=0.3, sinks=2),
    "fallback_pwl2_gated": dict(preset="gated_field", normaliser="pwl2_int", fallback=(False, True, True, False),
                                hccs_S=(256, 700, 40, 65535), hccs_dmax=(65535, 3000, 65535, 800),
                                hccs_B=(0, 0, 0, 0)),
}


def wide_config(name, **extra):
    kw = {**GEOMETRY, **CONFIGS[name], **extra}
    return soma.SomaConfig.preset(kw.pop("preset"), integer=True, profile="wide", **kw)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_wide_decode_matches_model_through_ring_wraparound(runner, rng, name):
    cfg = wide_config(name)
    assert_prefill_matches_model(runner, cfg, *tokens(rng, cfg, 2 * cfg.ring + 5))


@pytest.mark.parametrize("order", ORDERS)
def test_wide_decode_in_every_thread_order_against_the_numpy_spec(rng, order):
    cfg = wide_config("fallback_pwl2_gated", n_heads=6, n_kv_heads=3, head_dim=40, ring=37, sinks=5,
                      fallback=(False, True, False, False, True, False), hccs_S=256, hccs_dmax=65535, hccs_B=0)
    q, k, v = tokens(rng, cfg, 45)
    expected, expected_state = soma.prefill(cfg, q, k, v, impl="numpy")
    runner = metal_backend.make_runner("pyobjc", emulate=True, order=order, seed=4)
    got, state = metal_backend.soma_prefill(runner, cfg, q, k, v)
    assert got.dtype == np.int16 and np.array_equal(got, expected)
    assert_same_state(state, expected_state)


@pytest.mark.parametrize("normaliser", ["exp_int", "hccs_int", "pwl2_int"])
def test_wide_adversarial_tokens_saturate_like_the_model(runner, rng, normaliser):
    """Logits saturating at both int16 ends (large score multiplier; recency 32767 per token drives old
    slots to -32768), outputs saturating at both int16 ends, and all-equal rows."""
    cfg = wide_config("default_hccs_sinks_gqa", normaliser=normaliser, score_mult=32767, score_shift=0,
                      recency_int=32767, out_mult=32767, out_shift=8, alpha_mult=32767, alpha_shift=0)
    T = cfg.slots + 3

    def constant(q, k, v):
        return [np.full((T, h, cfg.head_dim), value, np.int8) for h, value in
                ((cfg.n_heads, q), (cfg.n_kv_heads, k), (cfg.n_kv_heads, v))]

    for q, k, v in (constant(127, -128, 127), constant(-128, -128, -128), constant(5, 5, 5), tokens(rng, cfg, T)):
        assert_prefill_matches_model(runner, cfg, q, k, v)


@pytest.mark.parametrize("normaliser", ["exp_int", "pwl2_int"])
def test_wide_logits_saturate_at_the_int16_minimum_beside_the_max(runner, rng, normaliser):
    """Every score is -128, so the newest slot's logit is rshr(-128 * 32767, 7) = -32767 and one token of
    recency puts every older slot at or past -32768: the row's distances are 0, 1, 1, ... only if the
    kernel saturates at exactly -32768 (a step of 1 is visible through exp, and through pwl2 at S = 65535)."""
    cfg = wide_config("default_hccs_sinks_gqa", normaliser=normaliser, sinks=0, score_mult=32767, score_shift=7,
                      recency_int=1, hccs_B=0, hccs_S=wide.S_MAX, hccs_dmax=wide.DMAX_MAX)
    q, k, v = tokens(rng, cfg, 2 * cfg.ring)
    q[...] = 0
    q[..., 0] = 1
    k[..., 0] = -128
    assert_prefill_matches_model(runner, cfg, q, k, v)


def test_wide_decode_step_continues_a_loaded_state(runner, rng):
    cfg = wide_config("fallback_hccs_recency")
    assert_decode_steps_continue_a_loaded_state(runner, cfg, *tokens(rng, cfg, 14), start=11)


def test_wide_largest_row_the_kernel_holds(runner, rng):
    """sinks + ring = SOMA_MAX_SLOTS slots of head_dim 256 from a loaded full state, a fallback head beside a
    pwl2 head: the kernel's int16 logit and Q15 probability rows used to their end."""
    cfg = soma.SomaConfig.preset("gated_field", integer=True, profile="wide", n_heads=2, n_kv_heads=1,
                                 head_dim=256, sinks=96, ring=metal_kernels.SOMA_MAX_SLOTS - 96,
                                 normaliser="pwl2_int", fallback=(True, False), recency=0.01)
    assert_full_state_matches_model(runner, rng, cfg)
