"""aie4ml's exact-exp Softmax (model/aie_exp.py): numba against the numpy spec over random and adversarial rows,
a row worked by hand, the polynomial's error, and the constants and KQ rule of aie4ml itself."""

import math

import numpy as np
import pytest

from somatile.model import aie_exp
from somatile.model.aie_exp import aie_exp_softmax, exp_kq_from_scale, exp_term_spec

OUTS = ("uint8", "int16")


def both(x, kq, out):
    fast = aie_exp_softmax(x, kq, out=out, impl="numba")
    spec = aie_exp_softmax(x, kq, out=out, impl="numpy")
    assert fast.dtype == spec.dtype == np.dtype(out) and fast.shape == x.shape
    assert np.array_equal(fast, spec), f"numba != numpy spec (out={out}, kq={kq})"
    return spec


@pytest.mark.parametrize("out", OUTS)
def test_numba_equals_the_spec_on_random_rows_of_every_length_and_step(out):
    rng = np.random.default_rng(29)
    for _ in range(60):
        n = int(rng.integers(1, 300))
        heads = int(rng.integers(1, 4))
        x = rng.integers(-128, 128, (heads, int(rng.integers(1, 20)), n), dtype=np.int8)
        both(x, rng.integers(aie_exp.KQ_MIN, aie_exp.KQ_MAX + 1, heads), out)


def adversarial_rows(n=64):
    """Rows at the edges: flat, one spike over the floor, the full int8 span, every distance once, distances
    on both sides of the octave where the term vanishes."""
    rows = [np.full(n, v) for v in (-128, 0, 127)]
    spike = np.full(n, -128)
    spike[n // 2] = 127
    rows += [spike, np.where(np.arange(n) % 2, 127, -128), np.linspace(127, -128, n).round()]
    rows += [127 - (np.arange(n) * 255 // (n - 1)), np.r_[127, np.full(n - 1, 126)]]
    for kq in (1, 37, 64, 128):
        d = 4096 // kq  # z = d * kq reaches the 16th octave here
        rows.append(np.clip(127 - np.r_[0, d - 1, d, d + 1, np.arange(n - 4)], -128, 127))
    return np.stack(rows).astype(np.int8)


@pytest.mark.parametrize("kq", [1, 2, 23, 37, 64, 127, 128])
@pytest.mark.parametrize("out", OUTS)
def test_numba_equals_the_spec_on_adversarial_rows(out, kq):
    x = adversarial_rows()
    y = both(x, kq, out)
    flat = both(np.full((1, 64), 5, np.int8), kq, out)
    if out == "uint8":  # a flat row: every term 16384, inv = floor(255 * 2^15 / (64 * 16384))
        assert np.all(flat == (16384 * ((255 << 15) // (64 * 16384))) >> 15)
        assert np.all(y.sum(axis=-1, dtype=np.int64) <= 255)
    both(x[:, :1], kq, out)  # one-element rows


def test_a_row_worked_by_hand():
    # x = [0, -1], KQ = 64: z = [0, 64]; for z = 64 (f = 64): (64 * 2811) >> 8 = 702, 702 - 11004 = -10302,
    # (-10302 * 64) >> 8 = floor(-2575.5) = -2576, e = 16384 - 2576 = 13808. Sum 30192,
    # inv = floor(8355840 / 30192) = 276; (16384 * 276) >> 15 = 138, (13808 * 276) >> 15 = 116.
    assert exp_term_spec(np.array([0, 64])).tolist() == [16384, 13808]
    assert both(np.array([[0, -1]], np.int8), 64, "uint8").tolist() == [[138, 116]]
    # int16 output: inv = floor(32767 / 30192) = 1, so the output is the Q14 terms themselves.
    assert both(np.array([[0, -1]], np.int8), 64, "int16").tolist() == [[16384, 13808]]


def test_the_term_halves_per_octave_falls_monotonically_and_vanishes_at_the_16th():
    z = np.arange(0, aie_exp.MAX_DIST * aie_exp.KQ_MAX + 1)
    e = exp_term_spec(z)
    assert e[0] == aie_exp.EXP_C0 == 16384 and np.all(np.diff(e) <= 0)
    octaves = np.arange(16)
    assert np.array_equal(e[octaves * 256], 16384 >> octaves)
    assert np.all(e[16 * 256:] == 0) and e.max() <= 16384
    f = np.arange(256)
    error = np.abs(exp_term_spec(f) - 2.0 ** (-f / 256) * 16384)
    assert error.max() < 33  # the second-order fit: under 0.2 % of full scale over the fractional octave


def test_kq_follows_the_scale_and_names_the_first_bad_head():
    assert exp_kq_from_scale([0.1]).tolist() == [round(0.1 * math.log2(math.e) * 256)] == [37]
    kq = np.arange(aie_exp.KQ_MIN, aie_exp.KQ_MAX + 1)
    assert np.array_equal(exp_kq_from_scale(aie_exp.scale_from_exp_kq(kq)), kq)
    with pytest.raises(ValueError, match=r"head 2 scale 0\.5 gives KQ = 185, outside 1\.\.128"):
        exp_kq_from_scale([0.1, 0.9, 0.5], heads=[True, False, True])
    with pytest.raises(ValueError, match="head 0 scale 0.001 gives KQ = 0"):
        exp_kq_from_scale([0.001])
    with pytest.raises(ValueError, match="kq: head 1 KQ = 129 is outside 1..128"):
        aie_exp_softmax(np.zeros((2, 1, 8), np.int8), [5, 129])


def test_constants_and_the_kq_rule_are_aie4mls():
    pytest.importorskip("aie4ml", reason="the aie extra (pip install 'somatile[aie]') is not installed")
    from importlib.resources import files

    from aie4ml.op_impls.families.softmax import softmax as aie4ml_softmax

    template = (files("aie4ml") / "templates/firmware/variants/softmax/parameters.h.jinja").read_text()
    for name, value in (("EXP_A2", aie_exp.EXP_A2), ("EXP_B1", aie_exp.EXP_B1), ("EXP_C0", aie_exp.EXP_C0)):
        assert f"static constexpr int16_t {name} = {value};" in template
    assert f"static constexpr int     EXP_ZF = {aie_exp.EXP_ZF};" in template
    assert "ROUNDING   = aie::rounding_mode::floor;" in template and "saturation_mode::saturate;" in template
    assert aie4ml_softmax.EXP_ZF == aie_exp.EXP_ZF and aie4ml_softmax.EXP_KQ_MAX == aie_exp.KQ_MAX
    scales = np.geomspace(0.0015, 0.34, 2000)
    theirs = [aie4ml_softmax._exp_kq(s) for s in scales]
    assert np.array_equal(exp_kq_from_scale(scales), theirs)
