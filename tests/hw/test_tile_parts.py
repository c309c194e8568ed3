"""The tile's parts in the Amaranth simulator, each against the golden tile model (hw/tile_model.py) or a direct
formula, read at the latency its constant states: the command front end (hw/tile_front.py), the head
registers (hw/tile_heads.py), the response streamer (hw/tile_response.py) and the payload writer
(hw/tile_payload.py)."""

import dataclasses
import struct

import numpy as np
import pytest
from amaranth.sim import Simulator

from somatile.hw import regmap, tile_model
from somatile.hw.regmap import HEAD_INDEX, HEAD_PARAMS, ErrorCode, Opcode, TileParams
from somatile.hw.tile_front import CHECK_SETTLE, PARAMS_DELAY, CommandFront
from somatile.hw.tile_heads import (BLOCK_BYTES, CONFIG_SETTLE, DECODING_COPIES, NEXT_LATENCY, SELECT_LATENCY,
                                     HeadRegisters)
from somatile.hw.tile_payload import WRITE_LATENCY, PayloadWriter
from somatile.hw.tile_response import ResponseStreamer, header_wait
from somatile.sim import run_soma

SMALL = TileParams(lanes=8, stream_width=32, local_memory_bytes=8192, heads=4, ring=8, sinks=2, head_dim=16,
                   n_max=32)
WIDE = TileParams(lanes=32, stream_width=128, local_memory_bytes=16384, heads=4, ring=12, sinks=0,
                  head_dim=32, n_max=48, hccs_out="int16")
WIDE_PROFILE = dataclasses.replace(SMALL, profile="wide")


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def beats(data: bytes, width: int) -> list[int]:
    return [int.from_bytes(data[i:i + width], "little") for i in range(0, len(data), width)]


def block_values(normaliser="hccs_int", seed=0, **changes) -> list[int]:
    """A head parameter block the model accepts (a random config with this normaliser), with ``changes``."""
    cfg = run_soma.random_config(np.random.default_rng(seed), SMALL, normaliser=normaliser)
    values = tile_model.head_values(cfg)
    for name, value in changes.items():
        values[HEAD_INDEX[name]] = value
    return values


def test_front_end_flags_each_header_with_the_models_error_and_detail_after_check_settle():
    p = SMALL
    model = tile_model.TileModel(p)
    # Head 1 normalises with the integer exp: its HCCS parameters fail the rules of an HCCS command.
    for h, values in ((0, block_values(hccs_B=40, hccs_S=1, hccs_dmax=12)),
                      (1, block_values("exp_int"))):
        assert regmap.unpack_response(model.command(tile_model.configure_frame(h, values))).error == ErrorCode.OK
    D, n_pad = p.head_dim, regmap.padded(17)
    frames = [
        regmap.pack_command(Opcode.INFO, magic=0x5A),
        regmap.pack_command(0x7E, payload=bytes(16)),
        regmap.pack_command(Opcode.READ_STATE, head=p.heads),
        regmap.pack_command(Opcode.DECODE, head=p.heads - 1, count=2, payload=bytes(6 * D)),
        regmap.pack_command(Opcode.DECODE, head=0, count=0),
        regmap.pack_command(Opcode.REG_READ, arg0=0x0FC),
        regmap.pack_command(Opcode.REG_READ, arg0=0x000),
        regmap.pack_command(Opcode.REG_WRITE, arg0=0x000, arg1=1),
        regmap.pack_command(Opcode.HCCS, arg0=1, arg1=p.n_max + 1, payload=bytes(regmap.padded(p.n_max + 1))),
        regmap.pack_command(Opcode.HCCS, arg0=0, arg1=4),
        regmap.pack_command(Opcode.HCCS, head=2, arg0=1, arg1=4, payload=bytes(16)),  # not configured
        regmap.pack_command(Opcode.HCCS, head=1, arg0=1, arg1=4, payload=bytes(16)),  # rules fail
        regmap.pack_command(Opcode.HCCS, head=0, arg0=3, arg1=17, payload=bytes(3 * n_pad)),
        regmap.pack_command(Opcode.DECODE, count=1, payload=bytes(3 * D), length=16),
        regmap.pack_command(Opcode.DECODE, count=2, payload=bytes(6 * D)),
        tile_model.configure_frame(3, block_values()),
        regmap.pack_command(Opcode.LOAD_STATE, head=2, payload=bytes(regmap.state_bytes(p))),
        regmap.pack_command(Opcode.RESET_STATE, head=1, count=3),
        regmap.pack_command(Opcode.CLEAR_ERROR, length=4),
    ]
    seen = front_end_verdicts(p, model, frames)
    assert regmap.HEADER_BYTES // p.stream_bytes == 4
    errors = set()
    for response, opcode, check_error, check_failed, expected, no_payload, is_op, _ in seen:
        errors.add(response.error)
        assert check_error == response.error and check_failed == (response.error != 0), (opcode, response)
        if response.error == ErrorCode.BAD_LENGTH:
            assert expected == response.result
        if response.error == ErrorCode.OK:
            assert no_payload == (expected == 0)
        assert is_op == {op: int(op == opcode) for op in Opcode}
    assert seen[11][0].error == ErrorCode.BAD_ARGUMENT  # the exp head's HCCS rules
    assert errors == {ErrorCode.OK, ErrorCode.BAD_MAGIC, ErrorCode.UNKNOWN_OPCODE, ErrorCode.BAD_HEAD,
                      ErrorCode.BAD_REGISTER, ErrorCode.BAD_ARGUMENT, ErrorCode.NOT_CONFIGURED,
                      ErrorCode.BAD_LENGTH}


