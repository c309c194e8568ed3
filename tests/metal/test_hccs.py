"""Metal HCCS and integer-exp kernels, bit-exact against somatile.model on random and adversarial rows.

The kernels run on the CPU emulator: directly (every thread order), and through both dispatch paths of the
metal:// backend (MLX body-only kernels, PyObjC full kernels) over the emulator's stand-ins.
"""

import numpy as np
import pytest

from somatile.host import metal_backend, metal_emu, metal_kernels
from somatile.model import hccs, intexp

ORDERS = tuple(metal_emu.THREAD_ORDERS)
MODES = [(mode, out) for mode in ("div", "clb") for out in ("uint8", "int16")]


def random_params(rng, heads, cols):
    """Valid (B, S, dmax) per head across the legal range for rows of ``cols``."""
    params = []
    while len(params) < heads:
        b = int(rng.integers(1, hccs.MAX_ROW_MASS // cols + 1))
        s, d = int(rng.integers(0, hccs.S_MAX + 1)), int(rng.integers(0, hccs.DMAX_MAX + 1))
        if b - s * d >= 0 and cols * (b - s * d) >= hccs.MIN_FLOOR_MASS:
            params.append((b, s, d))
    return [list(p) for p in zip(*params)]


def adversarial_rows(cols):
    """Rows that break lazy kernels: constant rows at both int8 ends, a single spike at either end, an
    alternating row, a ramp, and a near-tie."""
    return np.array([
        [0] * cols, [127] * cols, [-128] * cols, [127] + [-128] * (cols - 1), [-128] * (cols - 1) + [127],
        [(-128 if i % 2 else 127) for i in range(cols)], [(i * 37) % 256 - 128 for i in range(cols)],
        [5] * (cols - 1) + [6]], dtype=np.int8)


def run_library(library, family, x3, mask3, shape_words, head_params, out, order, seed=1):
    heads, rows, cols = x3.shape
    result = np.zeros(x3.shape, hccs.OUT_DTYPES[out])
    valid = np.ones(1, np.uint8) if mask3 is None else mask3.astype(np.uint8)
    threads = metal_backend.row_threads(cols)
    library.dispatch(f"{family}_{out}", [x3, valid, np.array(shape_words, np.int32), head_params, result],
                     (threads, heads * rows), (threads, 1), order=order, seed=seed)
    return result


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode,out", MODES)
@pytest.mark.parametrize("cols", [1, 31, 77, 300])
def test_hccs_kernel_random_rows(libraries, rng, order, mode, out, cols):
    x = rng.integers(-128, 128, size=(3, 5, cols)).astype(np.int8)
    mask = rng.random(x.shape) < 0.7
    mask[0, 0] = False  # a fully masked row outputs zeros
    B, S, D = random_params(rng, 3, cols)
    head_params = np.array([B, S, D], np.int32).T.copy()
    for m in (None, mask):
        got = run_library(libraries["hccs"], "hccs", x, m, [cols, 5, hccs.MODE_CODES[mode], m is not None],
                          head_params, out, order)
        assert np.array_equal(got, hccs.hccs_int(x, B, S, D, mode=mode, out=out, mask=m))


@pytest.mark.parametrize("mode,out", MODES)
def test_hccs_kernel_adversarial_rows_and_edge_parameters(libraries, mode, out):
    cols = 33
    x = adversarial_rows(cols)[None]
    edges = [(hccs.MAX_ROW_MASS // cols, 0, 0), (hccs.MAX_ROW_MASS // cols, 7, 127), (8, 0, 127),
             (hccs.MAX_ROW_MASS // cols, 127, 7), (127 * 7 + 8, 127, 7)]
    mask = np.ones(x.shape, bool)
    mask[0, 1] = False
    mask[0, 3, 0] = False
    for B, S, D in edges:
        for m in (None, mask):
            got = run_library(libraries["hccs"], "hccs", x, m, [cols, x.shape[1], hccs.MODE_CODES[mode],
                                                                m is not None],
                              np.array([[B, S, D]], np.int32), out, "random", seed=B)
            assert np.array_equal(got, hccs.hccs_int(x, B, S, D, mode=mode, out=out, mask=m)), (B, S, D)


@pytest.mark.parametrize("mode,out", MODES)
def test_hccs_seed_single_c_form_with_zero_floor(libraries, mode, out):
    """The seed's S=1, B=dmax=c: reciprocals up to 255 << 15 (with allow_zero_floor) stay exact in int32."""
    x = np.concatenate([adversarial_rows(64), np.random.default_rng(5).integers(-128, 128, (8, 64))]).astype(np.int8)
    B, S, D = hccs.seed_params(100)
    got = run_library(libraries["hccs"], "hccs", x[None], None, [64, x.shape[0], hccs.MODE_CODES[mode], 0],
                      np.array([[B, S, D]], np.int32), out, "reverse")
    assert np.array_equal(got[0], hccs.hccs_int(x, B, S, D, mode=mode, out=out, allow_zero_floor=True))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("out", ["uint8", "int16"])
@pytest.mark.parametrize("cols", [1, 45, 300])
def test_intexp_kernel_random_and_adversarial_rows(libraries, rng, order, out, cols):
    x = np.concatenate([rng.integers(-128, 128, size=(6, cols)), adversarial_rows(cols)]).astype(np.int8)
    x = np.stack([x, x[::-1]])
    mult = [intexp.EXP_MULT_MIN, intexp.EXP_MULT_MAX]
    mask = rng.random(x.shape) < 0.6
    mask[1, 2] = False
    for m in (None, mask):
        got = run_library(libraries["intexp"], "intexp", x, m, [cols, x.shape[1], m is not None],
                          np.array(mult, np.int32), out, order)
        assert np.array_equal(got, intexp.intexp_softmax(x, mult, out=out, mask=m))


@pytest.mark.parametrize("mode,out", MODES)
def test_backend_hccs_through_both_dispatch_paths(runner, rng, mode, out):
    x = rng.integers(-128, 128, size=(2, 9, 70)).astype(np.int8)
    mask = rng.random(x.shape) < 0.8
    B, S, D = random_params(rng, 2, 70)
    for m in (None, mask):
        expected = hccs.hccs_int(x, B, S, D, mode=mode, out=out, mask=m)
        assert np.array_equal(metal_backend.hccs(runner, x, B, S, D, mode=mode, out=out, mask=m), expected)
    one_head = metal_backend.hccs(runner, x[0], B[0], S[0], D[0], mode=mode, out=out)
    assert np.array_equal(one_head, hccs.hccs_int(x[0], B[0], S[0], D[0], mode=mode, out=out))


@pytest.mark.parametrize("out", ["uint8", "int16"])
def test_backend_intexp_through_both_dispatch_paths(runner, rng, out):
    x = rng.integers(-128, 128, size=(2, 7, 90)).astype(np.int8)
    mask = rng.random(x.shape) < 0.8
    for m in (None, mask):
        expected = intexp.intexp_softmax(x, [900, 47000], out=out, mask=m)
        assert np.array_equal(metal_backend.intexp(runner, x, [900, 47000], out=out, mask=m), expected)


def test_backend_rejects_bad_input_with_the_models_errors(runner):
    x = np.zeros((4, 8), np.int8)
    with pytest.raises(TypeError, match="x: expected dtype int8"):
        metal_backend.hccs(runner, x.astype(np.int16), 100, 1, 10)
    with pytest.raises(ValueError, match="cols\\*B"):
        metal_backend.hccs(runner, x, 32767, 1, 10)
    with pytest.raises(ValueError, match="mode: expected one of"):
        metal_backend.hccs(runner, x, 100, 1, 10, mode="fast")
    with pytest.raises(ValueError, match="mult: head 0 M = 0"):
        metal_backend.intexp(runner, x, 0)


@pytest.mark.parametrize("reduction", ["threadgroup_max", "threadgroup_sum"])
def test_removing_a_reduction_barrier_breaks_the_kernel(rng, reduction):
    """The production reductions' first barrier is load-bearing, and the emulator shows it: without it a
    simdgroup reads the other simdgroups' slots before they are written (marker bytes chosen so that the
    stale value wins a max: 0x5A5A5A5A)."""
    source = metal_kernels.library_source("hccs")
    start = source.index(f"T {reduction}(")
    barrier = "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
    cut = source.index(barrier, start)
    broken = metal_emu.compile_library(source[:cut] + source[cut + len(barrier):])
    x = rng.integers(-128, 128, size=(1, 6, 300)).astype(np.int8)
    expected = hccs.hccs_int(x, 100, 1, 40)
    for order, marker in (("forward", 0x5A), ("reverse", 0x5A)):
        got = np.zeros(x.shape, np.uint8)
        threads = metal_backend.row_threads(300)
        broken.dispatch("hccs_uint8", [x, np.ones(1, np.uint8), np.array([300, 6, 0, 0], np.int32),
                                       np.array([[100, 1, 40]], np.int32), got], (threads, 6), (threads, 1),
                        order=order, marker=marker)
        assert not np.array_equal(got, expected), order
