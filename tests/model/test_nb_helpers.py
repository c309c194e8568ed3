"""The numba helpers the row kernels share (hccs.leading_bit, hccs.flat_view) and the row entry points on
rows that are not contiguous, against numpy."""

import numba
import numpy as np

from somatile.model import hccs, intexp


@numba.njit
def leading_bits(values):
    out = np.empty(values.shape[0], np.int64)
    for i in range(values.shape[0]):
        out[i] = hccs.leading_bit(values[i])
    return out


@numba.njit
def flat_sum_and_bump(a):
    flat = hccs.flat_view(a)
    flat[flat.shape[0] - 1] += 1
    return flat.shape[0], flat.sum()


def test_leading_bit_is_floor_log2():
    values = np.concatenate([np.arange(1, 1 << 16), (1 << np.arange(63)), (1 << np.arange(1, 63)) - 1])
    np.testing.assert_array_equal(leading_bits(values.astype(np.int64)),
                                  [int(v).bit_length() - 1 for v in values.tolist()])


def test_flat_view_is_a_view_in_c_order(rng):
    a = rng.integers(-100, 100, (3, 4, 5)).astype(np.int32)
    before = a.copy()
    size, total = flat_sum_and_bump(a)
    assert (size, total) == (a.size, int(before.sum()) + 1)
    assert a[-1, -1, -1] == before[-1, -1, -1] + 1   # the last element in C order, written through the view
    assert np.array_equal(a.reshape(-1)[:-1], before.reshape(-1)[:-1])


@numba.njit
def strided_rows(x, mask, B, S, D, mode, mult, out_h, out_e):
    for r in range(x.shape[1]):
        hccs.hccs_row(x[:, r], mask[:, r], B, S, D, mode, hccs.OUT_UINT8, out_h[:, r])
        intexp.intexp_row(x[:, r], mask[:, r], mult, intexp.OUT_UINT8, out_e[:, r])


def test_row_kernels_on_strided_rows(rng):
    """Columns of a C array as rows: the entry points copy them contiguous and write through the strides."""
    x = rng.integers(-128, 128, (40, 12)).astype(np.int8)
    mask = rng.random(x.shape) < 0.8
    B, S, D = 40, 2, 12
    for mode in ("div", "clb"):
        out_h, out_e = np.zeros(x.shape, np.int32), np.zeros(x.shape, np.int32)
        strided_rows(x, mask, B, S, D, hccs.MODE_CODES[mode], 3000, out_h, out_e)
        np.testing.assert_array_equal(out_h.T, hccs.hccs_int(x.T.copy(), B, S, D, mode=mode, mask=mask.T.copy(),
                                                              impl="numpy"))
        np.testing.assert_array_equal(out_e.T, intexp.intexp_softmax(x.T.copy(), 3000, mask=mask.T.copy(),
                                                                     impl="numpy"))