def front_end_verdicts(p, model, frames):
    """Each frame's header through the front end (the model's register, configuration and head-parameter
    verdicts on its inputs, at their latencies), beside the model's response: (response, opcode, check_error,
    check_failed, expected length, no_payload, opcode flags) per frame."""
    table = regmap.PROFILE_HEAD_PARAMS[p.profile]
    dut = CommandFront(p)
    SB = p.stream_bytes
    seen = []

    async def bench(ctx):
        for frame in frames:
            _, opcode, head, _, _, arg0, _ = struct.unpack_from("<BBBBIII", frame)
            configured = sum(1 << h for h, state in enumerate(model.heads) if state.configured)
            try:
                model.read_register(arg0)
                reg_ok = 1
            except tile_model.CommandError:
                reg_ok = 0
            params = model.heads[head].values if head < p.heads else [0] * len(table)
            response = regmap.unpack_response(model.command(frame))
            ctx.set(dut.restart, 1)
            await ctx.tick()
            ctx.set(dut.restart, 0)
            ctx.set(dut.reg_ok, reg_ok)
            ctx.set(dut.configured, configured)
            for beat in beats(frame[:regmap.HEADER_BYTES], SB):
                ctx.set(dut.beat, 1)
                ctx.set(dut.data, beat)
                await ctx.tick()
            ctx.set(dut.beat, 0)
            # The head's parameters arrive PARAMS_DELAY cycles after the header (stale values before).
            ctx.set(dut.head_params, {hp.name: 0 for hp in table})
            await ctx.tick().repeat(PARAMS_DELAY)
            ctx.set(dut.head_params, {hp.name: value for hp, value in zip(table, params)})
            await ctx.tick().repeat(CHECK_SETTLE - PARAMS_DELAY)
            seen.append((response, opcode, ctx.get(dut.check_error), ctx.get(dut.check_failed),
                         ctx.get(dut.length.expected), ctx.get(dut.no_payload),
                         {op: ctx.get(dut.is_op[op.name.lower()]) for op in Opcode},
                         {name: ctx.get(getattr(dut, name)) for name in ("n_pad", "hccs_bytes", "decode_out_bytes",
                                                                          "decode_out_words")}))

    run(dut, bench)
    return seen


