"""HCCS integer kernel: numba fast path against the numpy spec, hand-worked rows, parameter rules, bad input."""

import numba
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from somatile.model import hccs
from somatile.model.hccs import hccs_int

MODES = [(mode, out) for mode in ("div", "clb") for out in ("uint8", "int16")]


def both(x, B, S, dmax, **kw):
    fast = hccs_int(x, B, S, dmax, impl="numba", **kw)
    spec = hccs_int(x, B, S, dmax, impl="numpy", **kw)
    assert fast.dtype == spec.dtype == np.dtype(kw.get("out", "uint8"))
    assert fast.shape == x.shape
    assert np.array_equal(fast, spec), f"numba != numpy spec for {kw}"
    return spec


def random_params(rng, heads, cols):
    """Valid (B, S, dmax) per head, drawn across the whole legal range for this row length."""
    B, S, D = [], [], []
    while len(B) < heads:
        b = int(rng.integers(1, hccs.MAX_ROW_MASS // cols + 1))
        s = int(rng.integers(0, hccs.S_MAX + 1))
        d = int(rng.integers(0, hccs.DMAX_MAX + 1))
        if b - s * d >= 0 and cols * (b - s * d) >= hccs.MIN_FLOOR_MASS:
            B.append(b), S.append(s), D.append(d)
    return B, S, D


@pytest.mark.parametrize("mode,out", MODES)
@pytest.mark.parametrize("cols", [1, 2, 7, 31, 64, 127, 129])
def test_random_rows_match_spec(rng, mode, out, cols):
    x = rng.integers(-128, 128, size=(4, 23, cols)).astype(np.int8)
    B, S, D = random_params(rng, 4, cols)
    mask = rng.random(x.shape) < 0.7
    mask[0, :3] = False
    both(x, B, S, D, mode=mode, out=out)
    both(x, B, S, D, mode=mode, out=out, mask=mask)


@pytest.mark.parametrize("mode,out", MODES)
@pytest.mark.parametrize("cols", [33, hccs.VECTOR_LANES, 2 * hccs.VECTOR_LANES + 5])
def test_adversarial_rows_match_spec(mode, out, cols):
    rows = np.array([
        [0] * cols, [127] * cols, [-128] * cols,
        [127] + [-128] * (cols - 1), [-128] * (cols - 1) + [127],
        [(-128 if i % 2 else 127) for i in range(cols)],
        list(range(-128, -128 + cols)), [5] * (cols - 1) + [6],
    ], dtype=np.int8)
    edges = [(hccs.MAX_ROW_MASS // cols, 0, 0), (hccs.MAX_ROW_MASS // cols, 7, 127),
             (8, 0, 127), (hccs.MAX_ROW_MASS // cols, 127, 7), (127 * 7 + 8, 127, 7)]
    for B, S, D in edges:
        if cols * B > hccs.MAX_ROW_MASS or cols * (B - S * D) < hccs.MIN_FLOOR_MASS:
            continue                        # (127 * 7 + 8, 127, 7) fits rows of 36 at most
        both(rows, B, S, D, mode=mode, out=out)
        mask = np.ones(rows.shape, bool)
        mask[1] = False
        mask[3, 0] = False
        mask[4, :-1] = False
        both(rows, B, S, D, mode=mode, out=out, mask=mask)


@pytest.mark.parametrize("mode,out", MODES)
def test_single_c_form_with_allow_zero_floor(rng, mode, out):
    x = rng.integers(-128, 128, size=(3, 40, 17)).astype(np.int8)
    for c in (1, 4, 12, 127):
        B, S, D = hccs.seed_params(c)
        with pytest.raises(ValueError, match="floor mass"):
            hccs_int(x, B, S, D, mode=mode, out=out)
        both(x, B, S, D, mode=mode, out=out, allow_zero_floor=True)


def test_hand_worked_row():
    # m = 3, d = [0, 2, 5], scores = [200, 180, 150], total 530.
    x = np.array([[3, 1, -5]], np.int8)
    inv = (255 << 15) // 530
    expect = [(s * inv) >> 15 for s in (200, 180, 150)]
    assert expect == [96, 86, 72]
    assert both(x, 200, 10, 5).tolist() == [expect]
    assert both(x, 200, 10, 5, out="int16").tolist() == [[200 * (32767 // 530), 180 * 61, 150 * 61]]
    # clb: k = 9 (512 <= 530 < 1024), inv = 255 << 6; outputs floor(score * 255 / 512).
    assert both(x, 200, 10, 5, mode="clb").tolist() == [[99, 89, 74]]
    assert both(x, 200, 10, 5, mode="clb", out="int16").tolist() == [[200 * 63, 180 * 63, 150 * 63]]


def test_div_rows_sum_below_255_and_clb_rows_are_not_normalised(rng):
    x = rng.integers(-128, 128, size=(200, 64)).astype(np.int8)
    div = both(x, 500, 8, 40).astype(int).sum(axis=-1)
    clb = both(x, 500, 8, 40, mode="clb").astype(int).sum(axis=-1)
    # Each output floors away < 1 and the reciprocal's floor < 1 per row: a div row sums to 254 - cols..255.
    assert div.max() <= 255 and div.min() >= 254 - 64
    assert clb.max() > 300 and clb.min() >= 254 - 64


def test_saturation_in_clb_single_valid_element():
    x = np.array([[10, 20, 30, 40]], np.int8)
    mask = np.array([[False, False, True, False]])
    assert both(x, 300, 1, 10, mode="clb", mask=mask).tolist() == [[0, 0, 255, 0]]
    assert both(x, 300, 1, 10, mode="clb", out="int16", mask=mask).tolist() == [[0, 0, 32767, 0]]
    # div with one valid element: inv = floor((255<<15)/300) -> 300*inv >> 15 = 254.
    assert both(x, 300, 1, 10, mask=mask).tolist() == [[0, 0, 254, 0]]


def test_masked_elements_take_no_part_in_the_max():
    x = np.array([[100, 0, -1]], np.int8)
    mask = np.array([[False, True, True]])
    masked = both(x, 300, 2, 50, mask=mask)
    unmasked_rest = both(np.array([[0, -1]], np.int8), 300, 2, 50)
    assert masked[0, 0] == 0
    assert np.array_equal(masked[0, 1:], unmasked_rest[0])


def test_fully_masked_rows_are_zero(rng):
    x = rng.integers(-128, 128, size=(2, 5, 9)).astype(np.int8)
    mask = np.zeros(x.shape, bool)
    mask[1, 2] = True
    for mode, out in MODES:
        y = both(x, 100, 1, 50, mode=mode, out=out, mask=mask)
        assert not y[0].any() and not y[1, [0, 1, 3, 4]].any() and y[1, 2].any()


def test_float_agreement_within_one_lsb(rng):
    """Integer div/uint8 = floor(255 * score / total) up to the reciprocal's floor: below one LSB + 1/255."""
    x = rng.integers(-128, 128, size=(300, 50)).astype(np.int8)
    B, S, D = 600, 5, 90
    y = both(x, B, S, D).astype(np.float64)
    xi = x.astype(np.float64)
    score = B - S * np.minimum(xi.max(-1, keepdims=True) - xi, D)
    exact = 255.0 * score / score.sum(-1, keepdims=True)
    assert np.all(y <= exact) and np.all(exact - y < 2.0)


def test_per_head_parameters(rng):
    x = rng.integers(-128, 128, size=(3, 10, 20)).astype(np.int8)
    per_head = both(x, [100, 300, 1000], [1, 2, 0], [20, 60, 127])
    for h, params in enumerate([(100, 1, 20), (300, 2, 60), (1000, 0, 127)]):
        assert np.array_equal(per_head[h], hccs_int(x[h], *params))


def test_row_kernel_callable_from_njit(rng):
    @numba.njit
    def caller(x, B, S, D, out):
        total = 0
        for r in range(x.shape[0]):
            total += hccs.hccs_row(x[r], np.empty(0, np.bool_), B, S, D, hccs.MODE_CLB, hccs.OUT_UINT8, out[r])
        return total

    x = rng.integers(-128, 128, size=(6, 40)).astype(np.int8)
    out = np.zeros((6, 40), np.int32)
    caller(x.astype(np.int32), 400, 3, 100, out)
    assert np.array_equal(out, hccs_int(x, 400, 3, 100, mode="clb"))


@pytest.mark.parametrize("mode,out", MODES)
def test_row_kernel_with_masks_matches_spec(rng, mode, out):
    """hccs_row (one row through hccs_rows2, as the Soma step calls it) against the numpy spec with masks,
    fully masked rows and int64 / int32 output rows; the returned total is the spec's row sum."""
    cols = 70
    x = rng.integers(-128, 128, size=(9, cols)).astype(np.int8)
    mask = rng.random(x.shape) < 0.5
    mask[0] = False
    mask[1] = True
    B, S, D = 300, 2, 100
    want = hccs_int(x, B, S, D, mode=mode, out=out, mask=mask, impl="numpy")
    for dtype in (np.int64, np.int32):
        got = np.full(x.shape, -1, dtype)
        totals = [hccs.hccs_row(x[r], mask[r], B, S, D, hccs.MODE_CODES[mode], hccs.OUT_CODES[out], got[r])
                  for r in range(x.shape[0])]
        assert np.array_equal(got, want)
        d = np.minimum(np.where(mask, x, -128).max(-1, keepdims=True).astype(int) - x, D)
        assert totals == list(np.where(mask, B - S * d, 0).sum(-1))


@pytest.mark.parametrize("kwargs,message", [
    (dict(B=0, S=0, dmax=0), "B = 0 is outside"),
    (dict(B=40000, S=0, dmax=0), "B = 40000 is outside"),
    (dict(B=100, S=128, dmax=0), "S = 128 is outside"),
    (dict(B=100, S=1, dmax=200), "dmax = 200 is outside"),
    (dict(B=100, S=2, dmax=60), r"B - S\*dmax = 100 - 2\*60 = -20 < 0"),
    (dict(B=[100, 20], S=1, dmax=10), r"head 1: cols\*\(B - S\*dmax\) = 10\*10 = 100 < 256"),
    (dict(B=4000, S=1, dmax=10), r"cols\*B = 10\*4000 = 40000 > 32767"),
    (dict(B=[100, 200, 300], S=1, dmax=10), "expected one int or 2 per-head values, got 3"),
])
def test_parameter_rules_name_the_head_and_rule(kwargs, message):
    x = np.zeros((2, 3, 10), np.int8)
    with pytest.raises(ValueError, match=message):
        hccs_int(x, **kwargs)


@pytest.mark.parametrize("kwargs,message", [
    (dict(B=0, S=0, dmax=0), "^B = 0 is outside 1..32767$"),
    (dict(B=100, S=128, dmax=0), "^S = 128 is outside 0..127$"),
    (dict(B=100, S=1, dmax=-1), "^dmax = -1 is outside 0..127$"),
    (dict(B=100, S=2, dmax=60), r"^B - S\*dmax = 100 - 2\*60 = -20 < 0; rule B >= S\*dmax"),
    (dict(B=20, S=1, dmax=10), r"^cols\*\(B - S\*dmax\) = 10\*10 = 100 < 256"),
    (dict(B=4000, S=1, dmax=10), r"^cols\*B = 10\*4000 = 40000 > 32767"),
])
def test_one_head_call_checks_the_same_rules(kwargs, message):
    """The shortcut of hccs_int for (R, N) int8 rows and int parameters raises the general path's errors;
    the same integers as numpy ints (general path) raise the same."""
    x = np.zeros((3, 10), np.int8)
    with pytest.raises(ValueError, match=message):
        hccs_int(x, **kwargs)
    with pytest.raises(ValueError, match=message):
        hccs_int(x, **{k: np.int64(v) for k, v in kwargs.items()})
    with pytest.raises(ValueError, match="mode: expected one of"):
        hccs_int(x, **kwargs, mode="exp")


@pytest.mark.parametrize("mode,out", MODES)
def test_one_head_call_matches_the_general_path(rng, mode, out):
    """(R, N) rows with int parameters (the shortcut) against the same rows as one head of (1, R, N), with
    numpy-int parameters, non-contiguous rows, and a zero floor."""
    x = rng.integers(-128, 128, (37, 130)).astype(np.int8)
    want = hccs_int(x[None], [200], [1], [40], mode=mode, out=out)[0]
    got = both(x, 200, 1, 40, mode=mode, out=out)
    assert np.array_equal(got, want)
    assert np.array_equal(hccs_int(x, np.int64(200), 1, 40, mode=mode, out=out), want)
    both(x[:, ::2], 200, 1, 40, mode=mode, out=out)
    both(x[:, :64], 20, 1, 20, mode=mode, out=out, allow_zero_floor=True)
    assert hccs_int(x[:5], 200, 1, 40, mode=mode, out=out).shape == (5, 130)



def test_one_head_call_remembers_only_valid_parameter_sets(rng):
    """The shortcut validates a parameter set once per (mode, out, B, S, dmax, shape, allow_zero_floor): a
    failing set raises on every call, and a remembered set does not let through what differs from it in a
    rule's input (allow_zero_floor, the row length, a bool or numpy B) or in the rows (shape, layout, a
    read-only array)."""
    x = rng.integers(-128, 128, (19, 64)).astype(np.int8)
    for _ in range(2):
        with pytest.raises(ValueError, match="floor mass"):
            hccs_int(x, 20, 1, 20)
    want = hccs_int(x, 20, 1, 20, allow_zero_floor=True, impl="numpy")
    for _ in range(2):
        assert np.array_equal(hccs_int(x, 20, 1, 20, allow_zero_floor=True), want)
    with pytest.raises(ValueError, match="floor mass"):
        hccs_int(x, 20, 1, 20)
    with pytest.raises(ValueError, match=r"cols\*B = 2000\*20 = 40000 > 32767"):
        hccs_int(np.zeros((1, 2000), np.int8), 20, 1, 20, allow_zero_floor=True)
    with pytest.raises(ValueError, match="B: expected integers"):
        hccs_int(x, True, 0, 0)
    assert np.array_equal(hccs_int(x, 1 + 19, 1, 20, allow_zero_floor=True, mode="div", out="uint8"), want)
    for rows in (x[:3], x[::2], x[:, ::-1]):
        both(rows, 20, 1, 20, allow_zero_floor=True)
    frozen = x.copy()
    frozen.flags.writeable = False
    assert np.array_equal(hccs_int(frozen, 20, 1, 20, allow_zero_floor=True), want)
    for _ in range(2):
        with pytest.raises(ValueError, match="mode: expected one of"):
            hccs_int(x, 20, 1, 20, allow_zero_floor=True, mode="exp")
        with pytest.raises(ValueError, match="rows are empty"):
            hccs_int(np.zeros((3, 0), np.int8), 20, 1, 20)

def test_bad_input_is_named():
    ok = np.zeros((3, 10), np.int8)
    with pytest.raises(TypeError, match="x: expected dtype int8, got float32"):
        hccs_int(ok.astype(np.float32), 100, 1, 10)
    with pytest.raises(ValueError, match=r"x: expected shape \(R, N\) or \(H, R, N\)"):
        hccs_int(np.zeros(10, np.int8), 100, 1, 10)
    with pytest.raises(ValueError, match="rows are empty"):
        hccs_int(np.zeros((3, 0), np.int8), 100, 1, 10)
    with pytest.raises(ValueError, match="mask: expected the shape"):
        hccs_int(ok, 100, 1, 10, mask=np.ones((3, 9), bool))
    with pytest.raises(TypeError, match="mask: expected dtype bool"):
        hccs_int(ok, 100, 1, 10, mask=np.ones((3, 10), np.int8))
    with pytest.raises(ValueError, match="mode: expected one of"):
        hccs_int(ok, 100, 1, 10, mode="exp")
    with pytest.raises(ValueError, match="out: expected one of"):
        hccs_int(ok, 100, 1, 10, out="int8")
    with pytest.raises(ValueError, match="impl: expected"):
        hccs_int(ok, 100, 1, 10, impl="c")
    with pytest.raises(ValueError, match="B: expected integers"):
        hccs_int(ok, 100.5, 1, 10)


def test_widths_table_is_consistent():
    w = hccs.WIDTHS
    assert hccs.UINT8_NUMERATOR < 1 << w["inv_bits"]
    assert (hccs.UINT8_NUMERATOR << 1) <= 1 << w["product_bits"]
    assert hccs.B_MAX < 1 << (w["score_bits"] - 1)
    assert hccs.DMAX_MAX * hccs.S_MAX <= hccs.B_MAX
    # clb: k = floor(log2 total) <= floor(log2 MAX_ROW_MASS) = 14 keeps the shift 15 - k non-negative.
    assert hccs.MAX_ROW_MASS.bit_length() - 1 <= hccs.INV_SHIFT


@st.composite
def hccs_cases(draw):
    """Shapes and parameters from hypothesis; values from a seeded generator that favours the int8 edges."""
    cols = draw(st.integers(1, 200))
    rows = draw(st.integers(1, 6))
    gen = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pool = np.array([-128, -127, 0, 1, 126, 127], np.int8)
    x = np.where(gen.random((rows, cols)) < 0.3, gen.choice(pool, (rows, cols)),
                 gen.integers(-128, 128, (rows, cols))).astype(np.int8)
    mask = gen.random((rows, cols)) < draw(st.sampled_from([0.0, 0.3, 0.9, 1.0]))
    b = draw(st.integers(1, hccs.MAX_ROW_MASS // cols))
    d = draw(st.integers(0, hccs.DMAX_MAX))
    zero_floor = draw(st.booleans())
    s_max = min(hccs.S_MAX, b // d if d else hccs.S_MAX)
    if not zero_floor:
        s_max = min(s_max, (b - -(-hccs.MIN_FLOOR_MASS // cols)) // d if d else hccs.S_MAX)
        assume(b * cols >= hccs.MIN_FLOOR_MASS and s_max >= 0)
    s = draw(st.integers(0, s_max))
    return x, mask, b, s, d, zero_floor


@settings(max_examples=150, deadline=None)
@given(hccs_cases(), st.sampled_from(MODES), st.booleans())
def test_property_numba_equals_spec(case, mode_out, use_mask):
    x, mask, b, s, d, zero_floor = case
    mode, out = mode_out
    both(x, b, s, d, mode=mode, out=out, mask=mask if use_mask else None, allow_zero_floor=zero_floor)


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_rows_split_over_threads_give_the_same_bits(rng, threads):
    x = rng.integers(-128, 128, (2, 301, 65)).astype(np.int8)
    mask = rng.random(x.shape) > 0.2
    for mode in ("div", "clb"):
        one = hccs.hccs_int(x, [60, 90], [1, 2], [40, 30], mode=mode, mask=mask)
        assert np.array_equal(hccs.hccs_int(x, [60, 90], [1, 2], [40, 30], mode=mode, mask=mask, threads=threads), one)
    assert np.array_equal(hccs.hccs_int(x[:, :2], 60, 1, 40, threads=threads), hccs.hccs_int(x[:, :2], 60, 1, 40))
    with pytest.raises(ValueError, match="threads: expected a positive integer, got 0"):
        hccs.hccs_int(x, 60, 1, 40, threads=0)


@pytest.mark.parametrize("mode,out", MODES)
@pytest.mark.parametrize("cols", [511, 512, 513, 1100])
def test_lane_width_edges_match_spec(rng, mode, out, cols):
    """The numba kernel's narrow lanes at their limits: distance sums across the uint16 blocks (every
    distance at dmax = 127), a max of -128 with the clip below int8, rows whose few valid elements give a
    reciprocal of 2^16 or more (the int32 fallback), and the largest B of the row-mass rule."""
    b_max = hccs.MAX_ROW_MASS // cols
    rows = np.full((6, cols), -128, np.int8)
    rows[0, 0] = 127                        # every other distance clips at dmax
    rows[2] = rng.integers(-128, 128, cols)
    rows[3, ::3] = 127
    rows[4] = 127
    rows[5] = rng.integers(-128, -120, cols)
    S = max(1, (b_max - 1) // 127)
    for B, S_, D in ((b_max, 0, 0), (b_max, S, 127), (b_max, 1, 1)):
        if cols * (B - S_ * D) < hccs.MIN_FLOOR_MASS:
            continue
        both(rows, B, S_, D, mode=mode, out=out)
        mask = rng.random(rows.shape) < 0.5
        mask[1] = False
        mask[2] = False
        mask[2, [3, cols - 1]] = True       # two valid elements: total far below the floor mass
        mask[3, 5:] = False
        both(rows, B, S_, D, mode=mode, out=out, mask=mask)
    both(rows, 1, 1, 1, mode=mode, out=out, allow_zero_floor=True)
    both(rows, 1, 1, 1, mode=mode, out=out, allow_zero_floor=True, mask=rng.random(rows.shape) < 0.01)


def test_threads_match_single_thread(rng):
    x = rng.integers(-128, 128, size=(2, 37, 64)).astype(np.int8)
    B, S, D = random_params(rng, 2, 64)
    assert np.array_equal(hccs_int(x, B, S, D, threads=3), hccs_int(x, B, S, D, impl="numpy"))
