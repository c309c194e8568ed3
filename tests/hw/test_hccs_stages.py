"""The stages of the HCCS unit (hw/hccs.py) one by one in Amaranth's own simulator: each against the numpy
specification's step it implements (somatile.model.hccs) or its formula, at the latency its constant states.
The whole unit is checked bit- and cycle-exact in Verilator (tests/hw/test_hccs.py)."""

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from somatile.hw.hccs import (BANK_LATENCY, BANKS, DISTANCE_LATENCY, MEMORY_READ_LATENCY, ROW_TOTAL_LATENCY,
                              SCALE_LATENCY, BankRing, BankState, CappedDistances, HCCSConfig, HeadTable, Ingest,
                              NormaliseReader, Reciprocal, RowMax, RowTotal, Scale, SumReader, SumTree,
                              reciprocal_cycles, reciprocal_latency, row_max_latency, sum_tag_layout, sum_tree_stages)
from somatile.model import hccs

LANE_MIN = -(1 << (hccs.INPUT_BITS - 1))
CFG = HCCSConfig(lanes=4, heads=3, n_max=16, out_type="int16")


def trace(dut, cycles, drive, sample):
    """``sample(ctx)`` in every cycle after ``drive(ctx, cycle)``: what the design shows before that cycle's
    clock edge, so an input driven in cycle c that passes k registers is seen at index c + k."""
    seen = []

    async def bench(ctx):
        for cycle in range(cycles):
            drive(ctx, cycle)
            seen.append(sample(ctx))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen


def fields(value, names):
    return tuple(int(getattr(value, name)) for name in names)


def random_params(rng, mode=None, out=None):
    return {"B": int(rng.integers(1, hccs.B_MAX + 1)), "S": int(rng.integers(0, hccs.S_MAX + 1)),
            "dmax": int(rng.integers(0, hccs.DMAX_MAX + 1)),
            "mode": int(rng.integers(0, 2)) if mode is None else mode,
            "out": int(rng.integers(0, 2)) if out is None else out}


@pytest.mark.parametrize("out_type", ["uint8", "int16"])
def test_head_table_holds_a_write_from_the_next_cycle_and_ignores_missing_heads(rng, out_type):
    cfg = HCCSConfig(lanes=4, heads=3, n_max=16, out_type=out_type)  # head 3 has a register but no head
    dut = HeadTable(cfg)
    writes = [(h, random_params(rng, out=1)) for h in (0, 2, 3, 0)]

    def drive(ctx, cycle):
        ctx.set(dut.cfg.valid, cycle < len(writes))
        if cycle < len(writes):
            ctx.set(dut.cfg.payload, {"head": writes[cycle][0], "params": writes[cycle][1]})

    names = ("B", "S", "dmax", "mode", "out")
    seen = trace(dut, len(writes) + 1, drive, lambda ctx: [fields(ctx.get(dut.view.params[h]), names)
                                                           for h in range(4)])
    expected = {h: (0,) * 5 for h in range(4)}
    for cycle, (head, params) in enumerate(writes):
        assert seen[cycle] == [expected[h] for h in range(4)]
        if head < cfg.heads:
            expected[head] = tuple(params[n] for n in names[:4]) + (params["out"] if out_type == "int16" else 0,)
    assert seen[-1] == [expected[h] for h in range(4)]


