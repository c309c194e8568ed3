"""HCCS, head-calibrated clipped-linear softmax: float references and the bit-exact integer kernel.

The integer kernel follows the AI Engine kernel of Danopoulos et al. (docs/numerics.md, section "HCCS"):
per head three integers (B, S, Dmax); for a row x of int8 logits,

    m       = max of the valid x
    d_i     = min(m - x_i, Dmax)                      0..127
    score_i = B - S * d_i                             0..32767 (int16, never negative)
    total   = sum of score_i                          int32 (at most 32767 by the row-mass rule)
    div:    inv = floor(NUM / total)                  NUM = 255 << 15 (uint8) or 32767 (int16)
    clb:    k = floor(log2 total); inv = (255 << 15) >> k (uint8) or 32767 >> k (int16)
    out_i   = min((score_i * inv) >> SHIFT, OUT_MAX)  SHIFT = 15 (uint8) or 0 (int16); floor rounding

Float references beside it: :func:`softmax`, :func:`hccs_float` (seed 003's single-c form) and
:func:`hccs_float_bsd` (the paper's three-parameter family), with the same mask semantics.

Two implementations of the integer kernel agree bit for bit: ``impl="numpy"`` is the readable spec,
``impl="numba"`` (the default) the fast path built from the row kernel :func:`hccs_row`, which other
``@njit`` code (the Soma decode step) calls directly. Every width and range lives in the module constants
below; RTL, firmware and host code import them instead of re-declaring them.
"""

from __future__ import annotations

import os

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.imputils import impl_ret_borrowed
from numba.cpython.unsafe.numbers import leading_zeros
from numba.extending import intrinsic, overload
from numba.np.arrayobj import make_array, populate_array

INPUT_BITS = 8
"""Logits enter as int8."""
DIST_BITS = 8
"""m - x of two int8 values lies in 0..255 (unsigned 8 bit) before the Dmax cap."""
SCORE_BITS = 16
"""score = B - S*d is stored as int16 and is never negative (0..32767)."""
SUM_BITS = 32
"""The row sum is accumulated in int32; the row-mass rule keeps it at or below 32767."""
INV_SHIFT = 15
"""Fraction bits of the uint8 reciprocal: out = (score * inv) >> 15."""
INV_BITS = 23
"""Unsigned width that holds every reciprocal (255 << 15 when total = 1, reachable only with masks or
``allow_zero_floor``); without them the paper's bound inv <= 32767 (16 bit) holds."""
PRODUCT_BITS = 24
"""Unsigned width of score * inv before the shift (clb uint8 reaches 255 << 16 - 1)."""
DSUM_BLOCK = 512
"""Elements whose distances (each <= 127) the numba kernel sums in uint16 lanes before widening: 512 * 127
< 2^16."""

B_MIN, B_MAX = 1, 32767
S_MIN, S_MAX = 0, 127
DMAX_MIN, DMAX_MAX = 0, 127
MIN_FLOOR_MASS = 256
"""Rule: cols * (B - S*Dmax) >= 256, so that an unmasked row's total is >= 256 and inv fits int16."""
MAX_ROW_MASS = 32767
"""Rule: cols * B <= 32767, so that the row sum fits int16 and k = floor(log2 total) <= 14."""

MODE_DIV = 0
MODE_CLB = 1
OUT_UINT8 = 0
OUT_INT16 = 1
MODE_CODES = {"div": MODE_DIV, "clb": MODE_CLB}
OUT_CODES = {"uint8": OUT_UINT8, "int16": OUT_INT16}
OUT_DTYPES = {"uint8": np.uint8, "int16": np.int16}

UINT8_MAX = 255
INT16_MAX = 32767
UINT8_NUMERATOR = UINT8_MAX << INV_SHIFT
"""Div mode, uint8 output: inv = floor((255 << 15) / total)."""
INT16_NUMERATOR = INT16_MAX
"""Div mode, int16 output: inv = floor(32767 / total), output shift 0."""

WIDTHS = {
    "input_bits": INPUT_BITS, "dist_bits": DIST_BITS, "score_bits": SCORE_BITS, "sum_bits": SUM_BITS,
    "inv_shift": INV_SHIFT, "inv_bits": INV_BITS, "product_bits": PRODUCT_BITS,
    "B": (B_MIN, B_MAX), "S": (S_MIN, S_MAX), "dmax": (DMAX_MIN, DMAX_MAX),
    "min_floor_mass": MIN_FLOOR_MASS, "max_row_mass": MAX_ROW_MASS,
}
"""Every width and range of the HCCS integer kernel in one mapping (for RTL elaboration and header export)."""


def per_head(name: str, value, heads: int) -> np.ndarray:
    """Expand an integer or a length-``heads`` sequence of integers to int64 (heads,); errors name ``name``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return np.array((value,) * heads, np.int64)  # the common case; np.full costs several times more
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.all(arr == np.round(arr))):
        raise ValueError(f"{name}: expected integers, got {value!r}")
    arr = arr.astype(np.int64).reshape(-1)
    if arr.size == 1:
        return np.repeat(arr, heads)
    if arr.size != heads:
        raise ValueError(f"{name}: expected one int or {heads} per-head values, got {arr.size}")
    return arr


def per_head_in_range(name: str, value, heads: int, lo: int, hi: int, symbol: str) -> np.ndarray:
    """:func:`per_head`, each value within ``lo..hi``; the error names the first head outside as
    ``"<name>: head h <symbol> = v is outside lo..hi"``."""
    arr = per_head(name, value, heads)
    bad = (arr < lo) | (arr > hi)
    if bad.any():
        h = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: head {h} {symbol} = {arr[h]} is outside {lo}..{hi}")
    return arr


def check_params(B, S, dmax, cols: int, heads: int = 1, *, allow_zero_floor: bool = False):
    """Validate per-head HCCS integers for rows of ``cols`` elements; return (B, S, dmax) as int64 (heads,).

    Rules (each failure raises ValueError naming the head, the values and the rule):
    ``1 <= B <= 32767``, ``0 <= S <= 127``, ``0 <= Dmax <= 127``; ``B - S*Dmax >= 0`` (scores never negative);
    ``cols * (B - S*Dmax) >= 256`` (floor mass: inv stays within int16); ``cols * B <= 32767`` (row sum fits
    int16). ``allow_zero_floor=True`` waives the floor-mass rule only, for the seed's single-c form
    (S = 1, B = Dmax = c, floor 0); the kernel stays exact then, with a wider reciprocal (INV_BITS).
    """
    if cols < 1:
        raise ValueError(f"rows are empty (cols = {cols}); HCCS needs at least one element per row")
    if type(B) is int and type(S) is int and type(dmax) is int:
        # The common call (one int each, shared by the heads), checked once and made into one array: the
        # general path's three arrays and their round trip cost 2 us a call, a tenth of a 4096 x 128 kernel.
        _check_head(B, S, dmax, cols, allow_zero_floor, "")
        arr = np.array((B, S, dmax), np.int64)
        if heads > 1:
            arr = arr.repeat(heads)
        return arr[:heads], arr[heads:2 * heads], arr[2 * heads:]
    B, S, dmax = (per_head(n, v, heads) for n, v in (("B", B), ("S", S), ("dmax", dmax)))
    for h, (b, s, dm) in enumerate(zip(B.tolist(), S.tolist(), dmax.tolist())):
        _check_head(b, s, dm, cols, allow_zero_floor, f"head {h}: " if heads > 1 else "")
    return B, S, dmax


def _check_head(b: int, s: int, dm: int, cols: int, allow_zero_floor: bool, where: str) -> None:
    """The rules of :func:`check_params` for one head's integers; errors start with ``where``."""
    # Straight-line checks, each rule once: a loop over a table of the ranges cost 0.3 us on every call.
    if not B_MIN <= b <= B_MAX:
        raise ValueError(f"{where}B = {b} is outside {B_MIN}..{B_MAX}")
    if not S_MIN <= s <= S_MAX:
        raise ValueError(f"{where}S = {s} is outside {S_MIN}..{S_MAX}")
    if not DMAX_MIN <= dm <= DMAX_MAX:
        raise ValueError(f"{where}dmax = {dm} is outside {DMAX_MIN}..{DMAX_MAX}")
    floor = b - s * dm
    if floor < 0:
        raise ValueError(f"{where}B - S*dmax = {b} - {s}*{dm} = {floor} < 0; rule B >= S*dmax "
                         f"(scores must stay non-negative)")
    if not allow_zero_floor and cols * floor < MIN_FLOOR_MASS:
        raise ValueError(f"{where}cols*(B - S*dmax) = {cols}*{floor} = {cols * floor} < {MIN_FLOOR_MASS}; "
                         f"rule: floor mass >= {MIN_FLOOR_MASS} keeps the reciprocal within int16 "
                         f"(pass allow_zero_floor=True for the seed's single-c form S=1, B=dmax=c)")
    if cols * b > MAX_ROW_MASS:
        raise ValueError(f"{where}cols*B = {cols}*{b} = {cols * b} > {MAX_ROW_MASS}; rule: the row sum "
                         f"must fit int16 (lower B or S)")