def wide_block(kind="hccs_int", seed=0, **changes) -> list[int]:
    """A wide profile's head parameter block the model accepts (a random config with normaliser ``kind``), with
    ``changes`` (register values)."""
    cfg = run_soma.random_config(np.random.default_rng(seed), WIDE_PROFILE, normaliser=kind)
    table = regmap.PROFILE_HEAD_PARAMS["wide"]
    return [changes.get(hp.name, v) for hp, v in zip(table, tile_model.head_values(cfg))]


def test_the_wide_front_end_sizes_int16_rows_and_outputs_and_skips_the_paper_hccs_rules():
    """The wide profile: an HCCS row is padded(2 n) bytes (BAD_LENGTH's detail, the staging limit), the DECODE
    output 2 D bytes a head, and an HCCS command on any configured head passes (the wide rule is the one its
    CONFIGURE_HEAD passed, over no row length)."""
    p = WIDE_PROFILE
    model = tile_model.TileModel(p)
    for h, values in ((0, wide_block()), (1, wide_block("exp_int", 1)), (2, wide_block("pwl2_int", 2))):
        assert regmap.unpack_response(model.command(tile_model.configure_frame(h, values))).error == ErrorCode.OK
    row = regmap.hccs_row_bytes(p, 17)
    too_many = regmap.staging_bytes(p) // regmap.hccs_row_bytes(p, p.n_max) + 1
    frames = [
        regmap.pack_command(Opcode.HCCS, head=0, arg0=3, arg1=17, payload=bytes(3 * row)),
        regmap.pack_command(Opcode.HCCS, head=1, arg0=1, arg1=1, payload=bytes(16)),
        regmap.pack_command(Opcode.HCCS, head=2, arg0=2, arg1=p.n_max, payload=bytes(4 * p.n_max)),
        regmap.pack_command(Opcode.HCCS, head=2, arg0=3, arg1=17, payload=bytes(3 * regmap.padded(17))),
        regmap.pack_command(Opcode.HCCS, head=0, arg0=too_many, arg1=p.n_max),
        regmap.pack_command(Opcode.HCCS, head=3, arg0=1, arg1=4, payload=bytes(16)),  # not configured
        regmap.pack_command(Opcode.DECODE, head=0, count=3, payload=bytes(9 * p.head_dim)),
        regmap.pack_command(Opcode.DECODE, head=1, count=1, payload=bytes(3 * p.head_dim), length=16),
    ]
    seen = front_end_verdicts(p, model, frames)
    for response, opcode, check_error, check_failed, expected, no_payload, is_op, _ in seen:
        assert check_error == response.error and check_failed == (response.error != 0), (opcode, response)
        if response.error == ErrorCode.BAD_LENGTH:
            assert expected == response.result
    assert [r.error for r, *_ in seen] == [ErrorCode.OK, ErrorCode.OK, ErrorCode.OK, ErrorCode.BAD_LENGTH,
                                           ErrorCode.BAD_ARGUMENT, ErrorCode.NOT_CONFIGURED, ErrorCode.OK,
                                           ErrorCode.BAD_LENGTH]
    sizes = [entry[-1] for entry in seen]
    assert [s["hccs_bytes"] for s in sizes[:3]] == [3 * row, 16, 4 * p.n_max]
    assert [s["n_pad"] for s in sizes[:3]] == [24, 8, p.n_max]
    assert sizes[6]["decode_out_bytes"] == 3 * regmap.decode_out_bytes(p) == 6 * p.head_dim
    assert sizes[6]["decode_out_words"] == 6 * p.head_dim // p.word_bytes


def test_head_registers_take_a_block_the_model_accepts_and_refuse_the_others_after_config_settle():
    out_shift = HEAD_PARAMS[HEAD_INDEX["out_shift"]]
    gating, source = HEAD_PARAMS[HEAD_INDEX["gating"]], HEAD_PARAMS[HEAD_INDEX["field_source"]]
    blocks = [(0, block_values()), (1, block_values(seed=1, out_shift=out_shift.hi + 1)),
              (1, block_values(seed=2, gating=gating.choices.index("query"),
                               field_source=1 - source.choices.index("values"))),
              (2, block_values(hccs_B=40, hccs_S=4, hccs_dmax=12)), (2, block_values("exp_int", seed=3)),
              (3, block_values(seed=4, out_shift=out_shift.hi))]
    check_head_registers(SMALL, blocks, [ErrorCode.OK, ErrorCode.BAD_ARGUMENT, ErrorCode.BAD_ARGUMENT,
                                         ErrorCode.BAD_ARGUMENT, ErrorCode.OK, ErrorCode.OK])