def test_bank_ring_applies_each_event_after_its_latency():
    dut = BankRing(CFG)
    events = [("closed", {"bank": 2, "final": 3, "single": 0, "double": 0, "head": 1,
                          "params": {"B": 900, "S": 5, "dmax": 7, "mode": 1, "out": 1}}, BankState.FILLING),
              ("full", {"bank": 2, "max": -17}, BankState.FULL), ("summing", {"bank": 2}, BankState.SUMMING),
              ("summed", {"bank": 2, "total": 12345}, BankState.SUMMED),
              ("inverted", {"bank": 2, "inv": 99}, BankState.READY), ("freed", {"bank": 2}, BankState.FREE)]

    def drive(ctx, cycle):
        for k, (name, payload, _) in enumerate(events):
            ctx.set(getattr(dut, name).valid, k == cycle)
            if k == cycle:
                ctx.set(getattr(dut, name).payload, payload)

    seen = trace(dut, len(events) + BANK_LATENCY, drive,
                 lambda ctx: (ctx.get(dut.view.row[2]), [ctx.get(dut.view.row[b].state) for b in range(BANKS)],
                              ctx.get(dut.busy)))
    assert seen[0][1] == [BankState.FREE] * BANKS and not seen[0][2]
    for k, (_, payload, state) in enumerate(events):
        row, states, busy = seen[k + BANK_LATENCY]
        assert states == [state if b == 2 else BankState.FREE for b in range(BANKS)]
        assert busy == (state != BankState.FREE)
        for name, value in payload.items():
            if name not in ("bank", "params"):
                assert int(getattr(row, name)) == value, name
    row = seen[-1][0]
    assert (row.final, row.head, row.params.B, row.params.S, row.max, row.total, row.inv) == (3, 1, 900, 5, -17,
                                                                                            12345, 99)


def test_ingest_writes_rows_frames_them_and_flags_overflow_framing_and_missing_heads(rng):
    cfg = HCCSConfig(lanes=4, heads=3, n_max=8)  # two beats a row, head 3 missing
    dut = Ingest(cfg)
    head_params = [random_params(rng) for _ in range(4)]
    # (head, first, last): a two-beat row, a three-beat row (one beat too many), a row for head 3 without first.
    beats = [(1, 1, 0), (1, 0, 1), (2, 1, 0), (2, 0, 0), (2, 0, 1), (3, 0, 1)]
    data = rng.integers(-128, 128, (len(beats), cfg.lanes))
    masks = rng.integers(0, 1 << cfg.lanes, len(beats))

    def drive(ctx, cycle):
        for h, p in enumerate(head_params):
            ctx.set(dut.heads.params[h], p)
        ctx.set(dut.i.valid, cycle < len(beats))
        if cycle < len(beats):
            head, first, last = beats[cycle]
            ctx.set(dut.i.payload, {"data": [int(v) for v in data[cycle]], "mask": int(masks[cycle]), "first": first,
                                    "last": last, "head": head})

    def sample(ctx):
        return (ctx.get(dut.i.ready), ctx.get(dut.wr.en), ctx.get(dut.wr.addr), ctx.get(dut.wr.data),
                ctx.get(dut.closed.valid), ctx.get(dut.closed.payload), ctx.get(dut.beat.valid),
                ctx.get(dut.beat.payload), ctx.get(dut.status))

    seen = trace(dut, len(beats) + 1, drive, sample)
    stored = [0, 1, 0, 1, None, 0]  # the row's beat index, None for the dropped beat
    banks = [0, 0, 1, 1, 1, 2]
    for cycle, (head, first, last) in enumerate(beats):
        ready, wr_en, wr_addr, wr_data, closed_valid, closed, beat_valid, beat, _ = seen[cycle]
        assert ready and beat_valid and wr_en == (stored[cycle] is not None)
        lanes = [int(v) if masks[cycle] >> j & 1 and stored[cycle] is not None else LANE_MIN
                 for j, v in enumerate(data[cycle])]
        assert [int(v) for v in beat.lanes] == lanes
        assert (beat.start, beat.last, beat.bank) == (first if cycle != 5 else 1, last, banks[cycle])
        if wr_en:
            assert wr_addr == banks[cycle] << 1 | stored[cycle]
            assert [int(v) for v in wr_data.data] == list(data[cycle]) and wr_data.mask == masks[cycle]
        assert closed_valid == last
        if last:
            final = {1: 1, 4: 1, 5: 0}[cycle]
            assert fields(closed, ("bank", "final", "single", "double", "head")) == (banks[cycle], final, final == 0,
                                                                                     final == 1, head)
            want = head_params[head] if head < cfg.heads else dict.fromkeys(head_params[0], 0)
            assert fields(closed.params, want) == tuple(want.values())
    flags = [fields(s[8], ("overflow", "framing", "bad_head")) for s in seen]
    assert flags[4] == (0, 0, 0) and flags[5] == (1, 0, 0) and flags[6] == (1, 1, 1)