def as_heads(x: np.ndarray, mask, name: str = "x", *, floating: bool = False, dtype=np.int8):
    """Check logits (``dtype``, int8 by default, or float with ``floating``) and an optional bool mask of the
    same shape.

    Returns (x3, valid3, squeeze): x3 and valid3 viewed as (H, R, N); valid3 is None without a mask; squeeze
    is True for (R, N) input. Float logits must be finite wherever the mask lets them take part (masked
    positions may hold -inf or NaN).
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(x).__name__}")
    if floating and x.dtype.kind != "f":
        raise TypeError(f"{name}: expected float logits, got dtype {x.dtype}")
    if not floating and x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
    if x.ndim not in (2, 3):
        raise ValueError(f"{name}: expected shape (R, N) or (H, R, N), got {x.shape}")
    if x.shape[-1] == 0:
        raise ValueError(f"{name}: rows are empty (N = 0), expected at least one element per row")
    squeeze = x.ndim == 2
    x3 = x[None] if squeeze else x
    valid3 = None
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask: expected dtype bool (True = element takes part), got {mask.dtype}")
        if mask.shape != x.shape:
            raise ValueError(f"mask: expected the shape of {name} {x.shape}, got {mask.shape}")
        valid3 = mask[None] if squeeze else mask
    if floating:
        finite = np.isfinite(x3)
        bad = ~finite if valid3 is None else (~finite & valid3)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name}: non-finite value {x3[where]} at (head, row, col) = {where} "
                             f"(NaN/inf are allowed only where mask is False)")
    return x3, valid3, squeeze


def floor_log2(v: np.ndarray) -> np.ndarray:
    """Position of the leading one of positive integers (exact: frexp of an integer below 2**53)."""
    return (np.frexp(v.astype(np.float64))[1] - 1).astype(np.int32)


def _hccs_spec(x3, valid3, B, S, dmax, mode: int, out: int) -> np.ndarray:
    """The numpy specification, step by step as in docs/numerics.md. x3 int8 (H, R, N) -> int32 (H, R, N)."""
    xi = x3.astype(np.int32)
    valid = np.ones(xi.shape, bool) if valid3 is None else valid3
    B, S, dmax = (p.astype(np.int32)[:, None, None] for p in (B, S, dmax))
    row_has_valid = valid.any(axis=-1, keepdims=True)
    m = np.where(valid, xi, -(1 << INPUT_BITS)).max(axis=-1, keepdims=True)
    d = np.minimum(m - xi, dmax)
    score = np.where(valid, B - S * d, 0).astype(np.int32)
    total = score.sum(axis=-1, keepdims=True, dtype=np.int32)
    safe_total = np.maximum(total, 1)
    if mode == MODE_DIV:
        numerator = UINT8_NUMERATOR if out == OUT_UINT8 else INT16_NUMERATOR
        inv = numerator // safe_total
    else:
        k = floor_log2(safe_total)
        inv = (UINT8_NUMERATOR >> k) if out == OUT_UINT8 else (INT16_NUMERATOR >> k)
    inv = np.where(row_has_valid, inv, 0).astype(np.int32)
    product = score * inv
    if out == OUT_UINT8:
        return np.minimum(product >> INV_SHIFT, UINT8_MAX)
    return np.minimum(product, INT16_MAX)


@numba.njit(cache=True, nogil=True, inline="always")
def masked_max_at(x, valid, x0, n, every):
    """(max, count) of the valid elements of the row at unsigned offset x0 of the flat arrays x and valid
    (every element when ``every``) as int32 and int64; (-128, 0) when none is valid. The max runs in int8
    lanes (x holds int8 values whatever its dtype). Inlined, at the price of reference counting its two
    array arguments once per row."""
    lowest = np.int8(-(1 << (INPUT_BITS - 1)))
    m = lowest
    if every:
        for i in range(n):
            v = np.int8(x[x0 + np.uint64(i)])
            m = v if v > m else m
        return np.int32(m), np.int64(n)
    count = 0
    for i in range(n):
        valid_i = valid[x0 + np.uint64(i)]
        v = np.int8(x[x0 + np.uint64(i)]) if valid_i else lowest
        m = v if v > m else m
        count += 1 if valid_i else 0
    return np.int32(m), np.int64(count)


@intrinsic
def mulhi_u16(typingctx, a, b):
    """High half of the 32-bit product of two uint16 values, as uint16: LLVM's ``umul.fix`` with 16 fraction
    bits, which LLVM vectorises as such and x86 lowers to ``vpmulhuw`` (32 lanes per instruction). Written as
    ``(zext a * zext b) >> 16`` instead, numba's typing widens the product to 64 bits and, even in i32, LLVM
    merges the final truncation to uint8 into the shift and keeps 32-bit multiplies (16 lanes)."""
    sig = types.uint16(types.uint16, types.uint16)

    def codegen(context, builder, signature, args):
        i16, i32 = ir.IntType(16), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i16, [i16, i16, i32]), "llvm.umul.fix.i16")
        return builder.call(fn, [args[0], args[1], ir.Constant(i32, 16)])

    return sig, codegen


@intrinsic
def shl_i32(typingctx, a, s):
    """a << s in int32 for 0 <= s < 32. numba types a shift of int32 values as int64, and LLVM cannot narrow
    a variable shift back (its amount would be poison at 32..63), so the vector loop would run 64-bit
    lanes."""
    return types.int32(types.int32, types.int32), lambda context, builder, sig, args: builder.shl(*args)


@intrinsic
def ashr_i32(typingctx, a, s):
    """a >> s (arithmetic) in int32 for 0 <= s < 32; see :func:`shl_i32`."""
    return types.int32(types.int32, types.int32), lambda context, builder, sig, args: builder.ashr(*args)


@intrinsic
def mul_i32(typingctx, a, b):
    """a * b in int32 (the caller knows it does not overflow). numba types it int64; a cast back to int32
    does not always let LLVM narrow the vector multiply again."""
    return types.int32(types.int32, types.int32), lambda context, builder, sig, args: builder.mul(*args)


@intrinsic
def sub_i32(typingctx, a, b):
    """a - b in int32 (no overflow); see :func:`mul_i32`."""
    return types.int32(types.int32, types.int32), lambda context, builder, sig, args: builder.sub(*args)


VECTOR_LANES = 64
"""Elements per vector of :func:`chunk_max` and :func:`chunk_distance_sum`: one AVX-512 register of int8 (LLVM
splits the generic vector on narrower targets)."""


def _int8_chunks(context, builder, array_type, array, start, steps, body, group=1):
    """Emit ``body(chunks)`` for ``steps`` consecutive groups of ``group`` vectors of VECTOR_LANES elements of
    the 1-D array from element ``start`` (unsigned), each loaded unaligned and truncated to
    <VECTOR_LANES x i8> (the elements hold int8 values whatever the array's integer type)."""
    width = array_type.dtype.bitwidth
    lanes = ir.VectorType(ir.IntType(width), VECTOR_LANES)
    data = make_array(array_type)(context, builder, array).data
    with cgutils.for_range(builder, steps) as loop:
        first = builder.add(start, builder.mul(loop.index, ir.Constant(loop.index.type, group * VECTOR_LANES)))
        chunks = []
        for g in range(group):
            at = builder.add(first, ir.Constant(first.type, g * VECTOR_LANES))
            chunk = builder.load(builder.bitcast(builder.gep(data, [at]), lanes.as_pointer()), align=1)
            chunks.append(chunk if width == 8 else builder.trunc(chunk, ir.VectorType(ir.IntType(8), VECTOR_LANES)))
        body(chunks)


def _splat(builder, value, vector_type):
    lane = ir.Constant(ir.IntType(32), 0)
    one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, lane)
    return builder.shuffle_vector(one, ir.Constant(vector_type, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), vector_type.count), [0] * vector_type.count))


def _int_array(a):
    return isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and isinstance(a.dtype, types.Integer)


@intrinsic
def chunk_max(typingctx, x, start, chunks):
    """The max of ``chunks * VECTOR_LANES`` int8 values of the flat integer array ``x`` from element ``start``
    (uint64), -128 when ``chunks`` is 0: an element-wise vector max over the chunks and one reduction at the
    end. The loop vectoriser instead runs a row shorter than its main loop's four vectors (256 int8) in
    16-byte steps, and a row of 128 took a quarter of the HCCS kernel's time in its max."""
    if not _int_array(x):
        return None

    def codegen(context, builder, signature, args):
        array, start, chunks = args
        i8 = ir.IntType(8)
        vector = ir.VectorType(i8, VECTOR_LANES)
        top = cgutils.alloca_once_value(builder, ir.Constant(vector, [-128] * VECTOR_LANES))

        def body(chunk):
            seen = builder.load(top)
            builder.store(builder.select(builder.icmp_signed(">", chunk[0], seen), chunk[0], seen), top)

        _int8_chunks(context, builder, signature.args[0], array, start, chunks, body)
        reduce = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i8, [vector]),
                                                f"llvm.vector.reduce.smax.v{VECTOR_LANES}i8")
        return builder.call(reduce, [builder.load(top)])

    return types.int8(x, types.uint64, types.int64), codegen


@intrinsic
def chunk_distance_sum(typingctx, x, start, chunks, m, lo):
    """sum of ``m - max(x_i, lo)`` over ``chunks * VECTOR_LANES`` int8 values of the flat integer array ``x``
    from element ``start``, as int64; requires ``0 <= m - lo <= 127`` (HCCS: lo = max(m - dmax, -128)), so
    that the distances of two chunks add in a byte: each pair of chunks is then summed at full width once
    (x86: vpsadbw, eight bytes per lane), which at 512 columns took 29 % off the pass against a sum per
    chunk."""
    if not _int_array(x):
        return None

    def codegen(context, builder, signature, args):
        array, start, chunks, m, lo = args
        i64 = ir.IntType(64)
        bytes_ = ir.VectorType(ir.IntType(8), VECTOR_LANES)
        wide = ir.VectorType(i64, VECTOR_LANES)
        top, floor = _splat(builder, m, bytes_), _splat(builder, lo, bytes_)
        total = cgutils.alloca_once_value(builder, ir.Constant(i64, 0))
        reduce = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [wide]),
                                                f"llvm.vector.reduce.add.v{VECTOR_LANES}i64")

        def body(group):
            distances = [builder.sub(top, builder.select(builder.icmp_signed(">", c, floor), c, floor)) for c in group]
            summed = distances[0] if len(distances) == 1 else builder.add(distances[0], distances[1])
            builder.store(builder.add(builder.load(total), builder.call(reduce, [builder.zext(summed, wide)])), total)

        pairs = builder.lshr(chunks, ir.Constant(chunks.type, 1))
        _int8_chunks(context, builder, signature.args[0], array, start, pairs, body, group=2)
        last = builder.add(start, builder.mul(pairs, ir.Constant(chunks.type, 2 * VECTOR_LANES)))
        _int8_chunks(context, builder, signature.args[0], array, last, builder.and_(chunks, ir.Constant(chunks.type, 1)),
                     body)
        return builder.load(total)

    return types.int64(x, types.uint64, types.int64, types.int8, types.int8), codegen


