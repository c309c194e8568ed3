"""The pipeline helpers of hw/pipe.py (arithmetic, skid buffer) and the row normaliser of hw/soma.py in Amaranth's own simulator:
exact results against Python integers and the integer models, and the latencies their docstrings state."""

import numpy as np
import pytest
from amaranth.hdl import Cat, Const, Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from somatile.hw.pipe import (OffsetCounter, floor_log2, lut_mul, lut_mul_pipelined, minus_aligned, round_shift,
                              skid_buffer, split_mul)
from somatile.hw.soma import RowNormaliser, normaliser_cycles, normaliser_lead_cycles
from somatile.model import hccs, intexp, soma_int


def test_split_mul_round_shift_and_floor_log2_are_exact_at_their_latencies(rng):
    # round_shift in one step and in two (by the amount's multiple of 8, then its low bits)
    m = Module()
    a, b, shift, u = Signal(signed(32)), Signal(unsigned(15)), Signal(range(48)), Signal(32)
    product = split_mul(m, a, b, "p")                    # latency 3 (operands registered)
    rounded = round_shift(m, a, shift, 47, "r")          # latency 2
    two_step = round_shift(m, a, shift, 47, "r2", steps=2)  # latency 3
    log2 = floor_log2(m, u, "lg")                        # latency 2
    cases = list(zip(rng.integers(-2**31, 2**31, 200), rng.integers(0, 2**15, 200), rng.integers(0, 48, 200),
                     rng.integers(0, 2**32, 200) >> rng.integers(0, 33, 200)))
    cases += [(-2**31, 2**15 - 1, 47, 0), (2**31 - 1, 2**15 - 1, 0, 1), (-1, 1, 1, 2**31)]
    got = []

    async def bench(ctx):
        for av, bv, sv, uv in cases:
            ctx.set(shift, int(sv))  # round_shift's shift is held from the cycle before x (as parameters are)
            await ctx.tick()
            ctx.set(a, int(av)), ctx.set(b, int(bv)), ctx.set(u, int(uv))
            await ctx.tick().repeat(2)
            at_two = (ctx.get(rounded), ctx.get(log2))
            await ctx.tick()
            got.append((ctx.get(product), *at_two, ctx.get(two_step)))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    for (av, bv, sv, uv), (p, r, lg, r2) in zip(cases, got):
        av, bv, sv, uv = int(av), int(bv), int(sv), int(uv)
        assert p == av * bv
        assert r == r2 == int(soma_int.rshift_round(np.int64(av), np.int64(sv)))
        assert lg == max(uv.bit_length() - 1, 0)


def test_offset_counter_copies_hold_the_count_minus_their_offsets_modulo_their_width():
    m = Module()
    counter = OffsetCounter(unsigned(4), (0, 3, 9), "c")
    go, start = Signal(), Signal()
    with m.If(start):
        m.d.sync += counter.set(2)
    with m.Elif(go):
        m.d.sync += counter.increment()
    seen = []

    async def bench(ctx):
        ctx.set(start, 1)
        await ctx.tick()
        ctx.set(start, 0), ctx.set(go, 1)
        for _ in range(20):
            seen.append([ctx.get(counter.at(i)) for i in range(3)])
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [[(2 + t - offset) % 16 for offset in (0, 3, 9)] for t in range(20)]


def test_lut_mul_is_exact_for_every_8_bit_operand_pair_and_signedness():
    """lut_mul (partial products of ``a`` by the bits of ``b``) over all 65,536 pairs of 8-bit operands, for
    each of the four signedness combinations, against Python's product: the sign bit of a signed ``b`` is the
    one term subtracted."""
    m = Module()
    shapes = [(signed(8), signed(8)), (signed(8), unsigned(8)), (unsigned(8), signed(8)), (unsigned(8), unsigned(8))]
    pairs = [(Signal(sa), Signal(sb)) for sa, sb in shapes]
    outs = [Signal(signed(18)) for _ in shapes]
    for (a, b), out in zip(pairs, outs):
        m.d.comb += out.eq(lut_mul(a, b))
    mismatches = []

    async def bench(ctx):
        for x in range(256):
            for y in range(256):
                for (a, b), out in zip(pairs, outs):
                    ctx.set(a, x), ctx.set(b, y)
                for (a, b), out in zip(pairs, outs):
                    av = x - 256 if a.shape().signed and x > 127 else x
                    bv = y - 256 if b.shape().signed and y > 127 else y
                    if ctx.get(out) != av * bv:
                        mismatches.append((a.shape(), b.shape(), av, bv, ctx.get(out)))
            await ctx.delay(1e-9)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not mismatches, mismatches[:5]