def test_ingest_ready_falls_the_cycle_after_a_row_closes_on_a_bank_before_a_busy_one():
    dut = Ingest(CFG)

    def drive(ctx, cycle):
        ctx.set(dut.banks.row[1].state, BankState.READY)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, {"mask": 0xF, "first": 1, "last": 1})

    seen = trace(dut, 3, drive, lambda ctx: ctx.get(dut.i.ready))
    assert seen == [1, 0, 0]


def test_row_max_gives_each_rows_masked_maximum_after_its_latency(rng):
    for lanes in (1, 4, 8):
        cfg = HCCSConfig(lanes=lanes, n_max=8 * lanes)
        dut = RowMax(cfg)
        schedule, rows = [], []  # per cycle a beat (row, start, last, lanes) or None (an idle cycle)
        for r in range(12):
            beats = int(rng.integers(1, 4))
            x = rng.integers(-128, 128, (beats, lanes))
            x[rng.random(x.shape) < 0.4] = LANE_MIN  # masked lanes arrive as the lowest int8
            rows.append(int(x.max()))
            for k in range(beats):
                schedule.append((r, k == 0, k == beats - 1, x[k]))
                if rng.random() < 0.3:  # an idle cycle: start is 1 only between rows, as ingest gives it
                    schedule.append((None, k == beats - 1))

        def drive(ctx, cycle):
            beat = schedule[cycle] if cycle < len(schedule) else (None, 1)
            ctx.set(dut.beat.valid, beat[0] is not None)
            if beat[0] is None:
                ctx.set(dut.beat.payload.start, beat[1])
            else:
                r, start, last, x = beat
                ctx.set(dut.beat.payload, {"start": start, "last": last, "bank": r % BANKS,
                                           "lanes": [int(v) for v in x]})

        seen = trace(dut, len(schedule) + row_max_latency(cfg) + 1, drive,
                     lambda ctx: (ctx.get(dut.full.valid), ctx.get(dut.full.payload)))
        lasts = [c for c, b in enumerate(schedule) if b[0] is not None and b[2]]
        fired = [c for c, (valid, _) in enumerate(seen) if valid]
        assert fired == [c + row_max_latency(cfg) for c in lasts]
        assert [(int(seen[c][1].bank), int(seen[c][1].max)) for c in fired] == [(r % BANKS, m)
                                                                                  for r, m in enumerate(rows)]


def reader_with_memory(reader, cfg, words):
    m = Module()
    m.submodules.reader = reader
    m.submodules.rows = rows = Memory(shape=reader.rd.data.shape(), depth=len(words), init=words)
    wiring.connect(m, reader.rd, rows.read_port())
    return m


def memory_words(rng, cfg, depth):
    return [{"data": [int(v) for v in rng.integers(-128, 128, cfg.lanes)], "mask": int(rng.integers(0, 16))}
            for _ in range(depth)]


def test_sum_reader_reads_full_banks_in_ring_order_with_their_max_and_cap(rng):
    cfg = HCCSConfig(lanes=4, heads=3, n_max=16)  # four beats a bank
    words = memory_words(rng, cfg, BANKS * 4)
    finals = {0: 2, 1: 0, 2: 3}
    reader = SumReader(cfg)
    dut = reader_with_memory(reader, cfg, words)

    def drive(ctx, cycle):
        for b, final in finals.items():
            ctx.set(reader.banks.row[b], {"state": BankState.FULL, "final": final, "single": final == 0,
                                          "double": final == 1, "max": 10 * b - 5, "params": {"dmax": b + 3}})

    seen = trace(dut, 12, drive, lambda ctx: (ctx.get(reader.o.valid), ctx.get(reader.o.payload),
                                              ctx.get(reader.release.valid), ctx.get(reader.release.payload)))
    order = [(b, k) for b, final in finals.items() for k in range(final + 1)]
    beats = [c for c, s in enumerate(seen) if s[0]]
    assert beats == [c + MEMORY_READ_LATENCY for c in range(len(order))]
    for c, (b, k) in zip(beats, order):
        beat = seen[c][1]
        assert fields(beat.tag, ("first", "last", "bank")) == (k == 0, k == finals[b], b)
        assert (int(beat.max), int(beat.dmax)) == (10 * b - 5, b + 3)
        assert [int(v) for v in beat.word.data] == words[4 * b + k]["data"]
    released = [(c, int(s[3].bank)) for c, s in enumerate(seen) if s[2]]
    assert released == [(c - MEMORY_READ_LATENCY, b) for c, (b, k) in zip(beats, order) if k == finals[b]]