def test_wide_head_registers_take_the_wide_table_and_its_hccs_rule():
    """The wide table's ranges (recency to 32767, B to 32768, S and dmax 16 bit, pwl2_int) and the wide HCCS
    rule (B >= 1, B - ((S dmax) >> 8) >= 0; pwl2 and exp take B = 0), as the model decides."""
    blocks = [(0, wide_block()), (1, wide_block("pwl2_int", 1, recency_int=32767)),
              (1, wide_block(seed=2, recency_int=32768)), (2, wide_block(seed=3, hccs_B=0)),
              (2, wide_block(seed=4, hccs_B=254, hccs_S=65535, hccs_dmax=1)),
              (2, wide_block(seed=5, hccs_B=255, hccs_S=65535, hccs_dmax=1)),
              (3, wide_block("exp_int", 6, hccs_B=0, hccs_S=65535, hccs_dmax=65535)),
              (3, wide_block(seed=7, hccs_B=32769)), (3, wide_block(seed=8, normaliser=3))]
    check_head_registers(WIDE_PROFILE, blocks, [ErrorCode.OK, ErrorCode.OK, ErrorCode.BAD_ARGUMENT,
                                                ErrorCode.BAD_ARGUMENT, ErrorCode.BAD_ARGUMENT, ErrorCode.OK,
                                                ErrorCode.OK, ErrorCode.BAD_ARGUMENT, ErrorCode.BAD_ARGUMENT])


def check_head_registers(p, blocks, verdicts_wanted):
    """Each (head, block) through the head registers beside the model (its verdicts ``verdicts_wanted``), then
    every head's selected and next parameters."""
    HEAD_PARAMS = regmap.PROFILE_HEAD_PARAMS[p.profile]
    model = tile_model.TileModel(p)
    dut = HeadRegisters(p)
    SB = p.stream_bytes
    results = []

    async def bench(ctx):
        for head, values in blocks:
            verdict = regmap.unpack_response(model.command(tile_model.configure_frame(head, values))).error
            model_regs = [[model.read_register(regmap.head_register(h, i)) for i in range(len(HEAD_PARAMS))]
                          for h in range(p.heads)]
            model_configured = sum(1 << h for h, state in enumerate(model.heads) if state.configured)
            block = b"".join(struct.pack("<I", v) for v in values).ljust(BLOCK_BYTES, b"\0")
            ctx.set(dut.head, head)
            for i, beat in enumerate(beats(block, SB)):
                ctx.set(dut.block_we, 1 << i)
                ctx.set(dut.block_data, beat)
                await ctx.tick()
            ctx.set(dut.block_we, 0)
            await ctx.tick().repeat(CONFIG_SETTLE - 1)
            ok = ctx.get(dut.config_ok)
            ctx.set(dut.commit, 1)
            await ctx.tick()
            ctx.set(dut.commit, 0)
            await ctx.tick()  # the head's write enable, in a register
            regs = [[ctx.get(dut.regs[h][hp.name]) for hp in HEAD_PARAMS] for h in range(p.heads)]
            results.append((verdict, ok, regs == model_regs, ctx.get(dut.configured) == model_configured))
        # The header head's parameters SELECT_LATENCY cycles after its index; cur + 1's while decoding.
        for head in range(p.heads):
            ctx.set(dut.select_we, 1)
            ctx.set(dut.select, head)
            await ctx.tick()
            ctx.set(dut.select_we, 0)
            await ctx.tick().repeat(SELECT_LATENCY)
            selected = [ctx.get(dut.header_params[hp.name]) for hp in HEAD_PARAMS]
            ctx.set(dut.head, head)
            mode = ctx.get(dut.hccs_mode)
            await ctx.tick()  # cur_params load header_params while not decoding
            results.append((head, selected, mode, [ctx.get(dut.cur_params[hp.name]) for hp in HEAD_PARAMS]))
        ctx.set(dut.decoding, (1 << DECODING_COPIES) - 1)  # every copy of the flag
        for cur in range(p.heads - 1):
            ctx.set(dut.cur, cur)
            await ctx.tick().repeat(NEXT_LATENCY + 1)
            results.append((cur, [ctx.get(dut.cur_params[hp.name]) for hp in HEAD_PARAMS]))

    run(dut, bench)
    verdicts = []
    for verdict, ok, regs_match, configured_match in results[:len(blocks)]:
        verdicts.append(verdict)
        assert ok == (verdict == ErrorCode.OK)
        assert regs_match and configured_match
    assert verdicts == verdicts_wanted
    for head, selected, mode, cur_params in results[len(blocks):len(blocks) + p.heads]:
        assert selected == cur_params == model.heads[head].values
        assert mode == model.heads[head].values[HEAD_INDEX["hccs_mode"]]
    for cur, cur_params in results[len(blocks) + p.heads:]:
        assert cur_params == model.heads[cur + 1].values


