"""Integer-exp softmax: numba against the numpy spec, a hand-worked row, the error against float softmax."""

import numba
import numpy as np
import pytest

from somatile.model import intexp
from somatile.model.intexp import exp_mult_from_scale, intexp_softmax, scale_from_exp_mult

OUTS = ("uint8", "int16")
FULL_SCALE = {"uint8": 255, "int16": 32767}


def both(x, mult, **kw):
    fast = intexp_softmax(x, mult, impl="numba", **kw)
    spec = intexp_softmax(x, mult, impl="numpy", **kw)
    assert fast.dtype == spec.dtype and fast.shape == x.shape
    assert np.array_equal(fast, spec), f"numba != numpy spec for {kw}"
    return spec


def exp_relative_error() -> float:
    r = np.arange(intexp.EXP_ONE, dtype=np.int32)
    exact = 2.0 ** (-r / intexp.EXP_ONE)
    return float(np.max(np.abs(intexp.exp2_frac_spec(r) / intexp.EXP_ONE / exact - 1)))


def float_softmax(x, mult, mask=None):
    logits = x * scale_from_exp_mult(mult).reshape(-1, 1, 1)[: x.shape[0] if x.ndim == 3 else 1]
    logits = logits if x.ndim == 3 else logits[0]
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_exp2_fraction_ends_and_monotone():
    r = np.arange(intexp.EXP_ONE, dtype=np.int32)
    e = intexp.exp2_frac_spec(r)
    assert e[0] == intexp.EXP_ONE
    # Continuity across the z step: e(last) >= e(0) >> 1, so E never rises as the distance grows.
    assert e[-1] >= e[0] >> 1
    assert np.all(np.diff(e) <= 0)
    assert exp_relative_error() < 4e-3  # I-BERT's quadratic: max abs error 1.9e-3 on values in [0.5, 1]
    assert (intexp.POLY_B >> 1) ** 2 < 1 << intexp.WIDTHS["square_bits"]


@pytest.mark.parametrize("out", OUTS)
@pytest.mark.parametrize("cols", [1, 3, 16, 63, 257])
def test_random_rows_match_spec(rng, out, cols):
    x = rng.integers(-128, 128, size=(3, 17, cols)).astype(np.int8)
    mult = [int(m) for m in rng.integers(1, 65536, size=3)]
    mask = rng.random(x.shape) < 0.6
    mask[2, :4] = False
    both(x, mult, out=out)
    both(x, mult, out=out, mask=mask)


@pytest.mark.parametrize("out", OUTS)
def test_adversarial_rows_match_spec(out):
    cols = 45
    rows = np.array([[0] * cols, [127] * cols, [-128] * cols, [127] + [-128] * (cols - 1),
                     [(-128 if i % 3 else 127) for i in range(cols)], list(range(-128, -128 + cols))], np.int8)
    mask = np.ones(rows.shape, bool)
    mask[1] = False
    mask[3, 0] = False
    for mult in (1, 2, 1000, 32768, 65535):
        both(rows, mult, out=out)
        both(rows, mult, out=out, mask=mask)


def test_hand_worked_row():
    # M = 2**15: one int8 step is one halving (scale ln 2). E = [32768, 16384, 8192], total 57344, leading
    # bit 15 -> pre-shift 1 -> total 28672, inv = floor((255 << 15) / 28672) = 291.
    x = np.array([[0, -1, -2]], np.int8)
    assert both(x, 32768).tolist() == [[16384 * 291 >> 15, 8192 * 291 >> 15, 4096 * 291 >> 15]] == [[145, 72, 36]]


@pytest.mark.parametrize("out", OUTS)
def test_error_against_float_softmax(rng, out):
    """Measured (docs/numerics.md): max error 1.4 LSB for uint8 (output floor plus the exponential's 0.39 %
    relative error), 31 LSB = 0.95e-3 for int16 (dominated by the exponential). The tolerances, 2 LSB and
    1.5e-3, leave a margin over those figures that a broken step would exceed."""
    full = FULL_SCALE[out]
    bound = 2 / 255 if out == "uint8" else 1.5e-3
    for scale in (0.01, 0.1, 0.5, 1.3):
        for cols in (4, 64, 512):
            x = np.clip(rng.normal(0, 40, size=(60, cols)), -128, 127).astype(np.int8)
            mult = int(exp_mult_from_scale(scale)[0])
            err = np.abs(both(x, mult, out=out) / full - float_softmax(x, np.array([mult])))
            assert err.max() < bound, (scale, cols, err.max())