def test_normalise_reader_holds_its_beats_while_stalled_and_frees_each_bank_once(rng):
    cfg = HCCSConfig(lanes=4, heads=3, n_max=16)
    words = memory_words(rng, cfg, BANKS * 4)
    finals = {0: 3, 1: 0, 2: 1, 3: 2}
    params = {b: random_params(rng) for b in finals}
    reader = NormaliseReader(cfg)
    dut = reader_with_memory(reader, cfg, words)
    ready = rng.random(60) < 0.6

    def drive(ctx, cycle):
        ctx.set(reader.o.ready, bool(ready[cycle]))
        for b, final in finals.items():
            ctx.set(reader.banks.row[b], {"state": BankState.READY, "final": final, "single": final == 0,
                                          "double": final == 1, "max": b, "head": b % 3, "params": params[b],
                                          "inv": 1000 + b})

    seen = trace(dut, len(ready), drive, lambda ctx: (ctx.get(reader.o.valid) and ctx.get(reader.o.ready),
                                                      ctx.get(reader.o.payload), ctx.get(reader.release.valid),
                                                      ctx.get(reader.release.payload)))
    taken = [s[1] for s in seen if s[0]]
    order = [(b, k) for b, final in finals.items() for k in range(final + 1)]
    assert len(taken) >= len(order)
    for beat, (b, k) in zip(taken, order):
        assert fields(beat.tag, ("first", "last", "head", "out", "B", "S", "inv")) == (
            k == 0, k == finals[b], b % 3, params[b]["out"], params[b]["B"], params[b]["S"], 1000 + b)
        assert (int(beat.max), int(beat.dmax)) == (b, params[b]["dmax"])
        assert [int(v) for v in beat.word.data] == words[4 * b + k]["data"]
    assert [int(s[3].bank) for s in seen if s[2]][:BANKS] == list(range(BANKS))


def distances(row_max, dmax, data, mask):
    """The specification's d = min(m - x, dmax), 0 where masked."""
    return [min(row_max - x, dmax) if mask >> j & 1 else 0 for j, x in enumerate(data)]


@pytest.mark.parametrize("always_ready", [True, False])
def test_capped_distances_match_the_specification_at_their_latency_and_hold_when_stalled(rng, always_ready):
    tag = sum_tag_layout(CFG)
    dut = CappedDistances(CFG, tag, always_ready=always_ready)
    n = 40
    beats = [{"tag": {"first": int(rng.integers(0, 2)), "last": int(rng.integers(0, 2)), "bank": i % BANKS},
              "max": int(rng.integers(-128, 128)), "dmax": int(rng.integers(0, 128)),
              "word": {"data": [int(v) for v in rng.integers(-128, 128, CFG.lanes)], "mask": int(rng.integers(0, 16))}}
             for i in range(n)]
    for beat in beats:  # x <= m, as in a row whose maximum is m
        beat["word"]["data"] = [min(x, beat["max"]) for x in beat["word"]["data"]]
    ready = np.ones(3 * n, bool) if always_ready else rng.random(3 * n) < 0.5
    sent = []

    def drive(ctx, cycle):
        if not always_ready:
            ctx.set(dut.o.ready, bool(ready[cycle]))
        k = len(sent)
        ctx.set(dut.i.valid, k < n)
        if k < n:
            ctx.set(dut.i.payload, beats[k])
            if always_ready or ctx.get(dut.i.ready):
                sent.append(cycle)

    seen = trace(dut, 3 * n, drive, lambda ctx: (ctx.get(dut.o.valid) and ctx.get(dut.o.ready),
                                                 ctx.get(dut.o.payload)))
    out = [s[1] for s in seen if s[0]]
    assert len(out) == n
    if always_ready:
        assert [c for c, s in enumerate(seen) if s[0]] == [c + DISTANCE_LATENCY for c in sent]
    for beat, got in zip(beats, out):
        want = distances(beat["max"], beat["dmax"], beat["word"]["data"], beat["word"]["mask"])
        assert [int(v) for v in got.d] == want and got.mask == beat["word"]["mask"]
        assert fields(got.tag, ("first", "last", "bank")) == tuple(beat["tag"].values())