def stream_response(p, dut, rng, words, base, memory, *, header=bytes(16), info=False, rows=None, ready_rate=1.0):
    """Drive the streamer as the tile's state machine does; returns (bytes sent, tlast flags, the cycles the
    phases took from the header's first to the payload's last beat)."""
    out, lasts, busy = bytearray(), [], [0]

    async def bench(ctx):
        ctx.set(dut.header, int.from_bytes(header, "little"))
        ctx.set(dut.has_payload, 1)
        ctx.set(dut.info, int(info))
        ctx.set(dut.rows, int(rows is not None))
        ctx.set(dut.start, 1)
        ctx.set(dut.words, words)
        ctx.set(dut.base, base)
        read_addr = 0
        phase, packed, row_beat = "header", 0, 0
        cycle = 0
        while True:
            start = cycle == 0
            ctx.set(dut.start, int(start))
            ctx.set(dut.m_axis_tready, int(rng.random() < ready_rate))
            ctx.set(dut.rd_data, memory[read_addr] if read_addr < len(memory) else 0)
            for flag in ("send_header", "send_info", "send_words", "send_row", "pack", "pack_clear"):
                ctx.set(getattr(dut, flag), 0)
            if not start and phase == "header":
                ctx.set(dut.send_header, 1)
            elif phase == "info":
                ctx.set(dut.send_info, 1)
            elif phase == "words":
                ctx.set(dut.send_words, 1)
            elif phase == "pack":
                ctx.set(dut.pack, 1)
                ctx.set(dut.value, rows[row_beat][packed])
            elif phase == "send":
                ctx.set(dut.send_row, 1)
                ctx.set(dut.row_last, int(row_beat == len(rows) - 1))
            if not start and phase in ("header", "info", "words", "pack", "send"):
                busy[0] += 1
            read_addr = ctx.get(dut.rd_addr)
            if ctx.get(dut.m_axis_tvalid) and ctx.get(dut.m_axis_tready):
                out.extend(ctx.get(dut.m_axis_tdata).to_bytes(p.stream_bytes, "little"))
                lasts.append(ctx.get(dut.m_axis_tlast))
            if phase == "header" and ctx.get(dut.header_done):
                phase = "info" if info else "words" if rows is None else "clear"
            elif (phase == "info" and ctx.get(dut.info_done)) or (phase == "words" and ctx.get(dut.words_done)):
                phase = "done"
            elif phase == "clear":
                ctx.set(dut.pack_clear, 1)
                phase, packed = "pack", 0
            elif phase == "pack":
                full = ctx.get(dut.beat_full)
                packed += 1
                if full:
                    phase = "send"
            elif phase == "send" and ctx.get(dut.beat):
                row_beat += 1
                phase, packed = ("done", 0) if row_beat == len(rows) else ("pack", 0)
            await ctx.tick()
            cycle += 1
            if phase == "done" and lasts and lasts[-1]:
                break
            assert cycle < 2000

    run(dut, bench)
    return bytes(out), lasts, busy[0]


