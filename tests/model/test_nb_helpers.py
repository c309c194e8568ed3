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
def high_halves(a, b, out):
    for i in range(a.shape[0]):
        out[i] = hccs.mulhi_u16(a[i], b[i])


@numba.njit
def high_half(a, b):
    return hccs.mulhi_u16(a, b)


@numba.njit
def high_halves_by(a, b, out):
    for i in range(a.shape[0]):
        out[i] = np.uint8(hccs.mulhi_u16(a[i], b))


@numba.njit
def chunk_reductions(x, start, chunks, dmax):
    m = hccs.chunk_max(x, np.uint64(start), chunks)
    lo = np.int8(max(np.int64(m) - dmax, -128))
    return m, hccs.chunk_distance_sum(x, np.uint64(start), chunks, m, lo)


@numba.njit
def flat_sum_and_bump(a):
    flat = hccs.flat_view(a)
    flat[flat.shape[0] - 1] += 1
    return flat.shape[0], flat.sum()


def test_leading_bit_is_floor_log2():
    values = np.concatenate([np.arange(1, 1 << 16), (1 << np.arange(63)), (1 << np.arange(1, 63)) - 1])
    np.testing.assert_array_equal(leading_bits(values.astype(np.int64)),
                                  [int(v).bit_length() - 1 for v in values.tolist()])


def test_mulhi_u16_is_the_floor_of_the_high_half(rng):
    """LLVM's umul.fix leaves the rounding direction open; the kernels need floor((a * b) / 2^16) exactly, in
    the vector lanes of a loop (element-wise, and by one broadcast factor with the uint8 store of HCCS) and
    in a scalar call: every a against edge factors, and random pairs."""
    a = np.arange(1 << 16, dtype=np.uint16)
    for b in (0, 1, 2, 255, 256, 32767, 32768, 65534, 65535, *rng.integers(0, 1 << 16, 8).tolist()):
        want = (a.astype(np.uint32) * b) >> 16
        got = np.empty(a.shape, np.uint16)
        high_halves(a, np.full(a.shape, b, np.uint16), got)
        np.testing.assert_array_equal(got, want)
        small = np.empty(a.shape, np.uint8)
        high_halves_by(a, np.uint16(b), small)
        np.testing.assert_array_equal(small, want.astype(np.uint8))
    x, y = rng.integers(0, 1 << 16, (2, 1 << 20)).astype(np.uint16)
    got = np.empty(x.shape, np.uint16)
    high_halves(x, y, got)
    np.testing.assert_array_equal(got, (x.astype(np.uint32) * y) >> 16)
    assert high_half(np.uint16(65535), np.uint16(65535)) == 65534
    assert high_half(np.uint16(3), np.uint16(32768)) == 1


def test_chunk_max_and_distance_sum(rng):
    """hccs.chunk_max / chunk_distance_sum against numpy over whole vectors from unaligned starts, on int8
    arrays and on int32 arrays holding int8 values (the Soma step's logit rows), at the int8 edges."""
    lanes = hccs.VECTOR_LANES
    pool = np.array([-128, -127, -1, 0, 1, 126, 127])
    for dtype in (np.int8, np.int32):
        for case in range(40):
            x = rng.integers(-128, 128, 5 * lanes + 3)
            if case % 4 == 1:
                x = rng.choice(pool, x.size)
            elif case % 4 == 2:
                x[:] = rng.choice(pool)                  # all equal
            x = x.astype(dtype)
            start, chunks, dmax = int(rng.integers(0, 4)), int(rng.integers(0, 6)), int(rng.integers(0, 128))
            part = x[start:start + chunks * lanes].astype(np.int64)
            m, dsum = chunk_reductions(x, start, chunks, dmax)
            want_m = part.max() if part.size else -128
            assert m == want_m
            assert dsum == (want_m - np.maximum(part, max(want_m - dmax, -128))).sum()
    x = np.full(4 * lanes, -128, np.int8)
    x[-1] = 127
    assert chunk_reductions(x, 0, 4, 127) == (127, 127 * (4 * lanes - 1) + 0)
    assert chunk_reductions(x, 0, 4, 0) == (127, 0)


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