@pytest.mark.parametrize("lanes", [4, 16])
def test_sum_tree_sums_distances_and_counts_lanes_after_its_stages(rng, lanes):
    cfg = HCCSConfig(lanes=lanes, n_max=4 * lanes)
    dut = SumTree(cfg)
    n = 30
    beats = [{"tag": {"first": i % 3 == 0, "last": i % 3 == 2, "bank": i % BANKS},
              "mask": int(rng.integers(0, 1 << lanes)), "d": [int(v) for v in rng.integers(0, hccs.DMAX_MAX + 1, lanes)]}
             for i in range(n)]

    def drive(ctx, cycle):
        ctx.set(dut.i.valid, cycle < n)
        if cycle < n:
            ctx.set(dut.i.payload, beats[cycle])

    seen = trace(dut, n + sum_tree_stages(cfg), drive, lambda ctx: (ctx.get(dut.o.valid), ctx.get(dut.o.payload)))
    assert [c for c, s in enumerate(seen) if s[0]] == [c + sum_tree_stages(cfg) for c in range(n)]
    for beat, (_, got) in zip(beats, seen[sum_tree_stages(cfg):]):
        # The tree adds every lane's d: masked lanes already carry 0 (CappedDistances).
        assert (got.dsum, got.count) == (sum(beat["d"]), bin(beat["mask"]).count("1"))
        assert fields(got, ("first", "last", "bank")) == tuple(beat["tag"].values())


def test_row_total_is_the_rows_score_sum_after_its_latency(rng):
    cfg = HCCSConfig(lanes=4, heads=3, n_max=64)
    dut = RowTotal(cfg)
    params = {b: random_params(rng) for b in range(BANKS)}
    schedule, totals = [], []
    for r in range(10):
        b, beats = r % BANKS, int(rng.integers(1, 5))
        dsum, count = rng.integers(0, 4 * hccs.DMAX_MAX + 1, beats), rng.integers(0, 5, beats)
        totals.append((b, int(count.sum()) * params[b]["B"] - params[b]["S"] * int(dsum.sum())))
        schedule += [{"first": k == 0, "last": k == beats - 1, "bank": b, "dsum": int(dsum[k]), "count": int(count[k])}
                     for k in range(beats)]

    def drive(ctx, cycle):
        for b in range(BANKS):
            ctx.set(dut.banks.row[b].params, params[b])
        ctx.set(dut.i.valid, cycle < len(schedule))
        if cycle < len(schedule):
            ctx.set(dut.i.payload, schedule[cycle])

    seen = trace(dut, len(schedule) + ROW_TOTAL_LATENCY + 1, drive,
                 lambda ctx: (ctx.get(dut.summed.valid), ctx.get(dut.summed.payload)))
    lasts = [c for c, beat in enumerate(schedule) if beat["last"]]
    assert [c for c, s in enumerate(seen) if s[0]] == [c + ROW_TOTAL_LATENCY for c in lasts]
    mask = (1 << cfg.total_bits) - 1  # a total below 0 is outside the contract (B < S*Dmax); it wraps
    assert [(int(s[1].bank), int(s[1].total)) for s in seen if s[0]] == [(b, t & mask) for b, t in totals]


def model_reciprocal(total, mode, out):
    """Step 6 of the specification (model/hccs.py _hccs_spec) for one row total; 0 for a total of 0."""
    numerator = hccs.UINT8_NUMERATOR if out == hccs.OUT_UINT8 else hccs.INT16_NUMERATOR
    if total == 0:
        return 0
    if mode == hccs.MODE_DIV:
        return numerator // total
    return numerator >> int(hccs.floor_log2(np.array([total]))[0])