@pytest.mark.parametrize("p", [SMALL, WIDE], ids=["32bit", "128bit"])
def test_response_streamer_sends_the_header_then_the_memory_words_with_backpressure(p):
    rng = np.random.default_rng(3)
    W = p.word_bytes
    memory = [int.from_bytes(rng.bytes(W), "little") for _ in range(40)]
    header = rng.bytes(regmap.HEADER_BYTES)
    for words, base, rate in ((5, 7, 1.0), (1, 0, 1.0), (6, 30, 0.4)):
        dut = ResponseStreamer(p, regmap.info_values(p), 1)
        out, lasts, busy = stream_response(p, dut, rng, words, base, memory, header=header, ready_rate=rate)
        expected = header + b"".join(w.to_bytes(W, "little") for w in memory[base:base + words])
        assert out == expected
        assert lasts == [0] * (len(expected) // p.stream_bytes - 1) + [1]
        if rate == 1.0:
            # One beat per cycle; a one-beat header waits for the first word's read.
            assert busy == len(expected) // p.stream_bytes + header_wait(p)


@pytest.mark.parametrize("p", [SMALL, WIDE], ids=["32bit", "128bit"])
def test_response_streamer_sends_the_info_words_and_packs_hccs_rows_into_beats(p):
    rng = np.random.default_rng(4)
    info = regmap.info_values(p)
    dut = ResponseStreamer(p, info, 1)
    out, lasts, _ = stream_response(p, dut, rng, 0, 0, [], info=True, ready_rate=0.6)
    info_bytes = struct.pack(f"<{len(info)}I", *info)
    assert out[regmap.HEADER_BYTES:] == info_bytes.ljust(regmap.padded(len(info_bytes)), b"\0")
    assert lasts[-1] == 1 and sum(lasts) == 1

    out_bytes = 2 if p.hccs_out == "int16" else 1
    per_beat = p.stream_bytes // out_bytes
    rows = [[int(v) for v in rng.integers(0, 1 << (8 * out_bytes), per_beat)] for _ in range(3)]
    dut = ResponseStreamer(p, info, out_bytes)
    out, lasts, _ = stream_response(p, dut, rng, 0, 0, [], rows=rows, ready_rate=0.6)
    packed = b"".join(v.to_bytes(out_bytes, "little") for row in rows for v in row)
    assert out[regmap.HEADER_BYTES:] == packed
    assert lasts[-1] == 1 and sum(lasts) == 1


def test_payload_writer_puts_beats_into_memory_a_cycle_late_and_the_sweep_clears_its_range():
    p = SMALL
    rng = np.random.default_rng(5)
    SB, W = p.stream_bytes, p.word_bytes
    state_words = regmap.state_bytes(p) // W
    dut = PayloadWriter(p)
    image = bytearray(p.local_memory_bytes)
    log = {"writes": [], "at_last": [], "block_we": []}
    payload = rng.bytes(3 * p.head_dim)
    counters = dict((n, o) for n, o, _, _ in regmap.state_layout(p))["counters"]
    bad_state = bytearray(regmap.state_bytes(p))
    bad_state[counters:counters + 4] = struct.pack("<I", p.ring)  # write_pos beyond the ring

    async def step(ctx, cycle):
        addr, data, en = ctx.get(dut.wr_addr), ctx.get(dut.wr_data), ctx.get(dut.wr_en)
        if en:
            log["writes"].append((cycle, addr))
            for b in range(W):
                if en >> b & 1:
                    image[addr * W + b] = data >> (8 * b) & 0xFF
        await ctx.tick()

    async def send(ctx, data, base, cycle, **flags):
        expected = len(data)
        ctx.set(dut.begin, 1)
        ctx.set(dut.base_we, 1)
        ctx.set(dut.base, base)
        ctx.set(dut.length.expected, expected)
        ctx.set(dut.length.last_beat_at, expected - SB)
        ctx.set(dut.length.first_is_last, int(expected == SB))
        ctx.set(dut.length.before_last_beat, expected - 2 * SB)
        for name, value in flags.items():
            ctx.set(getattr(dut, name), value)
        await step(ctx, cycle)
        cycle += 1
        ctx.set(dut.begin, 0)
        ctx.set(dut.base_we, 0)
        first = cycle
        for beat in beats(data, SB):
            ctx.set(dut.beat, 1)
            ctx.set(dut.data, beat)
            log["at_last"].append(ctx.get(dut.at_last_beat))
            log["block_we"].append(ctx.get(dut.block_we))
            await step(ctx, cycle)
            cycle += 1
        ctx.set(dut.beat, 0)
        for _ in range(WRITE_LATENCY + 1):
            await step(ctx, cycle)
            cycle += 1
        return first, cycle

    sweeps = []

    async def sweep(ctx, cycle, clear_range=None):
        if clear_range is not None:
            ctx.set(dut.clear_start, 1)
            ctx.set(dut.clear_from, clear_range[0])
            ctx.set(dut.clear_to, clear_range[1])
            await step(ctx, cycle)
            cycle += 1
            ctx.set(dut.clear_start, 0)
        start = cycle
        after_reset = ctx.get(dut.after_reset)
        while True:
            ctx.set(dut.clearing, 1)
            last = ctx.get(dut.clear_last)
            await step(ctx, cycle)
            cycle += 1
            if last:
                break
        ctx.set(dut.clearing, 0)
        for _ in range(WRITE_LATENCY):
            await step(ctx, cycle)
            cycle += 1
        sweeps.append((after_reset, cycle - WRITE_LATENCY - start))
        return cycle

    async def bench(ctx):
        image[:] = rng.bytes(len(image))
        cycle = await sweep(ctx, 0)  # after reset: every head's state
        assert image[:p.heads * state_words * W] == bytes(p.heads * state_words * W)
        image[:] = rng.bytes(len(image))
        log["writes"].clear()
        stage_word = p.heads * state_words  # where a DECODE payload goes
        first, cycle = await send(ctx, payload, stage_word, cycle)
        assert [c for c, _ in log["writes"]][::W // SB] == [first + WRITE_LATENCY + i * W // SB
                                                             for i in range(len(payload) // W)]
        assert image[stage_word * W:][:len(payload)] == payload
        assert log["at_last"] == [0] * (len(payload) // SB - 1) + [1]
        log["writes"].clear()
        block = rng.bytes(BLOCK_BYTES)
        _, cycle = await send(ctx, block, 0, cycle, to_block=1)
        assert log["writes"] == []
        assert log["block_we"][-len(block) // SB:] == [1 << i for i in range(len(block) // SB)]
        for state, bad in ((bytes(regmap.state_bytes(p)), False), (bytes(bad_state), True)):
            assert (tile_model.counters_error(p, state) is not None) == bad
            _, cycle = await send(ctx, state, 2 * state_words, cycle, to_block=0, check_counters=1)
            assert ctx.get(dut.counters_bad) == bad
        before = bytes(image)
        cycle = await sweep(ctx, cycle, (state_words, 3 * state_words))
        assert image[state_words * W:3 * state_words * W] == bytes(2 * state_words * W)
        assert image[:state_words * W] == before[:state_words * W]
        assert image[3 * state_words * W:] == before[3 * state_words * W:]

    run(dut, bench)
    assert sweeps == [(1, p.heads * state_words), (0, 2 * state_words)]


@pytest.mark.parametrize("p", [SMALL, WIDE, WIDE_PROFILE], ids=["paper-uint8", "paper-int16", "wide"])
def test_command_rows_normalise_through_the_decode_units_row_unit_like_the_model(p):
    """The HCCS command's rows, element by element with gaps, through CommandRows and the row unit of a
    NearFieldFeed lent to it (``command.active``), read back with stalls: each row equals the model's HCCS
    command, padding 0, and ``final`` marks each row's last element; the unit never refuses a beat."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring

    from somatile.hw.soma import NearFieldFeed, head_params_layout
    from somatile.hw.tile import hccs_out_bytes
    from somatile.hw.tile_rows import CONFIGURE_LATENCY, CommandRows

    rng = np.random.default_rng(11)
    out_bytes = hccs_out_bytes(p)
    if p.profile == "wide":
        values = tile_model.head_values(run_soma.random_config(rng, p, normaliser="pwl2_int"))
    else:  # parameters inside the paper's HCCS rules, which the command checks; clb for the int16 rows
        values = block_values(hccs_B=40, hccs_S=1, hccs_dmax=12, hccs_mode=int(p.hccs_out == "int16"))
    model = tile_model.TileModel(p)
    assert regmap.unpack_response(model.command(tile_model.configure_frame(0, values))).error == ErrorCode.OK
    dtype = np.int16 if p.profile == "wide" else np.int8
    lo, hi = (-3000, 3000) if p.profile == "wide" else (-128, 128)
    elem = regmap.element_bytes(p)
    rows = []
    for n in (10, 13, p.n_max, 17):  # the paper rule holds for these parameters from 10 elements on
        x = rng.integers(lo, hi, (2, n)).astype(dtype)
        response = regmap.unpack_response(model.command(tile_model.hccs_frame(0, x, p.profile)))
        assert response.error == ErrorCode.OK
        want = np.frombuffer(response.payload, regmap.hccs_out_dtype(p)).reshape(2, -1)
        n_pad = regmap.hccs_row_bytes(p, n) // elem
        rows += [(np.pad(row, (0, n_pad - n)), n, want[r]) for r, row in enumerate(x)]

    m = Module()
    m.submodules.feed = feed = NearFieldFeed(p)
    m.submodules.rows = dut = CommandRows(p, out_bytes)
    wiring.connect(m, dut.unit, feed.command)
    layout = head_params_layout(p.profile)
    got = []

    async def bench(ctx):
        ctx.set(dut.active, 1)
        ctx.set(dut.head, layout.const(dict(zip(layout.members, values))))
        ctx.set(dut.configure, 1)
        await ctx.tick()
        ctx.set(dut.configure, 0)
        await ctx.tick().repeat(CONFIGURE_LATENCY)
        for x, n, _ in rows:
            ctx.set(dut.n_last, len(x) - 1)
            for i, xi in enumerate(x):
                while rng.random() < 0.3:    # a gap in the fetch
                    ctx.set(dut.valid, 0)
                    await ctx.tick()
                ctx.set(dut.valid, 1), ctx.set(dut.x, int(xi)), ctx.set(dut.mask, int(i < n))
                ctx.set(dut.first, int(i == 0)), ctx.set(dut.last, int(i == len(x) - 1))
                await ctx.tick()
            ctx.set(dut.valid, 0)
            values_out = []
            for _ in range(20 * len(x) + 400):
                take = rng.random() < 0.7
                ctx.set(dut.take, int(take))
                if take and ctx.get(dut.out_valid):
                    values_out.append((ctx.get(dut.value), ctx.get(dut.final)))
                    if values_out[-1][1]:
                        await ctx.tick()
                        break
                await ctx.tick()
            ctx.set(dut.take, 0)
            got.append(values_out)
        refused.append(ctx.get(dut.refused))

    refused = []
    run(m, bench)
    assert refused == [0], "the unit refused a beat of the command"
    assert len(got) == len(rows)
    for (x, n, want), values_out in zip(rows, got):
        assert [v for v, _ in values_out] == want.tolist(), (n, x.tolist())
        assert [f for _, f in values_out] == [0] * (len(x) - 1) + [1]
        assert any(want[:n]) and not any(want[n:])