def test_rows_sum_to_at_most_one_and_mask_semantics(rng):
    x = rng.integers(-128, 128, size=(2, 50, 30)).astype(np.int8)
    mask = rng.random(x.shape) < 0.5
    mask[0, 0] = False
    y = both(x, [5000, 40000], mask=mask).astype(int)
    sums = y.sum(axis=-1)
    assert sums.max() <= 255 and sums[1].min() >= 255 - 30 - 1
    assert not y[~mask].any() and not y[0, 0].any()
    top = np.where(mask, x.astype(int), -999).argmax(axis=-1)
    rows_with_valid = mask.any(axis=-1)
    assert np.all(np.take_along_axis(y, top[..., None], -1)[..., 0][rows_with_valid] == y.max(-1)[rows_with_valid])


def test_row_kernel_callable_from_njit(rng):
    @numba.njit
    def caller(x, mult, out):
        for r in range(x.shape[0]):
            intexp.intexp_row(x[r], np.empty(0, np.bool_), mult, intexp.OUT_UINT8, out[r])

    x = rng.integers(-128, 128, size=(5, 33)).astype(np.int8)
    out = np.zeros(x.shape, np.int32)
    caller(x, 7000, out)
    assert np.array_equal(out, intexp_softmax(x, 7000))


@pytest.mark.parametrize("out", ["uint8", "int16"])
def test_row_kernel_with_masks_matches_spec(rng, out):
    """Both ways of intexp_rows2: E recomputed (intexp_row, no scratch) and E stored once (a scratch row,
    as intexp_softmax runs it), against the numpy spec with masks and a fully masked row."""
    x = rng.integers(-128, 128, size=(7, 45)).astype(np.int8)
    mask = rng.random(x.shape) < 0.6
    mask[2] = False
    want = intexp_softmax(x, 5000, out=out, mask=mask, impl="numpy")
    code = intexp.OUT_CODES[out]
    recomputed = np.full(x.shape, -1, np.int64)
    for r in range(x.shape[0]):
        intexp.intexp_row(x[r], mask[r], 5000, code, recomputed[r])
    stored = np.full(x.shape, -1, np.int64)
    intexp.intexp_rows2(x, mask, 5000, code, stored, np.empty(x.shape[1], np.int32))
    assert np.array_equal(recomputed, want) and np.array_equal(stored, want)


def test_scale_conversion_and_errors():
    mult = exp_mult_from_scale([0.1, 1.0])
    assert np.allclose(scale_from_exp_mult(mult), [0.1, 1.0], rtol=1e-4)  # one part in M of rounding
    with pytest.raises(ValueError, match="head 0 scale 2 gives M = 94548"):
        exp_mult_from_scale(2.0)
    with pytest.raises(ValueError, match="finite positive"):
        exp_mult_from_scale([0.1, np.nan])
    x = np.zeros((2, 3, 4), np.int8)
    with pytest.raises(ValueError, match="mult: head 1 M = 0 is outside"):
        intexp_softmax(x, [5, 0])
    with pytest.raises(TypeError, match="x: expected dtype int8"):
        intexp_softmax(x.astype(np.int16), 5)
    with pytest.raises(ValueError, match="rows are empty"):
        intexp_softmax(np.zeros((2, 0), np.int8), 5)


@pytest.mark.parametrize("out", OUTS)
def test_every_distance_and_shift_matches_spec(out):
    """Every distance 0..255 in one row, at scales where the int32 shifts of the numba kernel run from 0 to
    past the zero shift (z >= 16), and a row whose masked elements lie above the valid max."""
    row = np.arange(-128, 128, dtype=np.int8)
    rows = np.stack([row, row[::-1], np.roll(row, 77)])
    mask = np.ones(rows.shape, bool)
    mask[2, rows[2] > 0] = False
    for mult in (1, 129, 2048, 4095, 4096, 30000, 65535):
        both(rows, mult, out=out)
        both(rows, mult, out=out, mask=mask)