def test_lut_mul_pipelined_is_exact_two_cycles_after_its_operands(rng):
    """lut_mul_pipelined (pairs of partial products registered, then their sum) for a 16-bit signed ``a``
    by an 8-bit signed ``b``, as the query gate uses it: a new pair every cycle, each product exactly two
    cycles later."""
    m = Module()
    a, b = Signal(signed(16)), Signal(signed(8))
    product = lut_mul_pipelined(m, a, b, "p", signed(24))
    cases = [(int(x), int(y)) for x, y in zip(rng.integers(-2**15, 2**15, 300), rng.integers(-128, 128, 300))]
    cases += [(-2**15, -128), (2**15 - 1, 127), (-2**15, 127), (0, -128)]
    got = []

    async def bench(ctx):
        for i in range(len(cases) + 2):
            if i < len(cases):
                ctx.set(a, cases[i][0]), ctx.set(b, cases[i][1])
            await ctx.tick()
            if i >= 1:
                got.append(ctx.get(product))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    # Pair i is set before tick i; its partial sums are registered at tick i and its product at tick i + 1,
    # which is what got[i] (read after tick i + 1) holds.
    assert got[:len(cases)] == [x * y for x, y in cases]


def test_minus_aligned_is_value_minus_k_wrapped_a_cycle_later(rng):
    """value - k with the value's low bits constant (0, or the first result's, fed to a second step), wrapped
    to an unsigned and a signed shape, as a register would hold it, one cycle after the value."""
    m = Module()
    value = Signal(unsigned(12))  # multiples of 16: its low 4 bits are 0
    first, rest = minus_aligned(m, Cat(Const(0, 4), value[4:]), 4, 4, "first", signed(14))
    second, _ = minus_aligned(m, first, 4, 4, "second", signed(15), rest)
    wrapped, _ = minus_aligned(m, Cat(Const(0, 4), value[4:]), 1, 4, "wrapped", unsigned(12))
    cases = [0, 16, 4080] + [int(v) << 4 for v in rng.integers(0, 256, 40)]
    got = []

    async def bench(ctx):
        for v in cases:
            ctx.set(value, v)
            await ctx.tick()
            got.append((ctx.get(first), ctx.get(wrapped)))
            await ctx.tick()
            got.append(ctx.get(second))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert rest == 12
    for i, v in enumerate(cases):
        assert got[2 * i] == (v - 4, (v - 1) % 4096), v
        assert got[2 * i + 1] == v - 8, v


