"""The vector row kernels of unmasked uint8 HCCS rows: hccs.rows_uint8 (groups of four rows and single rows)
and hccs.short_rows_uint8 (groups of eight rows of 64..128 elements, software-pipelined, AVX-512 VBMI only),
row lengths around the 64-lane chunks, row counts around the groups, both output tables (dmax below 64 and
from 64), rows whose reciprocal needs the general path, and the portable version compiled for a target
without AVX-512 VBMI."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somatile.model import hccs


def legal_params(gen, cols):
    while True:
        b = int(gen.integers(1, hccs.MAX_ROW_MASS // cols + 1))
        s, d = int(gen.integers(0, hccs.S_MAX + 1)), int(gen.integers(0, hccs.DMAX_MAX + 1))
        if b - s * d >= 0 and cols * (b - s * d) >= hccs.MIN_FLOOR_MASS:
            return b, s, d


def check(x, B, S, D, **kw):
    for mode in ("div", "clb"):
        fast = hccs.hccs_int(x, B, S, D, mode=mode, **kw)
        assert np.array_equal(fast, hccs.hccs_int(x, B, S, D, mode=mode, impl="numpy", **kw)), (mode, B, S, D)


@settings(max_examples=120, deadline=None)
@given(st.integers(hccs.VECTOR_LANES, 400), st.integers(1, 11), st.integers(0, 2**32 - 1))
def test_property_rows_match_spec(cols, rows, seed):
    """Any row length from one chunk up, any number of rows (groups of four and the rest)."""
    gen = np.random.default_rng(seed)
    pool = np.array([-128, -127, 0, 1, 126, 127], np.int8)
    x = np.where(gen.random((rows, cols)) < 0.3, gen.choice(pool, (rows, cols)),
                 gen.integers(-128, 128, (rows, cols))).astype(np.int8)
    check(x, *legal_params(gen, cols))


@pytest.mark.parametrize("cols", [64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 320, 511, 512, 513])
def test_chunk_edges_and_extreme_rows(rng, cols):
    rows = np.array([[-128] * cols, [127] * cols, [127] + [-128] * (cols - 1), [-128] * (cols - 1) + [127],
                     rng.integers(-128, 128, cols), rng.integers(-128, -120, cols), rng.integers(120, 128, cols),
                     [(-128 if i % 2 else 127) for i in range(cols)], rng.integers(-128, 128, cols)], np.int8)
    b_max = hccs.MAX_ROW_MASS // cols
    for B, S, D in ((b_max, 0, 0), (b_max, max(1, (b_max - 2) // 127), 127), (b_max, 1, 1), legal_params(rng, cols)):
        if cols * (B - S * D) >= hccs.MIN_FLOOR_MASS:
            check(rows, B, S, D)
            check(np.stack([rows, rows[::-1]]), [B, B], [S, 0], [D, D])


def test_rows_with_a_wide_reciprocal_among_a_group(rng):
    """allow_zero_floor: totals below WIDE_INV_TOTAL (a reciprocal of 2^16 or more) in any slot of a group."""
    cols = 70
    x = rng.integers(-128, 128, (9, cols)).astype(np.int8)
    x[[1, 4, 8]] = -128
    x[[1, 4, 8], [3, 0, cols - 1]] = 127    # one element at the max, every other at distance 255 -> dmax
    check(x, 1, 1, 1, allow_zero_floor=True)
    check(x, 3, 1, 3, allow_zero_floor=True)


@settings(max_examples=120, deadline=None)
@given(st.integers(hccs.VECTOR_LANES, 2 * hccs.VECTOR_LANES), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_property_short_rows_match_spec(cols, rows, seed):
    """Rows of one or two chunks: any number of groups of eight (the pipelined loop's first, middle and last
    group), then groups of four and single rows; a Dmax on either side of the 64-entry table."""
    gen = np.random.default_rng(seed)
    pool = np.array([-128, -127, 0, 1, 126, 127], np.int8)
    x = np.where(gen.random((rows, cols)) < 0.3, gen.choice(pool, (rows, cols)),
                 gen.integers(-128, 128, (rows, cols))).astype(np.int8)
    check(x, *legal_params(gen, cols))


@pytest.mark.parametrize("cols", [64, 65, 100, 127, 128])
@pytest.mark.parametrize("dmax", [0, 1, 62, 63, 64, 65, 127])
def test_short_rows_at_the_table_edges(rng, cols, dmax):
    """Distances up to dmax on both sides of the one-vector table (vpermb, dmax < 64) and the two-vector
    table (vpermi2b), in rows that reach every distance, clip below int8, or sit at one value."""
    x = rng.integers(-128, 128, (27, cols)).astype(np.int8)
    x[0], x[1], x[2] = -128, 127, 0
    x[3, :] = -128
    x[3, cols // 2] = 127
    x[4] = np.arange(cols) % 128 - (np.arange(cols) % 2) * 128
    x[5] = 127 - np.arange(cols) % (dmax + 2)
    b_max = hccs.MAX_ROW_MASS // cols
    for s in sorted({0, 1, min(hccs.S_MAX, (b_max - -(-hccs.MIN_FLOOR_MASS // cols)) // max(dmax, 1))}):
        if b_max - s * dmax >= 0 and cols * (b_max - s * dmax) >= hccs.MIN_FLOOR_MASS:
            check(x, b_max, s, dmax)
            check(x[:9], b_max, s, dmax)


@pytest.mark.parametrize("cols", [64, 100, 127, 128])
def test_short_rows_distance_sums_at_their_bound(rng, cols):
    """Rows whose distance sum is the largest (one element at 127, the others at distance dmax = 127) in
    every slot of the groups of eight, beside rows with small sums: the eight row sums share 16-bit fields
    (hccs._packed_row_sums), so a sum spilling into its neighbour's field would show."""
    x = rng.integers(100, 128, (2 * hccs.SHORT_GROUP + 3, cols)).astype(np.int8)
    for r in range(x.shape[0]):
        if r % 3 != 1:
            x[r] = -128
            x[r, r % cols] = 127
    b_max = hccs.MAX_ROW_MASS // cols
    check(x, b_max, 1, 127)
    check(x, b_max, (b_max - -(-hccs.MIN_FLOOR_MASS // cols)) // 127, 127)

@pytest.mark.parametrize("cols", [64, 70, 128])
def test_wide_reciprocal_rows_in_groups_of_eight(rng, cols):
    """allow_zero_floor: totals below WIDE_INV_TOTAL in the first and last slot of a group of eight, in the
    first, a middle and the last group of the pipelined loop, and among the rows after the groups."""
    x = rng.integers(-128, 128, (29, cols)).astype(np.int8)
    wide = [0, 7, 11, 12, 23, 24, 28]
    x[wide] = -128
    x[wide, [3, 0, cols - 1, 5, 1, 2, cols - 1]] = 127
    check(x, 1, 1, 1, allow_zero_floor=True)
    check(x, 3, 1, 3, allow_zero_floor=True)
    check(x[:16], 2, 1, 2, allow_zero_floor=True)


def test_row_kernel_on_wider_integer_arrays(rng):
    """hccs_row takes int8 values in any integer array and writes an int32 row (the Soma decode step)."""
    x = rng.integers(-128, 128, 200).astype(np.int32)
    out = np.zeros(200, np.int32)
    total = hccs.hccs_row(x, np.zeros(0, np.bool_), 100, 2, 30, hccs.MODE_DIV, hccs.OUT_UINT8, out)
    assert np.array_equal(out, hccs.hccs_int(x.astype(np.int8)[None], 100, 2, 30, impl="numpy")[0])
    x8 = x.astype(np.int64)
    assert total == np.sum(100 - 2 * np.minimum(x8.max() - x8, 30))


PORTABLE = """
import numpy as np
from somatile.model import hccs
gen = np.random.default_rng(3)
for cols in (64, 100, 128, 300, 512):
    for rows in (1, 4, 7, 17):
        x = gen.integers(-128, 128, (rows, cols)).astype(np.int8)
        b = hccs.MAX_ROW_MASS // cols
        for B, S, D in ((b, 1, 20), (b, 0, 0), (1, 1, 1), (b, 0, 100)):
            for mode in ("div", "clb"):
                kw = dict(mode=mode, allow_zero_floor=True)
                assert np.array_equal(hccs.hccs_int(x, B, S, D, **kw), hccs.hccs_int(x, B, S, D, impl="numpy", **kw))
print("portable ok")
"""


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86-64 target names")
def test_portable_version_without_vbmi(tmp_path):
    """numba compiling for an AVX2 target (no AVX-512 VBMI) takes the uint16-lane output and per-row sums."""
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="+avx2,+avx,+fma,+bmi,+bmi2,+lzcnt,+popcnt,"
               "+sse4.2,+sse4.1,+ssse3,+sse3,+sse2,+sse,+cmov,+64bit", NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", PORTABLE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "portable ok" in done.stdout