@pytest.mark.parametrize("div_bits", [1, 2, 3])
def test_reciprocal_matches_the_specification_at_its_latency_and_occupancy(rng, div_bits):
    cfg = HCCSConfig(lanes=4, n_max=64, div_bits=div_bits)
    dut = Reciprocal(cfg)
    pairs = [(mode, out) for mode in (hccs.MODE_DIV, hccs.MODE_CLB) for out in (hccs.OUT_UINT8, hccs.OUT_INT16)]
    totals = [1, 0, 256, int(rng.integers(1, 64 * hccs.B_MAX))]
    for rotation in range(2):
        cases = [(pairs[(b + rotation) % 4], totals[(b + 2 * rotation) % 4]) for b in range(BANKS)]

        def drive(ctx, cycle):
            for b, ((mode, out), total) in enumerate(cases):
                ctx.set(dut.banks.row[b], {"state": BankState.SUMMED, "total": total,
                                           "params": {"mode": mode, "out": out}})

        names = [({v: k for k, v in hccs.MODE_CODES.items()}[mode], {v: k for k, v in hccs.OUT_CODES.items()}[out])
                 for (mode, out), _ in cases]
        cycles = sum(reciprocal_cycles(cfg, *name) for name in names)
        seen = trace(dut, cycles, drive, lambda ctx: (ctx.get(dut.inverted.valid), ctx.get(dut.inverted.payload)))
        fired = [c for c, s in enumerate(seen) if s[0]]
        want, start = [], 0
        for name in names:
            want.append(start + reciprocal_latency(cfg, *name))
            start += reciprocal_cycles(cfg, *name)
        assert fired == want
        assert [(int(seen[c][1].bank), int(seen[c][1].inv)) for c in fired] == [
            (b, model_reciprocal(total, mode, out)) for b, ((mode, out), total) in enumerate(cases)]


def test_scale_matches_the_specification_at_its_latency_and_holds_when_stalled(rng):
    cfg = HCCSConfig(lanes=4, heads=3, n_max=16, out_type="int16")
    dut = Scale(cfg)
    n = 50
    beats = []
    for i in range(n):
        params = random_params(rng)
        d = [int(v) for v in rng.integers(0, params["dmax"] + 1, cfg.lanes)]
        S = min(params["S"], params["B"] // max(params["dmax"], 1))  # B - S*d >= 0 (the model's rules)
        mask = int(rng.integers(0, 16))
        # The row's total is at least this beat's scores (score * inv within PRODUCT_BITS, as in a real row).
        total = sum(params["B"] - S * dj for j, dj in enumerate(d) if mask >> j & 1) + int(rng.integers(0, 999))
        inv = model_reciprocal(total, params["mode"], params["out"])
        beats.append({"tag": {"first": i % 2 == 0, "last": i % 2 == 1, "head": i % 3, "out": params["out"],
                              "B": params["B"], "S": S, "inv": inv}, "mask": mask, "d": d})
    ready = np.concatenate([np.ones(n, bool), rng.random(3 * n) < 0.5])
    sent = []

    def drive(ctx, cycle):
        ctx.set(dut.o.ready, bool(ready[cycle]))
        k = len(sent)
        ctx.set(dut.i.valid, k < n)
        if k < n:
            ctx.set(dut.i.payload, beats[k])
            if ctx.get(dut.i.ready):
                sent.append(cycle)

    seen = trace(dut, len(ready), drive, lambda ctx: (ctx.get(dut.o.valid) and ctx.get(dut.o.ready),
                                                      ctx.get(dut.o.payload)))
    taken = [c for c, s in enumerate(seen) if s[0]]
    assert len(taken) == n
    assert taken[:10] == [c + SCALE_LATENCY for c in sent[:10]]  # o ready in the first cycles: latency alone
    for beat, c in zip(beats, taken):
        got, tag = seen[c][1], beat["tag"]
        for j in range(cfg.lanes):
            score = tag["B"] - tag["S"] * beat["d"][j] if beat["mask"] >> j & 1 else 0
            product = score * tag["inv"]  # the specification's steps 7 and 8
            want = min(product, hccs.INT16_MAX) if tag["out"] == hccs.OUT_INT16 else min(product >> hccs.INV_SHIFT,
                                                                                        hccs.UINT8_MAX)
            assert int(got.data[j]) == want
        assert (got.mask, got.first, got.last, got.head) == (beat["mask"], tag["first"], tag["last"], tag["head"])