def _has_vbmi(context) -> bool:
    """True when numba compiles for a target with AVX-512 VBMI (vpermi2b, a 128-byte table lookup). numba
    keys its on-disk cache by the same feature string, so code chosen here never runs on another CPU."""
    return "+avx512vbmi" in context.codegen()._tm_features.split(",")


@intrinsic
def vbmi_target(typingctx):
    """:func:`_has_vbmi` as a constant of the compiled code: the branch it guards is folded away, so code
    that only AVX-512 VBMI targets can run (:func:`short_rows_uint8`) is not kept on others."""
    return types.boolean(), lambda context, builder, sig, args: ir.Constant(ir.IntType(1), int(_has_vbmi(context)))


def _table_entries(first: int) -> list[int]:
    """Distances of the 32 uint16 lanes of each operand of x86 ``packuswb`` (which interleaves its two
    operands in 8-lane groups per 128-bit lane) so that the packed bytes hold distances first..first+63 in
    order: one pack instruction per 64 table entries, no lane permutation after it."""
    return [first + 16 * lane + 8 * half + i for half in (0, 1) for lane in range(4) for i in range(8)]


WIDE_INV_TOTAL = 128
"""Row totals below this give a uint8 reciprocal of 2^16 or more (div: 255 << 15 // 127 = 65793; clb: k <= 6),
which the uint16 lanes of :func:`rows_uint8` cannot hold; only masks or ``allow_zero_floor`` reach them."""

ROW_GROUP = 4
"""Rows that :func:`rows_uint8` computes side by side (its shared reductions pair rows twice: 4)."""

TABLE_ENTRIES = 2 * VECTOR_LANES
"""Distances 0..127 (every Dmax): the entries of a row's whole output table, two vectors of 64."""

SHORT_GROUP = 8
"""Rows that :func:`short_rows_uint8` computes side by side: eight rows fill the eight lanes of the float64
division of the reciprocals and the two vectors of four 16-bit fields of :func:`_packed_row_sums` (four rows
a group measured 0.4 us slower on 4096 rows of 128 in div mode)."""


def _llvm_function(builder, name, result, *params):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, list(params)), name)


def _shuffle(builder, a, b, mask):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), len(mask)), list(mask)))


def _smax(builder, a, b):
    return builder.select(builder.icmp_signed(">", a, b), a, b)