@pytest.mark.parametrize("mode, sum_lanes", [("exp", 1), ("div", 1), ("clb", 1), ("exp_only", 1), ("exp_only", 4)])
def test_row_normaliser_is_bit_exact_in_normaliser_cycles(mode, sum_lanes, rng):
    """Every mode of the full normaliser, and the exp-only one the decode unit builds (without HCCS ports),
    also with a SUM pass of 4 elements a cycle (the longest row first, so that the shorter rows' last groups
    hold the earlier row's elements past their ends, which must not count). As in the decode unit, a row's last
    element is written in the start cycle, and it is the row's maximum (the passes' maximum must include it);
    the rows go to alternate banks (``row_bank``)."""
    n_max = 24
    exp_only = mode == "exp_only"
    dut = RowNormaliser(n_max, exp_only=exp_only, sum_lanes=sum_lanes)
    if exp_only:
        mode = "exp"
        assert not {"use_exp", "clb", "out16", "B", "S", "dmax"} & set(dut.signature.members)
    sizes = (1, 7, n_max) if sum_lanes == 1 else (n_max, 7, 1, 6)
    rows = [rng.integers(-128, 128, n).astype(np.int8) for n in sizes]
    masks = [rng.random(n) < 0.85 if n > 1 else np.ones(1, bool) for n in sizes]
    for x, valid in zip(rows, masks):
        x[-1], valid[-1] = 127, True
    B, S, dmax, mult = 40, 1, 12, 2900
    results = []

    async def bench(ctx):
        for r, (x, valid) in enumerate(zip(rows, masks)):
            ctx.set(dut.row_bank, r % 2)
            for i, (xi, vi) in enumerate(zip(x, valid)):
                ctx.set(dut.row_we, 1), ctx.set(dut.row_index, i), ctx.set(dut.row_x, int(xi))
                ctx.set(dut.row_valid, int(vi))
                if i < len(x) - 1:
                    await ctx.tick()
            for port, value in (("count", len(x)), ("use_exp", mode == "exp"), ("clb", mode == "clb"),
                                ("out16", 0), ("B", B), ("S", S), ("dmax", dmax), ("exp_mult", mult)):
                if port in dut.signature.members:
                    ctx.set(getattr(dut, port), int(value))
            ctx.set(dut.start, 1)  # beside the last element's write
            await ctx.tick()
            ctx.set(dut.start, 0), ctx.set(dut.row_we, 0)
            cycles, done_at = 1, None

            async def tick():
                # One cycle on; remembers the cycle of the done pulse (a row of one: the same as first_out's).
                nonlocal cycles, done_at
                await ctx.tick()
                cycles += 1
                if ctx.get(dut.done):
                    done_at = cycles

            while not ctx.get(dut.first_out):
                await tick()
            lead = cycles
            # Read as the decode unit does, behind the OUT pass's writes: index i from i cycles after first_out
            # on (here exactly then: the earliest the contract allows), one a cycle.
            probs = []
            for i in range(len(x)):
                ctx.set(dut.prob_index, i)
                await tick()
                probs.append(ctx.get(dut.prob))   # one-cycle read
            while done_at is None:
                await tick()
            results.append((done_at, lead, probs))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    for x, valid, (cycles, lead, probs) in zip(rows, masks, results):
        want = np.zeros(len(x), np.int32)
        if mode == "exp":
            intexp.intexp_row(x, valid, mult, intexp.OUT_UINT8, want)
        else:
            hccs.hccs_row(x, valid, B, S, dmax, hccs.MODE_CODES[mode], hccs.OUT_UINT8, want)
        assert probs == want.tolist()
        assert cycles == normaliser_cycles(len(x), exp_only, sum_lanes)
        assert lead == normaliser_lead_cycles(len(x), exp_only, sum_lanes)


def test_skid_buffer_passes_every_beat_once_in_order_under_random_stalls(rng):
    m = Module()
    valid, payload, ready_out = Signal(), Signal(16), Signal()
    ready, out_valid, out_payload = skid_buffer(m, valid, payload, ready_out, "s")
    sent, received = [], []
    beats = [int(b) for b in rng.integers(0, 2**16, 300)]
    stalls_in, stalls_out = rng.random(2000) < 0.3, rng.random(2000) < 0.4

    async def bench(ctx):
        i = 0
        for cycle in range(2000):
            offer = i < len(beats) and not stalls_in[cycle]
            ctx.set(valid, offer)
            ctx.set(payload, beats[i] if i < len(beats) else 0)
            ctx.set(ready_out, not stalls_out[cycle])
            if ctx.get(out_valid) and not stalls_out[cycle]:
                received.append(ctx.get(out_payload))
            if offer and ctx.get(ready):
                sent.append(beats[i])
                i += 1
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert sent == beats            # the producer got every beat out
    assert received == beats        # each arrived once, in order


def test_skid_buffer_runs_at_one_beat_per_cycle_with_one_cycle_latency():
    m = Module()
    valid, payload, ready_out = Signal(), Signal(8), Signal()
    ready, out_valid, out_payload = skid_buffer(m, valid, payload, ready_out, "s")
    seen = []

    async def bench(ctx):
        ctx.set(ready_out, 1)
        for cycle in range(12):
            ctx.set(valid, cycle < 10)
            ctx.set(payload, cycle)
            seen.append((ctx.get(ready), ctx.get(out_valid), ctx.get(out_payload)))
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert all(r for r, _, _ in seen)                                   # never stalls the producer
    assert [p for _, v, p in seen if v] == list(range(10))               # beat c leaves in cycle c + 1
    assert [v for _, v, _ in seen] == [0] + [1] * 10 + [0]


def test_row_normaliser_refuses_a_multi_lane_sum_without_exp_only():
    with pytest.raises(ValueError, match="sum_lanes 4: expected 1, or a power of two when exp_only"):
        RowNormaliser(24, sum_lanes=4)
    with pytest.raises(ValueError, match="sum_lanes 3"):
        RowNormaliser(24, exp_only=True, sum_lanes=3)


def test_round_shift_refuses_three_steps():
    with pytest.raises(ValueError, match="round_shift r: steps 3"):
        round_shift(Module(), Signal(signed(8)), Signal(3), 7, "r", steps=3)