def _pair_fold(builder, vectors, op):
    """Fold a power-of-two number of equal vectors (one per row) pairwise with the lane-wise ``op`` until one
    vector is left; returns (vector, width, rows): lanes ``g*width .. g*width + width - 1`` of the vector
    hold partial results of row ``rows[g]``, to be folded within the group (:func:`_group_fold`).

    Each step pairs vectors a and b, whose groups of ``w`` lanes belong to the same rows, and halves the
    groups: ``op`` of a blend (first half of each group from a, second from b) and one two-source shuffle
    (the other halves), so that half of the lane moves are blends, which x86 runs on every vector port,
    not only on the shuffle ports."""
    lanes = vectors[0].type.count
    width = lanes
    rows = [[r] for r in range(len(vectors))]
    while len(vectors) > 1:
        half = width // 2
        groups = range(lanes // width)
        blend = [g * width + i + (lanes if i >= half else 0) for g in groups for i in range(width)]
        cross = [g * width + half + i if i < half else lanes + g * width + i - half for g in groups
                 for i in range(width)]
        vectors = [op(_shuffle(builder, a, b, blend), _shuffle(builder, a, b, cross))
                   for a, b in zip(vectors[0::2], vectors[1::2])]
        rows = [[r for g in groups for r in (ra[g], rb[g])] for ra, rb in zip(rows[0::2], rows[1::2])]
        width = half
    return vectors[0], width, rows[0]


def _group_fold(builder, vector, width, op):
    """``op`` over each group of ``width`` consecutive lanes: every lane ends up with its group's result
    (each step rotates the groups by half the remaining distance)."""
    lanes = vector.type.count
    step = width // 2
    while step:
        vector = op(vector, _shuffle(builder, vector, vector, [i - i % width + (i % width + step) % width
                                                               for i in range(lanes)]))
        step //= 2
    return vector


def _fold_rows(builder, vectors, op):
    """:func:`_pair_fold` then :func:`_group_fold`: returns (vector, width, first) where the ``width`` lanes
    from ``first[r]`` on all hold row r's result."""
    vector, width, rows = _pair_fold(builder, vectors, op)
    return _group_fold(builder, vector, width, op), width, {r: g * width for g, r in enumerate(rows)}


def _emit_inverses(builder, totals, mode):
    """The uint8 reciprocals of the row totals (a vector of i64, each >= 1) as i16 lanes (truncated, so wrong
    for totals below WIDE_INV_TOTAL, whose rows the callers recompute). div: floor(NUM / total) through a
    float64 division, exact here: NUM < 2^23 and total <= 32767, so a quotient that is not an integer lies at
    least 2^-15 from one, far beyond the rounding error of 2^-30. clb: NUM >> floor(log2 total)."""
    rows = totals.type.count
    i1, i64 = ir.IntType(1), ir.IntType(64)
    rows_f64 = ir.VectorType(ir.DoubleType(), rows)
    quotient = builder.fptoui(builder.fdiv(ir.Constant(rows_f64, [float(UINT8_NUMERATOR)] * rows),
                                           builder.uitofp(totals, rows_f64)), totals.type)
    zeros = builder.call(_llvm_function(builder, f"llvm.ctlz.v{rows}i64", totals.type, totals.type, i1),
                         [totals, ir.Constant(i1, 1)])
    shifted = builder.lshr(ir.Constant(totals.type, [UINT8_NUMERATOR] * rows),
                           builder.sub(ir.Constant(totals.type, [63] * rows), zeros))
    inverse = builder.select(builder.icmp_signed("==", mode, ir.Constant(i64, MODE_DIV)), quotient, shifted)
    return builder.trunc(inverse, ir.VectorType(ir.IntType(16), rows))


def _mulhi(builder, a, b):
    """The high halves of the lane-wise 32-bit products of two i16 vectors (x86: vpmulhuw)."""
    i32 = ir.IntType(32)
    fn = _llvm_function(builder, f"llvm.umul.fix.v{a.type.count}i16", a.type, a.type, a.type, i32)
    return builder.call(fn, [a, b, ir.Constant(i32, 16)])


def _emit_scores(builder, d, B, S, dmax):
    """2B - 2S*min(d, dmax) in the i16 lanes of d: the clamp keeps the table's unused entries (d > dmax) in
    range too."""
    i16 = d.type.element
    cap = _splat(builder, builder.trunc(dmax, i16), d.type)
    d = builder.select(builder.icmp_unsigned("<", d, cap), d, cap)
    twice_b, twice_s = (_splat(builder, builder.trunc(builder.shl(v, ir.Constant(v.type, 1)), i16), d.type)
                        for v in (B, S))
    return builder.sub(twice_b, builder.mul(twice_s, d))


def _emit_table_scores(builder, B, S, dmax, entries):
    """The doubled scores of distances 0..entries-1 (64 or 128) as <32 x i16> vectors, two per 64 entries,
    in the lane order of :func:`_table_entries`."""
    half_words = ir.VectorType(ir.IntType(16), VECTOR_LANES // 2)
    return [_emit_scores(builder, ir.Constant(half_words, part), B, S, dmax)
            for first in range(0, entries, VECTOR_LANES) for e in [_table_entries(first)] for part in (e[:32], e[32:])]


def _emit_tables(builder, table_scores, inverse):
    """A row's outputs ``min(mulhi(2*score, inv), 255)`` for the distances of :func:`_emit_table_scores`,
    as one <64 x i8> table per 64 entries; ``inverse`` is the row's reciprocal in every lane. packuswb
    saturates at 255 (its int16 input stays below 511): the clb cap for free."""
    bytes_, half_words = ir.VectorType(ir.IntType(8), VECTOR_LANES), ir.VectorType(ir.IntType(16), VECTOR_LANES // 2)
    pack = _llvm_function(builder, "llvm.x86.avx512.packuswb.512", bytes_, half_words, half_words)
    return [builder.call(pack, [_mulhi(builder, low, inverse), _mulhi(builder, high, inverse)])
            for low, high in zip(table_scores[0::2], table_scores[1::2])]


def _emit_lookup(builder, tables, d):
    """The outputs of the distances d (<64 x i8>) from one or two tables of :func:`_emit_tables`: vpermb
    (64 entries, index bits 0..5) or vpermi2b (128 entries)."""
    bytes_ = d.type
    if len(tables) == 1:
        return builder.call(_llvm_function(builder, "llvm.x86.avx512.permvar.qi.512", bytes_, bytes_, bytes_),
                            [tables[0], d])
    return builder.call(_llvm_function(builder, "llvm.x86.avx512.vpermi2var.qi.512", bytes_, bytes_, bytes_, bytes_),
                        [tables[0], d, tables[1]])


def _emit_rows(context, builder, x_type, out_type, x_arr, out_arr, starts, n, B, S, dmax, mode):
    """The IR of :func:`rows_uint8` for the rows at the flat offsets ``starts`` (1 or ROW_GROUP of them);
    returns their totals as a <rows x i64> vector."""
    count = len(starts)
    i1, i8, i16, i32, i64 = (ir.IntType(w) for w in (1, 8, 16, 32, 64))
    bytes_ = ir.VectorType(i8, VECTOR_LANES)
    half_words = ir.VectorType(i16, VECTOR_LANES // 2)
    words = ir.VectorType(i16, VECTOR_LANES)
    in_width, out_width = x_type.dtype.bitwidth, out_type.dtype.bitwidth
    x_data = make_array(x_type)(context, builder, x_arr).data
    out_data = make_array(out_type)(context, builder, out_arr).data
    vbmi = _has_vbmi(context)
    lanes = ir.Constant(i64, VECTOR_LANES)
    last = builder.sub(n, lanes)
    every_row = range(count)

    def const(vector_type, values):
        return ir.Constant(vector_type, list(values))

    def load(row, offset):
        ptr = builder.gep(x_data, [builder.add(starts[row], offset)])
        chunk = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(in_width), VECTOR_LANES).as_pointer()),
                             align=1)
        return chunk if in_width == 8 else builder.trunc(chunk, bytes_)

    def smax(a, b):
        return _smax(builder, a, b)

    def chunk_offsets(body):
        # ceil(n / 64) chunks, the last one moved back to end at n (overlapping its predecessor).
        steps = builder.udiv(builder.add(n, ir.Constant(i64, VECTOR_LANES - 1)), lanes)
        with cgutils.for_range(builder, steps) as loop:
            offset = builder.mul(loop.index, lanes)
            body(builder.select(builder.icmp_signed("<", offset, last), offset, last))

    # The max of each row, as a vector of ROW_GROUP 16-byte groups (or one whole vector) holding it in every
    # byte; the halving steps of the rows share their instructions when the rows share a vector.
    tops = [cgutils.alloca_once_value(builder, const(bytes_, [-128] * VECTOR_LANES)) for _ in every_row]

    def fold_max(offset):
        for r in every_row:
            builder.store(smax(load(r, offset), builder.load(tops[r])), tops[r])

    chunk_offsets(fold_max)
    group, width, first = _fold_rows(builder, [builder.load(t) for t in tops], smax)
    floors = builder.call(_llvm_function(builder, f"llvm.ssub.sat.v{VECTOR_LANES}i8", bytes_, bytes_, bytes_),
                          [group, _splat(builder, builder.trunc(dmax, i8), bytes_)])
    row_lanes = {r: [first[r] + i % width for i in range(VECTOR_LANES)] for r in every_row}
    tops = [_shuffle(builder, group, group, row_lanes[r]) for r in every_row]
    floors = [_shuffle(builder, floors, floors, row_lanes[r]) for r in every_row]

    def distances(r, offset):
        # d = m - max(x, lo) with lo = max(m - dmax, -128): 0..dmax <= 127.
        return builder.sub(tops[r], smax(load(r, offset), floors[r]))

    # The distance sums. Two chunks' distances add in a byte; with AVX-512 each row's pairs are summed into
    # eight 64-bit lanes (psadbw) and the rows reduced together at the end, elsewhere per pair.
    if vbmi:
        lanes8 = ir.VectorType(i64, 8)
        psad = _llvm_function(builder, "llvm.x86.avx512.psad.bw.512", lanes8, bytes_, bytes_)
        zero_bytes = const(bytes_, [0] * VECTOR_LANES)
        sums = [cgutils.alloca_once_value(builder, const(lanes8, [0] * 8)) for _ in every_row]

        def accumulate(r, d):
            builder.store(builder.add(builder.load(sums[r]), builder.call(psad, [d, zero_bytes])), sums[r])
    else:
        wide = ir.VectorType(i64, VECTOR_LANES)
        reduce_add = _llvm_function(builder, f"llvm.vector.reduce.add.v{VECTOR_LANES}i64", i64, wide)
        sums = [cgutils.alloca_once_value(builder, ir.Constant(i64, 0)) for _ in every_row]

        def accumulate(r, d):
            builder.store(builder.add(builder.load(sums[r]), builder.call(reduce_add, [builder.zext(d, wide)])), sums[r])

    full = builder.udiv(n, lanes)
    pair = ir.Constant(i64, 2 * VECTOR_LANES)
    with cgutils.for_range(builder, builder.lshr(full, ir.Constant(i64, 1))) as loop:
        offset = builder.mul(loop.index, pair)
        for r in every_row:
            accumulate(r, builder.add(distances(r, offset), distances(r, builder.add(offset, lanes))))
    with builder.if_then(builder.trunc(full, i1)):
        for r in every_row:
            accumulate(r, distances(r, builder.mul(builder.sub(full, ir.Constant(i64, 1)), lanes)))
    rem = builder.urem(n, lanes)
    with builder.if_then(builder.icmp_unsigned("!=", rem, ir.Constant(i64, 0))):
        # The last chunk ends at n; its first 64 - rem lanes belong to the chunk before.
        fresh = builder.icmp_unsigned(">=", const(bytes_, range(VECTOR_LANES)),
                                      _splat(builder, builder.trunc(builder.sub(lanes, rem), i8), bytes_))
        for r in every_row:
            accumulate(r, builder.select(fresh, distances(r, last), const(bytes_, [0] * VECTOR_LANES)))
    rows_i64 = ir.VectorType(i64, count)
    sums = [builder.load(s) for s in sums]
    if vbmi:
        total, _, first = _fold_rows(builder, sums, builder.add)
        dsum = _shuffle(builder, total, total, [first[r] for r in every_row])
    else:
        dsum = ir.Constant(rows_i64, ir.Undefined)
        for r in every_row:
            dsum = builder.insert_element(dsum, sums[r], ir.Constant(i32, r))

    totals = builder.sub(_splat(builder, builder.mul(B, n), rows_i64), builder.mul(_splat(builder, S, rows_i64), dsum))
    # Rows with a total below WIDE_INV_TOTAL get outputs from a truncated reciprocal here; the caller
    # recomputes them.
    inverse = _emit_inverses(builder, totals, mode)

    def row_inverse(r, vector_type):
        return _shuffle(builder, inverse, inverse, [r] * vector_type.count)

    if vbmi:
        table_scores = _emit_table_scores(builder, B, S, dmax, TABLE_ENTRIES)
        tables = [_emit_tables(builder, table_scores, row_inverse(r, half_words)) for r in every_row]

        def outputs(r, d):
            return _emit_lookup(builder, tables[r], d)
    else:
        inverses = [row_inverse(r, words) for r in every_row]
        cap = const(words, [UINT8_MAX] * VECTOR_LANES)

        def outputs(r, d):
            p = _mulhi(builder, _emit_scores(builder, builder.zext(d, words), B, S, dmax), inverses[r])
            return builder.trunc(builder.select(builder.icmp_unsigned("<", p, cap), p, cap), bytes_)

    def store(offset):
        for r in every_row:
            result = outputs(r, distances(r, offset))
            if out_width != 8:
                result = builder.zext(result, ir.VectorType(ir.IntType(out_width), VECTOR_LANES))
            ptr = builder.gep(out_data, [builder.add(starts[r], offset)])
            builder.store(result, builder.bitcast(ptr, result.type.as_pointer()), align=1)

    chunk_offsets(store)
    return totals


@intrinsic
def rows_uint8(typingctx, x, out, start, n, B, S, dmax, mode_code, count):
    """Integer HCCS of ``count`` (1 or ROW_GROUP, a literal) consecutive unmasked rows with uint8 output,
    whole in vector code: the rows of ``n >= VECTOR_LANES`` int8 values of the flat integer array ``x`` from
    element ``start`` (uint64) into ``out`` at the same offsets. Returns (the sum of the row totals, a bit
    per row whose total is below :data:`WIDE_INV_TOTAL`): the caller recomputes those rows' outputs.

    The passes of :func:`hccs_rows2` in the same lanes (max in int8, distances ``m - max(x_i, lo)`` summed
    in pairs of chunks, output ``min(mulhi(2B - 2S*d_i, inv), 255)``) as straight vector code: the loop
    vectoriser's version ran 128-element rows in its remainder loops and kept the row's state in stack
    slots. ROW_GROUP rows side by side share the horizontal steps of the max and of the distance sums and
    one vector division for the reciprocals, and give the processor independent work while one row waits
    for its reductions. Chunks of 64 elements start at 0, 64, ... and the last at ``n - 64``: the max
    and the output tolerate the overlap (the same values again), the distance sum masks the lanes already
    counted.

    Output: a row has at most 128 distinct distances (0..dmax), so on targets with AVX-512 VBMI the 128
    outputs are computed once per row (four 32-lane multiplies and two saturating packs, whose cap at 255
    is the clb saturation) and each chunk of 64 elements is then one ``vpermi2b`` table lookup; elsewhere
    each chunk is computed in uint16 lanes."""
    if not (_int_array(x) and _int_array(out) and isinstance(count, types.IntegerLiteral)
            and count.literal_value in (1, ROW_GROUP)):
        return None
    rows = count.literal_value

    def codegen(context, builder, signature, args):
        x_arr, out_arr, start, n, B, S, dmax, mode, _ = args
        i64 = ir.IntType(64)
        starts = [builder.add(start, builder.mul(n, ir.Constant(i64, r))) for r in range(rows)]
        totals = _emit_rows(context, builder, signature.args[0], signature.args[1], x_arr, out_arr, starts, n,
                            B, S, dmax, mode)
        return context.make_tuple(builder, signature.return_type, _total_and_wide(builder, totals))

    return types.UniTuple(types.int64, 2)(x, out, types.uint64, types.int64, types.int64, types.int64, types.int64,
                                          types.int64, count), codegen


def _total_and_wide(builder, totals):
    """(the sum of the row totals, a bit per row whose total is below WIDE_INV_TOTAL) as two i64."""
    rows = totals.type.count
    i64 = ir.IntType(64)
    total = builder.call(_llvm_function(builder, f"llvm.vector.reduce.add.v{rows}i64", i64, totals.type), [totals])
    small = builder.icmp_signed("<", totals, ir.Constant(totals.type, [WIDE_INV_TOTAL] * rows))
    return total, builder.zext(builder.bitcast(small, ir.IntType(rows)), i64)


def _packed_row_sums(builder, sums):
    """The eight row sums of :meth:`_ShortRows.reduce`'s psadbw results as <8 x i64>, row r in lane r.

    ``sums`` holds a <8 x i64> per row whose lanes are each below 2^11 (eight bytes of at most 254), and a
    row's whole distance sum is at most 128 * 127 < 2^16. So four rows share each 64-bit lane in 16-bit fields
    (shifts and ors, no lane moves; no field carries into the next in any later sum) and the horizontal sums
    of eight rows take three shuffles and one word permutation, where the pairwise fold (:func:`_fold_rows`)
    took fourteen lane moves: 0.7 us of 15 on 4096 rows of 128."""
    assert len(sums) == 8, "two groups of four rows"
    lanes = sums[0].type
    packed = []
    for four in (sums[:4], sums[4:]):
        p = four[0]
        for k, s in enumerate(four[1:], 1):
            p = builder.or_(p, builder.shl(s, ir.Constant(lanes, [16 * k] * 8)))
        packed.append(p)
    a, b = packed
    # Lanes 0..3 hold partial sums of a, lanes 4..7 of b; two halving steps within each half finish them.
    t = builder.add(_shuffle(builder, a, b, [0, 1, 2, 3, 12, 13, 14, 15]),
                    _shuffle(builder, a, b, [4, 5, 6, 7, 8, 9, 10, 11]))
    t = builder.add(t, _shuffle(builder, t, t, [2, 3, 0, 1, 6, 7, 4, 5]))
    t = builder.add(t, _shuffle(builder, t, t, [1, 0, 3, 2, 5, 4, 7, 6]))
    words = builder.bitcast(t, ir.VectorType(ir.IntType(16), 32))
    return builder.zext(_shuffle(builder, words, words, [0, 1, 2, 3, 16, 17, 18, 19]), lanes)


class _ShortRows:
    """The IR of :func:`short_rows_uint8` for groups of SHORT_GROUP rows of ``VECTOR_LANES <= n <= 2 *
    VECTOR_LANES`` elements, in two phases: :meth:`reduce` (loads, max, distances, totals, reciprocals) and
    :meth:`write` (tables and lookups)."""

    def __init__(self, context, builder, signature, args, entries):
        x_arr, out_arr, _, n, B, S, dmax, mode, _, _ = args
        i64 = ir.IntType(64)
        self.builder, self.n, self.mode = builder, n, mode
        self.bytes_ = ir.VectorType(ir.IntType(8), VECTOR_LANES)
        self.rows_i64 = ir.VectorType(i64, SHORT_GROUP)
        self.x_data = make_array(signature.args[0])(context, builder, x_arr).data
        self.out_data = make_array(signature.args[1])(context, builder, out_arr).data
        # The row's two chunks: 0..63 and n-64..n-1 (the same chunk when n = 64).
        self.offsets = (ir.Constant(i64, 0), builder.sub(n, ir.Constant(i64, VECTOR_LANES)))
        self.cap = _splat(builder, builder.trunc(dmax, ir.IntType(8)), self.bytes_)
        # The second chunk's lanes that the first did not cover (lanes >= 128 - n) count in the distance sum.
        self.fresh = builder.icmp_unsigned(">=", ir.Constant(self.bytes_, list(range(VECTOR_LANES))), _splat(
            builder, builder.trunc(builder.sub(ir.Constant(i64, 2 * VECTOR_LANES), n), ir.IntType(8)), self.bytes_))
        self.mass = _splat(builder, builder.mul(B, n), self.rows_i64)
        self.slope = _splat(builder, S, self.rows_i64)
        self.table_scores = _emit_table_scores(builder, B, S, dmax, entries)

    def pointer(self, data, start, row, offset):
        builder = self.builder
        at = builder.add(builder.add(start, builder.mul(self.n, ir.Constant(self.n.type, row))), offset)
        return builder.bitcast(builder.gep(data, [at]), self.bytes_.as_pointer())

    def reduce(self, start):
        """Rows start/n .. start/n + SHORT_GROUP - 1: returns (their distances, two <64 x i8> per row; their
        reciprocals, <SHORT_GROUP x i16>; their totals, <SHORT_GROUP x i64>)."""
        builder = self.builder
        rows = range(SHORT_GROUP)
        chunks = [[builder.load(self.pointer(self.x_data, start, r, at), align=1) for at in self.offsets] for r in rows]
        # Each row's two chunks and then the two halves of their max are folded before the rows are paired: a
        # 256-bit max of the halves costs half a 512-bit pairing step, and the pairwise fold then starts on
        # 32 lanes (0.2 us of 14 on 4096 rows of 128; halving once more, to 16 lanes, cost 0.7 us more).
        halves = []
        for c in chunks:
            v = _smax(builder, *c)
            halves.append(_smax(builder, _shuffle(builder, v, v, range(32)), _shuffle(builder, v, v, range(32, 64))))
        group, width, first = _fold_rows(builder, halves, lambda a, b: _smax(builder, a, b))
        tops = [_shuffle(builder, group, group, [first[r] + i % width for i in range(VECTOR_LANES)]) for r in rows]
        # d = min(m - x, dmax): m - x (0..255) is exact modulo 2^8 as an unsigned byte, so one subtraction and
        # one unsigned min, without the floor lo = max(m - dmax, -128) of the other kernels.
        distances = [[self.distance(tops[r], c) for c in chunks[r]] for r in rows]
        lanes8 = ir.VectorType(ir.IntType(64), 8)
        psad = _llvm_function(builder, "llvm.x86.avx512.psad.bw.512", lanes8, self.bytes_, self.bytes_)
        zero = ir.Constant(self.bytes_, [0] * VECTOR_LANES)
        # Two distances (<= 127 each) add in a byte; psadbw sums eight bytes into each 64-bit lane.
        sums = [builder.call(psad, [builder.add(d, builder.select(self.fresh, e, zero)), zero]) for d, e in distances]
        totals = builder.sub(self.mass, builder.mul(self.slope, _packed_row_sums(builder, sums)))
        return distances, _emit_inverses(builder, totals, self.mode), totals

    def distance(self, top, chunk):
        builder = self.builder
        d = builder.sub(top, chunk)
        return builder.select(builder.icmp_unsigned("<", d, self.cap), d, self.cap)

    def write(self, start, distances, inverses):
        """The outputs of the rows of :meth:`reduce` from its distances and reciprocals."""
        builder = self.builder
        for r, row in enumerate(distances):
            tables = _emit_tables(builder, self.table_scores, _shuffle(builder, inverses, inverses, [r] * 32))
            for at, d in zip(self.offsets, row):
                builder.store(_emit_lookup(builder, tables, d), self.pointer(self.out_data, start, r, at), align=1)


@intrinsic
def short_rows_uint8(typingctx, x, out, groups, n, B, S, dmax, mode_code, flags, entries):
    """Integer HCCS of the first ``groups * SHORT_GROUP`` rows of ``VECTOR_LANES <= n <= 2 * VECTOR_LANES``
    unmasked int8 values of the flat integer array ``x`` into ``out`` (uint8 output), on targets with
    AVX-512 VBMI only (:func:`vbmi_target`); ``entries`` (a literal) is 64 when dmax < 64 (the output table
    fits one vpermb) and 128 otherwise. Writes ``flags[g]``, a bit per row of group g whose total is below
    :data:`WIDE_INV_TOTAL` (the caller recomputes those rows' outputs), and returns (the sum of the row
    totals, nonzero when any flag is).

    The integers of :func:`rows_uint8`, with the row held in two chunks (0 and n - 64) in registers, the
    maxima of SHORT_GROUP rows folded pairwise (:func:`_pair_fold`), their distance sums in 16-bit fields
    (:func:`_packed_row_sums`) and the loop
    software-pipelined: each step reduces the next group before it writes the outputs of the group reduced
    by the step before, from the distances and reciprocals carried over. Written in group order, the
    processor stalled: a group's outputs wait on its division, which waits on its two reductions, and
    those waiting instructions filled the scheduler while the next group's loads could have started
    (about 27 us against 24 us for 4096 rows of 128)."""
    if not (_int_array(x) and _int_array(out) and _int_array(flags) and isinstance(entries, types.IntegerLiteral)
            and entries.literal_value in (VECTOR_LANES, TABLE_ENTRIES)):
        return None
    table = entries.literal_value

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        zero = ir.Constant(i64, 0)
        if not _has_vbmi(context):
            # vbmi_target() guards every call: never reached.
            return context.make_tuple(builder, signature.return_type, [zero, zero])
        rows = _ShortRows(context, builder, signature, args, table)
        groups, n, flags_data = args[2], args[3], make_array(signature.args[8])(context, builder, args[8]).data
        step = builder.mul(n, ir.Constant(i64, SHORT_GROUP))
        grand_total, any_wide = (cgutils.alloca_once_value(builder, zero) for _ in range(2))
        carried = [[cgutils.alloca_once(builder, rows.bytes_) for _ in rows.offsets] for _ in range(SHORT_GROUP)]
        carried_inverses = cgutils.alloca_once(builder, ir.VectorType(ir.IntType(16), SHORT_GROUP))

        def reduce(g):
            distances, inverses, totals = rows.reduce(builder.mul(g, step))
            total, wide = _total_and_wide(builder, totals)
            builder.store(builder.trunc(wide, ir.IntType(8)), builder.gep(flags_data, [g]))
            builder.store(builder.or_(builder.load(any_wide), wide), any_wide)
            builder.store(builder.add(builder.load(grand_total), total), grand_total)
            for slots, row in zip(carried, distances):
                for slot, d in zip(slots, row):
                    builder.store(d, slot)
            builder.store(inverses, carried_inverses)

        def write(g, state):
            rows.write(builder.mul(g, step), *state)

        def state():
            return [[builder.load(slot) for slot in slots] for slots in carried], builder.load(carried_inverses)

        with builder.if_then(builder.icmp_signed(">", groups, zero)):
            reduce(zero)
            with cgutils.for_range(builder, builder.sub(groups, ir.Constant(i64, 1))) as loop:
                previous = state()
                reduce(builder.add(loop.index, ir.Constant(i64, 1)))
                write(loop.index, previous)
            write(builder.sub(groups, ir.Constant(i64, 1)), state())
        return context.make_tuple(builder, signature.return_type, [builder.load(grand_total), builder.load(any_wide)])

    return types.UniTuple(types.int64, 2)(x, out, types.int64, types.int64, types.int64, types.int64, types.int64,
                                          types.int64, flags, entries), codegen


@intrinsic
def flat_view(typingctx, a):
    """The C-contiguous array ``a`` as a 1-D view of its elements: ``a.reshape(-1)`` without numba's general
    reshape, whose shape normalisation and helper call cost tens of nanoseconds each (the six reshapes of a
    single-row call cost more than a 256-element row)."""
    if not isinstance(a, types.Array) or a.layout != "C":
        return None
    view = a.copy(ndim=1, layout="C")

    def codegen(context, builder, signature, args):
        source = make_array(signature.args[0])(context, builder, args[0])
        result = make_array(view)(context, builder)
        populate_array(result, data=source.data, shape=[source.nitems], strides=[source.itemsize],
                       itemsize=source.itemsize, meminfo=source.meminfo, parent=source.parent)
        return impl_ret_borrowed(context, builder, view, result._getvalue())

    return view(a), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def leading_bit(v):
    """floor(log2 v) for 1 <= v < 2^63: the position of the leading one, in one instruction (a shift loop
    costs a mispredicted branch per row whose total changes octave)."""
    return np.int64(63) - np.int64(leading_zeros(np.uint64(v)))


@numba.njit(cache=True, nogil=True, inline="always")
def _reciprocal(total, mode_code, out_code):
    """Steps 6a-6e of docs/numerics.md for a positive row total (below 2^31). Unsigned 32-bit operands: the
    signed floor division carries sign fix-ups that cost as much as a 128-element row."""
    numerator = np.uint32(UINT8_NUMERATOR if out_code == OUT_UINT8 else INT16_NUMERATOR)
    if mode_code == MODE_DIV:
        return np.int64(numerator // np.uint32(total))
    return np.int64(numerator >> leading_bit(total))


@numba.njit(cache=True, nogil=True)
def hccs_row(x_row, valid_row, B, S, dmax, mode_code, out_code, out_row):
    """HCCS of one row, callable from other ``@njit`` code; writes ``out_row`` and returns the row total.

    x_row: int8 array of length N (or any integer array holding int8 values); valid_row: bool array of
    length N (True = element takes part) or of length 0 (every element takes part); B, S, dmax: integers that
    passed :func:`check_params` for this N; mode_code: MODE_DIV / MODE_CLB; out_code: OUT_UINT8 / OUT_INT16;
    out_row: integer array of length N (int32, or the dtype of out_code), receives 0 at masked positions and
    the whole row 0 when no element takes part. Many rows of a head go faster through :func:`hccs_rows2`.
    """
    return _hccs_any_out(np.ascontiguousarray(x_row), np.ascontiguousarray(valid_row), valid_row.shape[0] == 0, 1,
                         x_row.shape[0], B, S, dmax, mode_code, out_code, out_row)


def _hccs_any_out(x, valid, every, rows, n, B, S, dmax, mode_code, out_code, out):
    """:func:`_hccs_flat` for an ``out`` of any layout (a strided row of a larger array, in numba code)."""


@overload(_hccs_any_out, jit_options={"nogil": True})
def _hccs_any_out_impl(x, valid, every, rows, n, B, S, dmax, mode_code, out_code, out):
    if out.layout == "C":
        return lambda x, valid, every, rows, n, B, S, dmax, mode_code, out_code, out: _hccs_flat(
            x, valid, every, rows, n, B, S, dmax, mode_code, out_code, out)
    # rows_uint8 stores whole vectors at consecutive addresses: strided rows take the general path.
    return lambda x, valid, every, rows, n, B, S, dmax, mode_code, out_code, out: _hccs_flat_rows(
        x, valid, every, 0, rows, n, B, S, dmax, mode_code, out_code, out)


@numba.njit(cache=True, nogil=True)
def hccs_rows2(x2, valid2, B, S, dmax, mode_code, out_code, out2):
    """:func:`hccs_row` of every row of x2 (R, N) into out2 (R, N), C-contiguous, with one head's B, S,
    dmax; valid2 (R, N), or (R, 0) when every element takes part. Returns the sum of the row totals.
    Single thread.

    The same integers as the spec, rearranged so that LLVM vectorises every pass in the narrowest lanes
    that hold it exactly (docs/numerics.md gives the bounds):

    - the max in int8 lanes;
    - ``d_i = m - max(x_i, lo)`` with ``lo = max(m - dmax, -128)`` lies in 0..dmax <= 127, so it is formed
      modulo 2^8 and summed in uint16 lanes over blocks of :data:`DSUM_BLOCK` elements (at most 512 * 127
      each, no overflow); ``total = B*count - S*sum(d_i)``;
    - ``2*score_i = 2B - 2S*d_i`` fits uint16 (B <= 32767), so when ``inv < 2^16`` (every row that meets
      the floor-mass rule) ``(score_i * inv) >> 15 = (2*score_i * inv) >> 16``, the high half of a 16 x 16
      bit product: one multiply per element in uint16 lanes. For int16 output ``score_i * inv <= 65534``
      (``score_i <= total``, inv <= 32767 >> floor(log2 total)), so the low half is exact. Rows with a
      wider reciprocal (masks, ``allow_zero_floor``) take int32 lanes.

    Every step is cast back to its lane width, since numba would otherwise widen to int64 and cut the SIMD
    lanes. The loops are written out in one function (:func:`_hccs_flat`, called once per call, not per row)
    rather than in per-pass helpers taking the arrays: numba reference-counts array arguments of every (even
    inlined) call with atomic operations, which on a 128-element row cost more than the row; rows are
    addressed by unsigned offsets into the flat arrays (:func:`flat_view`), so that numba's negative-index
    wrap-around does not turn the loads into gathers.
    """
    rows, n = x2.shape
    return _hccs_flat(flat_view(x2), flat_view(valid2), valid2.shape[1] == 0, rows, n, B, S, dmax, mode_code,
                      out_code, flat_view(out2))


@numba.njit(cache=True, nogil=True, inline="always")
def _hccs_flat(x, valid, every, rows, n, B, S, dmax, mode_code, out_code, out):
    """The rows of :func:`hccs_rows2` over the flat arrays x and out (rows * n elements) and valid (the same,
    or ignored when ``every``): unmasked uint8 rows of at least VECTOR_LANES elements through
    :func:`short_rows_uint8` (SHORT_GROUP at a time, rows of up to 2 * VECTOR_LANES on AVX-512 VBMI targets)
    and :func:`rows_uint8` (ROW_GROUP at a time, then one by one), the others (and the rows with a wide
    reciprocal) through :func:`_hccs_flat_rows`."""
    if every and out_code == OUT_UINT8 and n >= VECTOR_LANES:
        grand_total = np.int64(0)
        first = 0
        if vbmi_target() and n <= 2 * VECTOR_LANES and rows >= SHORT_GROUP:
            groups = rows // SHORT_GROUP
            flags = np.empty(groups, np.uint8)
            if dmax < VECTOR_LANES:
                total, wide = short_rows_uint8(x, out, groups, n, B, S, dmax, mode_code, flags, VECTOR_LANES)
            else:
                total, wide = short_rows_uint8(x, out, groups, n, B, S, dmax, mode_code, flags, TABLE_ENTRIES)
            grand_total += total
            if wide:
                for g in range(groups):
                    if flags[g]:
                        _redo_wide_rows(x, valid, every, g * SHORT_GROUP, np.int64(flags[g]), n, B, S, dmax,
                                        mode_code, out_code, out)
            first = groups * SHORT_GROUP
        for r in range(first, rows, ROW_GROUP):
            if r + ROW_GROUP <= rows:
                total, wide = rows_uint8(x, out, np.uint64(r * n), n, B, S, dmax, mode_code, ROW_GROUP)
            else:
                total, wide = np.int64(0), np.int64(0)
                for k in range(rows - r):
                    one, small = rows_uint8(x, out, np.uint64((r + k) * n), n, B, S, dmax, mode_code, 1)
                    total += one
                    wide |= small << k
            grand_total += total
            if wide:
                _redo_wide_rows(x, valid, every, r, wide, n, B, S, dmax, mode_code, out_code, out)
        return grand_total
    return _hccs_flat_rows(x, valid, every, 0, rows, n, B, S, dmax, mode_code, out_code, out)


@numba.njit(cache=True, nogil=True, inline="always")
def _redo_wide_rows(x, valid, every, first, wide, n, B, S, dmax, mode_code, out_code, out):
    """The outputs of rows ``first + k`` for each bit k of ``wide`` through :func:`_hccs_flat_rows`: the rare
    rows whose reciprocal needs more than 16 bits (masks or allow_zero_floor), whose totals the vector
    kernels got right and outputs wrong. Called only when ``wide`` is nonzero: the call counts the
    references of its array arguments."""
    while wide:
        k = leading_bit(wide)
        _hccs_flat_rows(x, valid, every, first + k, first + k + 1, n, B, S, dmax, mode_code, out_code, out)
        wide -= np.int64(1) << k


@numba.njit(cache=True, nogil=True, inline="always")
def _hccs_flat_rows(x, valid, every, first, last, n, B, S, dmax, mode_code, out_code, out):
    """Rows first..last-1 of :func:`_hccs_flat`, with loops the compiler vectorises; returns their total."""
    narrow_out = out_code == OUT_UINT8
    shift = np.int32(INV_SHIFT if narrow_out else 0)
    cap = np.int32(UINT8_MAX if narrow_out else INT16_MAX)
    cap16 = np.uint16(cap)
    twice_b = np.uint16(2 * B)
    twice_s = np.uint16(2 * S)
    b16, s16 = np.uint16(B), np.uint16(S)
    chunks = n // VECTOR_LANES
    full = chunks * VECTOR_LANES
    grand_total = np.int64(0)
    for r in range(first, last):
        x0 = np.uint64(r * n)
        m = np.int8(-(1 << (INPUT_BITS - 1)))
        count = np.int64(n)
        if every:
            m = chunk_max(x, x0, chunks)
            for i in range(full, n):
                v = np.int8(x[x0 + np.uint64(i)])
                m = v if v > m else m
        else:
            count = np.int64(0)
            for i in range(n):
                ok = valid[x0 + np.uint64(i)]
                v = np.int8(x[x0 + np.uint64(i)]) if ok else np.int8(-(1 << (INPUT_BITS - 1)))
                m = v if v > m else m
                count += np.int64(1) if ok else np.int64(0)
            if count == 0:
                for i in range(n):
                    out[x0 + np.uint64(i)] = 0
                continue
        lo = np.int8(max(np.int64(m) - dmax, -(1 << (INPUT_BITS - 1))))
        if every:
            tail = np.uint16(0)
            for i in range(full, n):
                v = np.int8(x[x0 + np.uint64(i)])
                tail = np.uint16(tail + np.uint16(np.uint8(m - (v if v > lo else lo))))
            dsum = chunk_distance_sum(x, x0, chunks, m, lo) + np.int64(tail)
        else:
            dsum = np.int64(0)
            for b0 in range(0, n, DSUM_BLOCK):
                block = np.uint16(0)
                for i in range(b0, min(b0 + DSUM_BLOCK, n)):
                    v = np.int8(x[x0 + np.uint64(i)])
                    d = np.uint8(m - (v if v > lo else lo))
                    block = np.uint16(block + np.uint16(d if valid[x0 + np.uint64(i)] else np.uint8(0)))
                dsum += np.int64(block)
        total = np.int64(B) * count - np.int64(S) * dsum
        grand_total += total
        inv = _reciprocal(total, mode_code, out_code)
        if narrow_out and inv < 65536:
            inv16 = np.uint16(inv)
            # A div row sums to at most 255 << 15 before the shift, so only clb can exceed 255.
            saturates = mode_code == MODE_CLB
            if every and saturates:
                for i in range(n):
                    v = np.int8(x[x0 + np.uint64(i)])
                    d = np.uint16(np.uint8(m - (v if v > lo else lo)))
                    p = mulhi_u16(np.uint16(twice_b - np.uint16(twice_s * d)), inv16)
                    out[x0 + np.uint64(i)] = p if p < cap16 else cap16
            elif every:
                for i in range(n):
                    v = np.int8(x[x0 + np.uint64(i)])
                    d = np.uint16(np.uint8(m - (v if v > lo else lo)))
                    out[x0 + np.uint64(i)] = mulhi_u16(np.uint16(twice_b - np.uint16(twice_s * d)), inv16)
            else:
                for i in range(n):
                    v = np.int8(x[x0 + np.uint64(i)])
                    d = np.uint16(np.uint8(m - (v if v > lo else lo)))
                    p = mulhi_u16(np.uint16(twice_b - np.uint16(twice_s * d)), inv16)
                    p = p if p < cap16 else cap16
                    out[x0 + np.uint64(i)] = p if valid[x0 + np.uint64(i)] else np.uint16(0)
        elif not narrow_out:
            inv16 = np.uint16(inv)  # <= 32767
            if every:
                for i in range(n):
                    v = np.int8(x[x0 + np.uint64(i)])
                    d = np.uint16(np.uint8(m - (v if v > lo else lo)))
                    p = np.uint16(np.uint16(b16 - np.uint16(s16 * d)) * inv16)
                    out[x0 + np.uint64(i)] = p if p < cap16 else cap16
            else:
                for i in range(n):
                    v = np.int8(x[x0 + np.uint64(i)])
                    d = np.uint16(np.uint8(m - (v if v > lo else lo)))
                    p = np.uint16(np.uint16(b16 - np.uint16(s16 * d)) * inv16)
                    p = p if p < cap16 else cap16
                    out[x0 + np.uint64(i)] = p if valid[x0 + np.uint64(i)] else np.uint16(0)
        else:
            lo32 = np.int32(lo)
            base = np.int32((np.int64(B) - np.int64(S) * m) * inv)
            slope = np.int32(np.int64(S) * inv)
            for i in range(n):
                v = np.int32(x[x0 + np.uint64(i)])
                p = np.int32(np.int32(base + np.int32(slope * (v if v > lo32 else lo32))) >> shift)
                p = p if p < cap else cap
                out[x0 + np.uint64(i)] = p if every or valid[x0 + np.uint64(i)] else 0
    return grand_total


@numba.njit(cache=True, nogil=True)
def hccs_heads(x3, valid3, B, S, dmax, mode_code, out_code, out3):
    """:func:`hccs_rows2` of every head of x3 (H, R, N) with head h's B[h], S[h], dmax[h]; valid3 (H, R, N)
    or (H, R, 0). One call from Python for the whole tensor: a numba dispatch costs microseconds."""
    for h in range(x3.shape[0]):
        hccs_rows2(x3[h], valid3[h], B[h], S[h], dmax[h], mode_code, out_code, out3[h])


def code_of(table: dict, name: str, value: str) -> int:
    """Look ``value`` up in a code table (MODE_CODES, OUT_CODES); errors name the argument ``name``."""
    if value not in table:
        raise ValueError(f"{name}: expected one of {sorted(table)}, got {value!r}")
    return table[value]


def row_chunks(rows: int, threads: int) -> list[slice]:
    """``threads`` contiguous slices covering ``rows`` rows (fewer when there are fewer rows)."""
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads: expected a positive integer, got {threads!r}")
    parts = min(threads, max(rows, 1))
    return [slice(rows * i // parts, rows * (i + 1) // parts) for i in range(parts)]


_pools: dict = {}
"""Worker pools of :func:`run_threaded` by thread count, kept for the process's life."""
# A forked child (somatile.eval.jobs' workers) has none of its parent's pool threads: it starts its own.
os.register_at_fork(after_in_child=_pools.clear)


def run_threaded(kernel, jobs: list[tuple], threads: int) -> None:
    """Call ``kernel(*args)`` for every args tuple of ``jobs``, on ``threads`` threads: the row kernels are
    ``nogil`` numba functions writing disjoint output rows, so threads run them side by side. The calling
    thread runs the last job and a pool of ``threads - 1`` workers the others; the pool is started once per
    thread count (starting threads on every call cost more than the 4096 x 128 rows it split)."""
    if threads == 1 or len(jobs) == 1:
        for args in jobs:
            kernel(*args)
        return
    pool = _pools.get(threads)
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        pool = _pools.setdefault(threads, ThreadPoolExecutor(threads - 1, thread_name_prefix="somatile-rows"))
    futures = [pool.submit(kernel, *args) for args in jobs[:-1]]
    kernel(*jobs[-1])
    for future in futures:
        future.result()


_INT8 = np.dtype(np.int8)
_FAST_CALLS: dict = {}
"""hccs_int's common calls that passed validation, by (mode, out, B, S, dmax, x.shape, allow_zero_floor):
the compiled kernel, its (R, 0) "no element is masked" array, the output dtype and the mode and out codes
(:func:`_fast_call`)."""
_ENTRIES: dict = {}
"""The compiled code of :func:`hccs_rows2` for C-contiguous int8 rows by output dtype (:func:`_rows_entry`)."""


def _rows_entry(dtype: np.dtype):
    """The compiled :func:`hccs_rows2` for C-contiguous int8 rows, a bool mask and ``dtype`` output, to be
    called without numba's dispatcher, whose typing of the eight arguments cost 0.3 us a call. The caller
    must pass exactly these types (numba's unboxing does not check array dtypes); read-only rows pass as
    well, since the kernel never writes them."""
    entry = _ENTRIES.get(dtype)
    if entry is None:
        sig = (types.Array(types.int8, 2, "C"), types.Array(types.boolean, 2, "C"), *(types.int64,) * 5,
               types.Array(numba.from_dtype(dtype), 2, "C"))
        hccs_rows2.compile(sig)
        entry = _ENTRIES[dtype] = hccs_rows2.get_overload(sig)
    return entry


def _fast_call(key: tuple):
    """Validate a common call's ``key`` (see _FAST_CALLS) as the general path does, with the same errors in
    the same order (mode, out, then :func:`check_params`' rules); remember and return what the call needs.
    Empty rows return None, for the general path's error."""
    mode, out, B, S, dmax, shape, allow_zero_floor = key
    mode_code = code_of(MODE_CODES, "mode", mode)
    out_code = code_of(OUT_CODES, "out", out)
    rows, cols = shape
    if cols < 1:
        return None
    _check_head(B, S, dmax, cols, allow_zero_floor, "")
    dtype = np.dtype(OUT_DTYPES[out])
    if len(_FAST_CALLS) >= 1024:
        _FAST_CALLS.clear()  # a process uses few parameter sets and shapes; bound the memory all the same
    call = _FAST_CALLS[key] = (_rows_entry(dtype), np.empty((rows, 0), np.bool_), dtype, mode_code, out_code)
    return call


def hccs_int(x: np.ndarray, B, S, dmax, *, mode: str = "div", out: str = "uint8", mask=None,
             impl: str = "numba", allow_zero_floor: bool = False, threads: int = 1) -> np.ndarray:
    """Integer HCCS of int8 logits; bit-exact contract of docs/numerics.md (section HCCS).

    x: int8 (R, N) for one head or (H, R, N); B, S, dmax: ints (shared by all heads) or length-H sequences;
    mode: "div" (floor reciprocal, a uint8 row sums to a little under 255) or "clb" (power-of-two reciprocal
    from the leading-bit count; rows sum to 255..510 before saturation, i.e. not normalised); out: "uint8"
    (255 = probability 1) or "int16" (shift 0, saturated at 32767); mask: bool of x's shape, True = element
    takes part (masked elements take no part in the max and output 0; a fully-masked row outputs all zeros);
    impl: "numba" (fast path) or "numpy" (readable spec), bit-identical; allow_zero_floor: see
    :func:`check_params`; threads: the numba path splits each head's rows over this many threads (the same
    bits; the speed-up is in bench/results.md). Returns uint8 or int16 of x's shape. Rounding is floor
    throughout.
    """
    if (mask is None and threads == 1 and type(x) is np.ndarray and x.dtype is _INT8 and x.ndim == 2
            and impl == "numba" and type(B) is int and type(S) is int and type(dmax) is int and x.flags.c_contiguous):
        # The common call (one head's C-contiguous rows, no mask, ints) in few steps: the general path's
        # (H, R, N) views, parameter arrays and the kernel over heads cost 4.5 us a call, a fifth of the
        # kernel on 4096 x 128. A parameter set is validated once (the rules of check_params in the same
        # order, so the same errors; a failing set is never remembered) and the compiled kernel is called
        # directly (numba's dispatcher typed the eight arguments on every call): 1.0 us a call instead of 1.4.
        key = (mode, out, B, S, dmax, x.shape, allow_zero_floor)
        call = _FAST_CALLS.get(key) or _fast_call(key)
        if call is not None:
            entry, every, dtype, mode_code, out_code = call
            result = np.empty(x.shape, dtype)
            entry(x, every, B, S, dmax, mode_code, out_code, result)
            return result
    mode_code = code_of(MODE_CODES, "mode", mode)
    out_code = code_of(OUT_CODES, "out", out)
    x3, valid3, squeeze = as_heads(x, mask)
    B, S, dmax = check_params(B, S, dmax, x3.shape[-1], x3.shape[0], allow_zero_floor=allow_zero_floor)
    if impl == "numpy":
        result = _hccs_spec(x3, valid3, B, S, dmax, mode_code, out_code).astype(OUT_DTYPES[out])
    elif impl == "numba":
        result = np.empty(x3.shape, OUT_DTYPES[out])
        x3 = np.ascontiguousarray(x3)
        valid = np.empty(x3.shape[:2] + (0,), np.bool_) if valid3 is None else np.ascontiguousarray(valid3)
        if threads == 1:
            hccs_heads(x3, valid, B, S, dmax, mode_code, out_code, result)
        else:
            run_threaded(hccs_rows2, [(x3[h, c], valid[h, c], B[h], S[h], dmax[h], mode_code, out_code,
                                       result[h, c]) for h in range(x3.shape[0])
                                      for c in row_chunks(x3.shape[1], threads)], threads)
    else:
        raise ValueError(f"impl: expected 'numba' or 'numpy', got {impl!r}")
    return result[0] if squeeze else result


def seed_params(c: int) -> tuple[int, int, int]:
    """The seed's single-parameter form as integers: (B, S, dmax) = (c, 1, c); needs ``allow_zero_floor``."""
    return int(c), 1, int(c)


EMPTY_ROW_POLICIES = ("zeros", "uniform")


def _normalise(score: np.ndarray, valid: np.ndarray, empty_row: str) -> np.ndarray:
    """score / row sum; rows without a valid element become zeros, or the seed's uniform 1/N."""
    if empty_row not in EMPTY_ROW_POLICIES:
        raise ValueError(f"empty_row: expected one of {EMPTY_ROW_POLICIES}, got {empty_row!r}")
    total = score.sum(axis=-1, keepdims=True)
    has_valid = valid.any(axis=-1, keepdims=True)
    fill = 0.0 if empty_row == "zeros" else 1.0 / score.shape[-1]
    return np.where(has_valid, score / np.where(has_valid, total, 1.0), fill)


def float_distances(logits, mask):
    """Check float logits (see :func:`as_heads`); return (dist, valid, squeeze) with dist = row max - x as
    float64 (H, R, N) (inf where masked) and valid the bool mask (all True without one)."""
    x3, valid3, squeeze = as_heads(logits, mask, "logits", floating=True)
    valid = np.ones(x3.shape, bool) if valid3 is None else valid3
    x = np.where(valid, x3.astype(np.float64), -np.inf)
    m = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # -inf - -inf in fully-masked rows; replaced by inf below
        dist = np.where(valid, m - x, np.inf)
    return dist, valid, squeeze


def softmax(logits: np.ndarray, mask=None, *, empty_row: str = "zeros") -> np.ndarray:
    """Exact softmax in float64 over the last axis of (R, N) or (H, R, N) float logits.

    mask: bool, True = element takes part (masked elements get 0 and take no part in the max); a row with no
    valid element becomes zeros (``empty_row="zeros"``) or 1/N (``"uniform"``, the seed's safe_normalize).
    """
    dist, valid, squeeze = float_distances(logits, mask)
    p = _normalise(np.where(valid, np.exp(-np.where(valid, dist, 0.0)), 0.0), valid, empty_row)
    return p[0] if squeeze else p


def hccs_float(logits: np.ndarray, c, mask=None, *, empty_row: str = "zeros") -> np.ndarray:
    """Seed 003's HCCS in float64: max-centre, clip at -c, shift by +c, divide by the row sum.

    logits: float (R, N) or (H, R, N); c: clip range > 0 in logit units, a float or one per head; mask and
    empty_row as :func:`softmax`. Rows always have the max element at weight c > 0, so only rows without a
    valid element need the empty-row policy (the seed adds 1e-8 to the denominator instead; not needed here).
    """
    dist, valid, squeeze = float_distances(logits, mask)
    c = _float_per_head("c", c, dist.shape[0], positive=True)[:, None, None]
    score = np.where(valid, c - np.minimum(dist, c), 0.0)
    p = _normalise(score, valid, empty_row)
    return p[0] if squeeze else p


def hccs_float_bsd(logits: np.ndarray, B, S, dmax, mask=None, *, empty_row: str = "zeros") -> np.ndarray:
    """The paper's three-parameter clipped-linear family in float64: score = B - S*min(m - x, dmax), normalised.

    B, S, dmax: floats in logit units (one or per head) with B - S*dmax >= 0 and B > 0. With S = 1 and
    B = dmax = c it equals :func:`hccs_float`. This is what the integer kernel computes before its rounding.
    """
    dist, valid, squeeze = float_distances(logits, mask)
    heads = dist.shape[0]
    B = _float_per_head("B", B, heads, positive=True)
    S = _float_per_head("S", S, heads)
    dmax = _float_per_head("dmax", dmax, heads)
    for h in np.flatnonzero(B - S * dmax < 0):
        raise ValueError(f"head {h}: B - S*dmax = {B[h]} - {S[h]}*{dmax[h]} < 0; rule B >= S*dmax")
    score = np.where(valid, B[:, None, None] - S[:, None, None] * np.minimum(dist, dmax[:, None, None]), 0.0)
    p = _normalise(score, valid, empty_row)
    return p[0] if squeeze else p


def _float_per_head(name: str, value, heads: int, *, positive: bool = False) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.size == 1:
        arr = np.repeat(arr, heads)
    if arr.size != heads:
        raise ValueError(f"{name}: expected one value or {heads} per-head values, got {arr.size}")
    bad = ~np.isfinite(arr) | ((arr <= 0) if positive else (arr < 0))
    if bad.any():
        h = int(np.flatnonzero(bad)[0])
        rule = "> 0" if positive else ">= 0"
        raise ValueError(f"{name}: head {h} value {arr[h]} must be finite and {rule}")
    return arr
