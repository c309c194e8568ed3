"""An AI-Engine-style compute tile: AXI4-Stream in and out, a local data memory, the command layer of
:mod:`somatile.hw.regmap`, the Soma decode unit and the row normaliser.

Ports (flat names, so that ``AxiStreamBus.from_prefix(dut, "s_axis")`` binds): ``s_axis_tdata``
(``stream_width`` bits), ``s_axis_tvalid``, ``s_axis_tready``, ``s_axis_tlast`` in; ``m_axis_*`` out; and
``error`` (STATUS bit 0, for a board LED). Frames are little-endian byte strings, ``tlast`` on the last
beat; the behaviour, frame for frame, is that of :class:`somatile.hw.tile_model.TileModel` (its docstring
lists the checks and the fault rules) except that CYCLES_LAST counts real cycles.

Contract:

- Latency and throughput: the tile works one frame at a time. It accepts the header and the payload at one
  beat per cycle, executes, then sends the response at one beat per cycle; ``s_axis_tready`` is low while
  it executes and responds. :func:`expected_decode_cycles` gives the cycles of a DECODE frame of ``count``
  heads without stalls, first header beat to last response beat; it depends on the tile parameters and
  ``count`` only (not on the sequence position).
- Backpressure: ``m_axis_tready`` low holds the response beat; ``s_axis_tvalid`` low pauses the intake; both
  only add cycles. The response leaves through a register slice (every ``m_axis_*`` output is a register,
  one cycle of latency, full throughput).
- Reset (synchronous ``rst``) at any point, also in the middle of a frame: the tile drops the frame, clears
  every head's state in local memory (``heads * state_bytes / word`` cycles with ``s_axis_tready`` low), marks
  the heads unconfigured and clears the error and counters; the next frame starts from a clean state.
- Elaboration raises ValueError when the heads' state plus the staging area do not fit ``local_memory_bytes``.
"""

from __future__ import annotations

import struct

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2 as log2

from somatile.hw import regmap
from somatile.hw.pipe import (Replicated, block_ram, delay, lut_mul, lut_mul_pipelined, reg, skid_buffer,
                              split_mul)
from somatile.hw.regmap import HEAD_INDEX, HEAD_PARAMS, ErrorCode, Opcode, TileParams
from somatile.hw.soma import RowNormaliser, SomaDecode, expected_cycles
from somatile.hw.hccs_rules import LATENCY as RULES_LATENCY, rules_ok
from somatile.hw.tile_front import CHECK_SETTLE, CommandFront
from somatile.hw.tile_regs import OK_LATENCY, VALUE_LATENCY, RegisterReader


def stream_ports(stream_width: int) -> dict:
    """The AXI4-Stream ports of a tile or an array (flat names for cocotbext-axi) and the error output."""
    return {"s_axis_tdata": In(stream_width), "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
            "s_axis_tlast": In(1), "m_axis_tdata": Out(stream_width), "m_axis_tvalid": Out(1),
            "m_axis_tready": In(1), "m_axis_tlast": Out(1), "error": Out(1)}


PARAM_INDEX_COPIES = 4  # copies of a head index that selects the head parameters (Tile.copied_fields)
CONFIG_SETTLE = 8
"""Cycles between a CONFIGURE_HEAD block's last beat and its execution: the beat's capture (the block's beats
are written into its register one cycle after they arrive, from a registered one-hot enable), the rules'
pipeline depth (RULES_LATENCY + 1), then the head's write enable in a register (it enables some 150
flip-flops of the head's parameters)."""


def expected_decode_cycles(params: TileParams, configs) -> int:
    """Cycles of a DECODE frame for heads with these configs (anything with ``normaliser`` and
    ``hccs_mode``, e.g. the heads' SomaConfig), with no idle input and no output backpressure, from the cycle
    the first header beat is accepted through the cycle the last response beat is accepted: header beats,
    ``CHECK_SETTLE`` settle cycles and a check cycle, payload beats, one execute cycle, per head one start
    cycle and its decode step, response header and payload beats (as CYCLES_LAST counts them: up to the last
    beat entering the output register slice, which presents it one cycle later). Independent of the sequence
    position."""
    sb, count = params.stream_bytes, len(configs)
    header = regmap.HEADER_BYTES // sb
    intake = header + CHECK_SETTLE + 1 + 3 * params.head_dim * count // sb
    steps = sum(expected_cycles(params, c.normaliser, c.hccs_mode) for c in configs)
    execute = 1 + steps + count
    # A one-beat response header waits a cycle for the first word's read (resp_word_reg in Tile).
    respond = header + (header == 1) + params.head_dim * count // sb
    return intake + execute + respond


class Tile(wiring.Component):
    """One tile; keyword arguments are the fields of :class:`somatile.hw.regmap.TileParams` plus
    ``tile_index`` (its position in an array, reported by INFO)."""

    def __init__(self, *, tile_index: int = 0, **kwargs):
        self.params = TileParams(**kwargs)
        regmap.check_fits(self.params)
        self.tile_index = tile_index
        super().__init__(stream_ports(self.params.stream_width))

    def elaborate(self, platform):
        m = Module()
        p = self.params
        SB, W, D = p.stream_bytes, p.word_bytes, p.head_dim
        SW = 8 * SB
        HB = regmap.HEADER_BYTES // SB
        beats_per_word = W // SB
        dw = D // W
        state_words = regmap.state_bytes(p) // W
        stage_word = p.heads * state_words
        mem_words = p.local_memory_bytes // W
        out_word = stage_word + 3 * p.heads * dw
        out_bytes = 2 if p.hccs_out == "int16" else 1

        mem, rd = block_ram(m, "mem", unsigned(8 * W), mem_words)
        wr = mem.write_port(granularity=8)
        m.submodules.decode = dec = SomaDecode(p, mem_words)
        m.submodules.norm = norm = RowNormaliser(p.n_max)

        s_beat = self.s_axis_tvalid & self.s_axis_tready
        # The response leaves through a register slice (hw/pipe.py skid_buffer): the FSM drives resp_valid,
        # resp_data and resp_last; resp_ready is a register.
        resp_valid, resp_last_beat, resp_data = Signal(), Signal(), Signal(self.params.stream_width)
        resp_ready, out_valid, out_payload = skid_buffer(m, resp_valid, Cat(resp_data, resp_last_beat),
                                                         self.m_axis_tready, "m_axis")
        m.d.comb += [self.m_axis_tvalid.eq(out_valid), self.m_axis_tdata.eq(out_payload[:-1]),
                     self.m_axis_tlast.eq(out_payload[-1])]
        m_beat = resp_valid & resp_ready

        # Command header, its checks and the sizes it implies (hw/tile_front.py).
        m.submodules.front = front = CommandFront(p)
        m.d.comb += [front.data.eq(self.s_axis_tdata)]
        fields = front.header
        opcode, head, count, arg0, arg1 = fields.opcode, fields.head, fields.count, fields.arg0, fields.arg1
        head_end, arg1_last, n_pad, rows_last = front.head_end, front.arg1_last, front.n_pad, front.rows_last
        hccs_bytes, hccs_bytes_nonzero = front.hccs_bytes, front.hccs_bytes_nonzero
        decode_out_bytes, decode_out_nonzero = front.decode_out_bytes, front.decode_out_nonzero
        decode_out_words = front.decode_out_words
        head_words, next_head_words, end_head_words = front.head_words, front.next_head_words, front.end_head_words
        expected, last_beat_at, first_is_last = front.expected, front.last_beat_at, front.first_is_last
        before_last_beat, check_error, check_failed = front.before_last_beat, front.check_error, front.check_failed
        no_payload = front.no_payload
        is_op = {op: front.is_op[op.name.lower()] for op in Opcode}
        # The header's head index bits once more, in copies written with the header's first beat (for the
        # head parameter multiplexers, below).
        head_bits = max(1, (p.heads - 1).bit_length())
        header_head = Replicated(head_bits, PARAM_INDEX_COPIES, "header_head")
        settle = Signal(range(max(CHECK_SETTLE, CONFIG_SETTLE) + 1))
        # One register, two roles that never overlap: from HEADER to the check, the frame ended with the
        # header's last beat (tlast); in RESPOND_HEADER, the response presents its last header beat (set by
        # start_response and the header beats).
        header_last = Signal()

        # Registers.
        error_latched = Signal()
        error_code = Signal(8)
        error_opcode = Signal(8)
        cycles_last = Signal(32)
        cycles_run = Signal(32)
        commands = Signal(32)
        tokens = Signal(32)
        scratch = Signal(32)
        configured = Signal(p.heads)
        head_regs = [[Signal(range(hp.hi + 1), name=f"head{h}_{hp.name}", init=hp.default) for hp in HEAD_PARAMS]
                     for h in range(p.heads)]
        m.d.comb += [self.error.eq(error_latched), front.configured.eq(configured)]

        # Response fields.
        resp_opcode = Signal(8)
        resp_head = Signal(8)
        resp_error = Signal(8)
        resp_length = Signal(32)
        # resp_length != 0, set with it (a 32-bit comparison in RESPOND_HEADER was in front of the response's
        # and the HCCS command's registers).
        resp_has_payload = Signal()

        def set_length(value, nonzero):
            m.d.sync += [resp_length.eq(value), resp_has_payload.eq(nonzero)]
        resp_result = Signal(32)
        response_header = Cat(Const(regmap.FRAME_MAGIC, 8), resp_opcode, resp_head, resp_error, resp_length,
                              resp_result, Const(0, 32))

        # Register read decode (hw/tile_regs.py): registered like every product and rule check on the captured
        # header, and read CHECK_SETTLE cycles after HEADER's last beat, when it describes this header.
        info = regmap.info_values(p, self.tile_index)
        globals_ = {"ID": regmap.ID_VALUE, "API_LEVEL": regmap.API_LEVEL, "STATUS": error_latched,
                    "ERROR_CODE": error_code, "ERROR_OPCODE": error_opcode, "CYCLES_LAST": cycles_last,
                    "COMMANDS": commands, "TOKENS": tokens, "CONFIGURED": configured, "SCRATCH": scratch}
        readable = ([(i * regmap.REGISTER_BYTES, globals_[name]) for i, (name, _, _) in
                     enumerate(regmap.GLOBAL_REGISTERS)]
                    + [(regmap.INFO_BASE + i * regmap.REGISTER_BYTES, value) for i, value in enumerate(info)]
                    + [(regmap.head_register(h, i), head_regs[h][i]) for h in range(p.heads)
                       for i in range(len(HEAD_PARAMS))])
        m.submodules.registers = registers = RegisterReader(
            [(a, v if isinstance(v, int) else None) for a, v in readable])
        m.d.comb += [registers.address.eq(arg0), front.reg_ok.eq(registers.ok)]
        for port, value in zip(registers.live, [v for _, v in readable if not isinstance(v, int)]):
            m.d.comb += port.eq(value)
        # The value is read in EXECUTE, at least one cycle after CHECK.
        reg_value = registers.value
        assert VALUE_LATENCY <= CHECK_SETTLE + 1

        last_row = Signal()   # row == rows_last, registered (row changes many cycles before it is read)

        def head_field(h_index, name):
            """Parameter ``name`` of head ``h_index``, selected by the index bits a valid head uses (a head
            out of range is refused before its parameters are used)."""
            regs = [head_regs[h][HEAD_INDEX[name]] for h in range(p.heads)]
            return regs[0] if p.heads == 1 else Array(regs)[h_index[:head_bits]]

        def copied_fields(copies: Replicated, prefix: str) -> dict:
            """Every head parameter of the head ``copies`` hold, registered: each copy of the index steers a
            share of the parameters (one index reaching them all would span the die)."""
            share = -(-len(HEAD_PARAMS) // PARAM_INDEX_COPIES)
            return {hp.name: reg(m, head_field(copies.copy(i // share), hp.name), f"{prefix}_{hp.name}")
                    for i, hp in enumerate(HEAD_PARAMS)}

        # The header head's parameters, registered (the HCCS rule check reads three of them; the decode unit's
        # parameters are loaded from them for its first head, below).
        head_params = copied_fields(header_head, "head_p")
        selected = {n: head_params[f"hccs_{n}"] for n in ("B", "S", "dmax")}
        m.d.comb += [getattr(front, f"hccs_{n}").eq(v) for n, v in selected.items()]

        # CONFIGURE_HEAD: the parameter block as received, its range checks and the SomaConfig rules.
        config_bytes = regmap.padded(regmap.REGISTER_BYTES * len(HEAD_PARAMS))
        config = Signal(8 * config_bytes, reset_less=True)  # applied only through head_we (reset)
        config_values = [config.word_select(i, 32) for i in range(len(HEAD_PARAMS))]
        # Each range check registered on its own, their AND RULES_LATENCY - 1 cycles later (like the HCCS rules).
        ranges_ok = reg(m, Cat(*[(v >= hp.lo) & (v <= hp.hi) for v, hp in zip(config_values, HEAD_PARAMS)]),
                        "ranges").all()
        cv = {hp.name: v for hp, v in zip(HEAD_PARAMS, config_values)}
        choice = {name: HEAD_PARAMS[HEAD_INDEX[name]].choices for name in ("gating", "field_source", "normaliser")}
        gating_ok = (cv["gating"] != choice["gating"].index("query")) | \
                    (cv["field_source"] == choice["field_source"].index("values"))
        uses_hccs = cv["normaliser"] == choice["normaliser"].index("hccs_int")
        config_hccs_ok = rules_ok(m, "config_hccs_ok", cv["hccs_B"][:16], cv["hccs_S"][:8], cv["hccs_dmax"][:8],
                                  p.slots)
        ranges_ok = delay(m, ranges_ok, RULES_LATENCY - 1)
        gating_ok, uses_hccs = (delay(m, v, RULES_LATENCY) for v in (gating_ok, uses_hccs))
        # RULES_LATENCY + 2 cycles after the block's last beat: CONFIGURE_HEAD waits CONFIG_SETTLE cycles.
        config_ok = reg(m, ranges_ok & gating_ok & (~uses_hccs | config_hccs_ok), "config_ok")
        # One-hot: head h's parameters are written in this cycle (CONFIGURE_HEAD's EXECUTE cycle); set in the
        # last CONFIG_SETTLE cycle, so that the enable of the head's registers comes from one flip-flop.
        head_we = Signal(p.heads)
        m.d.sync += head_we.eq(0)
        for h in range(p.heads):
            with m.If(head_we[h]):
                m.d.sync += [r.eq(value) for r, value in zip(head_regs[h], config_values)] + [configured[h].eq(1)]

        # Error latch.
        def fail(code, detail=0, echo=True):
            m.d.sync += [resp_error.eq(code), resp_result.eq(detail)]
            set_length(0, 0)
            if not echo:
                m.d.sync += [resp_opcode.eq(0), resp_head.eq(0)]
            with m.If(~error_latched):
                m.d.sync += [error_latched.eq(1), error_code.eq(code), error_opcode.eq(opcode if echo else 0)]

        # The block's beats are captured a cycle after they arrive: the beat, and a one-hot enable of the
        # word it fills, in registers (decoded from the state, the opcode and the byte counter in the same
        # cycle, the enables of the 600-odd flip-flops of the block were among the tile's longest paths).
        config_beats = config_bytes // SB
        config_we_now = Signal(config_beats)
        config_we = reg(m, config_we_now, "config_we")  # no reset: config is applied only through head_we
        config_data = reg(m, self.s_axis_tdata, "config_data")
        for i in range(config_beats):
            with m.If(config_we[i]):
                m.d.sync += config.word_select(i, SW).eq(config_data)

        # The payload's and the clear sweep's writes reach the memory a cycle late, from registers (host_*):
        # the state, the opcode and the byte counter decoded in front of the block RAMs' write ports were the
        # tile's longest paths. Nothing reads a word in the cycle after it is written by them.
        host_addr, host_data, host_en = Signal.like(wr.addr), Signal.like(wr.data), Signal.like(wr.en)
        host = {name: reg(m, value, f"host_{name}", reset_less=name != "en") for name, value in
                (("addr", host_addr), ("data", host_data), ("en", host_en))}

        # Byte counter of the payload and where its beats go.
        byte_count = Signal(32)
        # byte_count < expected, kept in a register beside byte_count (it gates the memory's write port, where a
        # 32-bit comparison in the same cycle was among the longest paths of the ECP5 tile).
        in_payload = Signal()
        payload_addr = Signal(range(mem_words + 1))   # word the next payload beat goes to
        counters_bad = Signal()
        load_length_ok = Signal()
        at_last_beat = Signal()
        counter_offset = dict((n, o) for n, o, _, _ in regmap.state_layout(p))["counters"]
        counter_limits = (p.ring - 1, p.ring, (1 << 31) - 1)
        beat_counters_bad = Signal()
        for i, limit in enumerate(counter_limits):
            offset = counter_offset + 4 * i
            value = self.s_axis_tdata.word_select((offset % SB) // 4, 32)
            with m.If((byte_count == offset - offset % SB) & (value > limit)):
                m.d.comb += beat_counters_bad.eq(1)

        # The decode loop over heads and the memory clear sweep.
        cur = Signal(8)
        last = Signal(8)
        cur_is_last = reg(m, cur == last, "cur_is_last")  # cur and last change long before a step's done
        # The decode unit's head parameters come from registers (cur_params), not through the head multiplexer
        # from cur: that path would fan out to the decode unit's parameter registers across the die, and an
        # enable from the command decoding would reach them as far. They load every cycle, in
        # DECODE and DECODE_NEXT those of cur + 1 (registered twice behind cur), else those of the header's
        # head (registered; the header is decoded cycles before EXECUTE). The unit samples them in DECODE_NEXT,
        # the cycle after cur was set; they were loaded at that same edge (in EXECUTE for the first head, from
        # cur + 1 of the previous head for the others) and change at the earliest at the sampling edge. The
        # normaliser takes its parameters from the unit's sampled copies (n_B, ...), held for the whole step.
        cur_next = reg(m, cur + 1, "cur_next", cur.shape())
        cur_next_index = Replicated(head_bits, PARAM_INDEX_COPIES, "cur_next_index")
        m.d.sync += cur_next_index.eq(cur + 1)
        next_params = copied_fields(cur_next_index, "next_p")
        cur_params = {hp.name: Signal(range(hp.hi + 1), name=f"cur_{hp.name}") for hp in HEAD_PARAMS}
        decoding = Signal()
        m.d.sync += [cur_params[n].eq(Mux(decoding, next_params[n], head_params[n])) for n in cur_params]

        # The sweep clears [clear_word, clear_end): after reset every head's state (the reset values), else the
        # range CLEAR is entered with. clear_last (the word being cleared is the last one) is kept in a register:
        # every sweep covers at least one head's state, which is more than one word.
        assert state_words >= 2
        clear_word = Signal(range(mem_words + 1))
        clear_end = Signal(range(mem_words + 1), init=p.heads * state_words)
        after_reset = Signal(init=1)
        clear_last = Signal()

        def enter_clear(end, error):
            m.d.sync += [clear_word.eq(head_words), clear_end.eq(end), pending_error.eq(error),
                         after_reset.eq(0), clear_last.eq(0)]
            m.next = "CLEAR"
        pending_error = Signal(8)

        # Response payload streaming: memory words (READ_STATE, DECODE), INFO words, or HCCS rows.
        resp_beat = Signal(range(HB + 1))
        resp_word = Signal(range(mem_words + 1))
        resp_last_word = Signal(signed(len(Const(mem_words)) + 1))
        word_beat = Signal(range(beats_per_word + 1))
        info_bytes = struct.pack(f"<{len(info)}I", *info)
        info_beats = regmap.padded(len(info_bytes)) // SB
        info_payload = Const(int.from_bytes(info_bytes, "little"), 8 * SB * info_beats)
        info_beat = Signal(range(info_beats + 1))

        # HCCS rows: row r's bytes sit at stage_word + r * n_pad / W; the output is packed into beats.
        row = Signal(32)
        row_index = Signal(range(regmap.padded(p.n_max) + 1))
        elems_per_beat = SB // out_bytes
        beat_data = Signal(SW)
        beat_fill = Signal(range(elems_per_beat + 1))
        hccs_active = Signal()
        row_start = Signal(32)
        fetch_valid = Signal()
        fetch_elem = Signal(32)
        m.d.sync += last_row.eq(row == rows_last)
        row_done = Signal()
        fetch_addr = Signal(range(mem_words + 1))
        # The next row's first element and word, in registers (row_start changes a row's length of cycles
        # before they are read): as two adders in front of the fetch registers they would not fit a cycle.
        next_row_start = reg(m, row_start + n_pad, "next_row_start", 32)
        next_row_addr = reg(m, stage_word + (next_row_start >> log2(W)), "next_row_addr", range(mem_words + 1))
        fetched_lane = reg(m, fetch_elem[:log2(W)], "fetched_lane")

        # Normaliser: driven by the decode unit, or by the HCCS command (the members it drives, below).
        hccs_start = Signal()
        hccs_row_we = Signal()
        hccs_prob_index = Signal(range(p.n_max + 1))
        # The HCCS command's row writes (and its start, after the last) reach the normaliser two cycles late,
        # from registers: the memory word is registered as it leaves the block RAM, the byte selected out of
        # it the next cycle, and the write follows.
        fetched_word = reg(m, rd.data, "fetched_word")
        late_x = reg(m, fetched_word.word_select(delay(m, fetched_lane, 1), 8), "late_x")
        late_start, late_we = (delay(m, v, 2, reset_less=False) for v in (hccs_start, hccs_row_we))
        late_index = delay(m, row_index, 2)
        # The HCCS command's parameters from the registers its rule check reads (the exp head is never asked for
        # there), a decode step's from the decode unit: no head multiplexer in front of the normaliser. The
        # exp multiplier is a decode step's only.
        hccs_drive = {"start": late_start, "count": arg1, "use_exp": 0, "clb": head_field(head, "hccs_mode") == 1,
                      "out16": out_bytes == 2, "row_we": late_we, "row_index": late_index, "row_x": late_x,
                      "row_valid": 1, "prob_index": hccs_prob_index, **selected}
        for name, member in norm.signature.members.items():
            if member.flow == wiring.In:  # into the normaliser
                source = getattr(dec.norm, name)
                m.d.comb += getattr(norm, name).eq(Mux(hccs_active, hccs_drive[name], source)
                                                   if name in hccs_drive else source)
            else:
                m.d.comb += getattr(dec.norm, name).eq(getattr(norm, name))

        # Decode unit: parameters of the current head, addresses, memory ports.
        m.d.comb += [dec.head[hp.name].eq(cur_params[hp.name]) for hp in HEAD_PARAMS]
        # The current head's addresses advance with cur (no multiplier between cur and the decode unit).
        dec_state_base = Signal(range(mem_words))
        dec_stage_base = Signal(range(mem_words))
        dec_out_base = Signal(range(mem_words))
        m.d.comb += [dec.state_base.eq(dec_state_base), dec.stage_base.eq(dec_stage_base),
                     dec.out_base.eq(dec_out_base), dec.rd_data.eq(rd.data)]
        dec_start = Signal()
        m.d.comb += dec.start.eq(dec_start)

        # Memory port defaults: the read address follows the response stream; writes come from the payload,
        # the clear sweep or the decode unit.
        # The response's memory words leave the block RAM into a register (resp_word_reg, the word whose beats
        # are being sent) and the block RAM already holds the next one at its output: the beats are selected
        # from a register, not from the block RAM's output (whose clock-to-output alone is over half a cycle
        # on the ECP5). Read pointer: resp_addr (the word the block RAM shows, to be loaded next) and
        # resp_addr + 1 in registers; the pointer steps when a word's last beat leaves (or the header's,
        # loading the first word). The read address is selected by flags kept in registers beside the state
        # (responding with memory words, fetching HCCS rows, the last beat of a word, the header's last beat):
        # decoded from the state and counters, the selection was in front of the block RAMs' address inputs.
        words_state, fetching, word_last, at_last_word = Signal(), Signal(), Signal(), Signal()
        header_hold = Signal()     # one-beat header of a word response: its first cycle waits for the read
        resp_addr = Signal(range(mem_words + 2))
        resp_addr_next = Signal(range(mem_words + 3))
        resp_word_reg = Signal(8 * W)
        step = resp_ready & Mux(words_state, word_last, header_last)
        # After a step the block RAM shows the next word one cycle late; with two or more beats per word the
        # next step is at least two cycles later, so the read address is the pointer itself (no path from the
        # output handshake to the block RAMs' address inputs). With one beat per word it steps ahead.
        resp_read = Mux(step, resp_addr_next, resp_addr) if beats_per_word == 1 else resp_addr
        m.d.comb += rd.addr.eq(Mux(dec.busy, dec.rd_addr, Mux(fetching, fetch_addr, resp_read)))
        with m.If(step):
            m.d.sync += [resp_word_reg.eq(rd.data), resp_addr.eq(resp_addr_next),
                         resp_addr_next.eq(resp_addr_next + 1)]
        m.d.comb += [wr.addr.eq(Mux(dec.busy, dec.wr_addr, host["addr"])),
                     wr.data.eq(Mux(dec.busy, dec.wr_data, host["data"])),
                     wr.en.eq(Mux(dec.busy, dec.wr_en, host["en"]))]

        m.d.sync += cycles_run.eq(cycles_run + 1)

        def start_response(words=0, base=0):
            # A one-beat header of a word response is held a cycle: the first word is read in the first
            # cycle and loaded into resp_word_reg as the header's beat leaves.
            hold = Value.cast(words) != 0 if HB == 1 else Const(0)
            m.d.sync += [resp_beat.eq(0), resp_word.eq(0), word_beat.eq(0),
                         resp_last_word.eq(words - 1), resp_addr.eq(base), resp_addr_next.eq(base + 1),
                         word_last.eq(beats_per_word == 1), at_last_word.eq(words == 1),
                         header_hold.eq(hold), header_last.eq(~hold if HB == 1 else 0)]
            m.next = "RESPOND_HEADER"

        def finish():
            m.d.sync += [cycles_last.eq(cycles_run + 1), commands.eq(commands + 1)]
            m.d.comb += front.restart.eq(1)
            m.next = "HEADER"

        with m.FSM(init="CLEAR") as fsm:
            m.d.comb += decoding.eq(fsm.ongoing("DECODE") | fsm.ongoing("DECODE_NEXT"))
            with m.State("CLEAR"):
                # After reset, and for RESET_STATE / a faulting LOAD_STATE: zero [clear_word, clear_end).
                m.d.comb += [host_addr.eq(clear_word), host_data.eq(0), host_en.eq((1 << W) - 1)]
                m.d.sync += [clear_word.eq(clear_word + 1), clear_last.eq(clear_word + 2 >= clear_end)]
                with m.If(clear_last):
                    with m.If(after_reset):
                        m.d.comb += front.restart.eq(1)
                        m.next = "HEADER"
                    with m.Else():
                        with m.If(pending_error != 0):
                            fail(pending_error, Mux(pending_error == ErrorCode.BAD_LENGTH, expected, 0))
                        start_response()

            with m.State("HEADER"):
                m.d.comb += self.s_axis_tready.eq(1)
                m.d.comb += front.beat.eq(s_beat)
                with m.If(s_beat):
                    with m.If(front.first_beat):
                        m.d.sync += [cycles_run.eq(1), *header_head.eq(self.s_axis_tdata[16:16 + head_bits])]
                    with m.If(front.last_beat):
                        m.d.sync += header_last.eq(self.s_axis_tlast)
                        m.d.sync += settle.eq(0)
                        m.next = "SETTLE"
                    with m.Elif(self.s_axis_tlast):
                        m.d.sync += [resp_opcode.eq(0), resp_head.eq(0)]
                        fail(ErrorCode.BAD_LENGTH, 0, echo=False)
                        start_response()

            with m.State("SETTLE"):
                m.d.sync += settle.eq(settle + 1)
                with m.If(settle == CHECK_SETTLE - 1):
                    m.next = "CHECK"

            with m.State("CHECK"):
                m.d.sync += [resp_opcode.eq(opcode), resp_head.eq(head), resp_error.eq(0), resp_result.eq(0),
                             byte_count.eq(0), in_payload.eq(expected > 0), counters_bad.eq(0),
                             at_last_beat.eq(first_is_last)]
                set_length(0, 0)
                with m.If(check_failed):
                    with m.If(header_last):
                        fail(check_error, Mux(check_error == ErrorCode.BAD_LENGTH, expected, 0))
                        start_response()
                    with m.Else():
                        m.d.sync += pending_error.eq(check_error)
                        m.next = "DRAIN"
                with m.Elif(header_last != no_payload):
                    # The frame ends where the payload should start, or carries one the opcode forbids.
                    with m.If(header_last):
                        with m.If(is_op[Opcode.LOAD_STATE]):
                            enter_clear(next_head_words, ErrorCode.BAD_LENGTH)
                        with m.Else():
                            fail(ErrorCode.BAD_LENGTH, expected)
                            start_response()
                    with m.Else():
                        m.d.sync += pending_error.eq(ErrorCode.BAD_LENGTH)
                        m.next = "DRAIN"
                with m.Else():
                    m.d.sync += payload_addr.eq(Mux(is_op[Opcode.LOAD_STATE], head_words, stage_word))
                    with m.If(header_last):
                        m.next = "EXECUTE"
                    with m.Else():
                        m.next = "PAYLOAD"

            with m.State("PAYLOAD"):
                m.d.comb += self.s_axis_tready.eq(1)
                with m.If(s_beat):
                    # byte_count + SB < expected, i.e. byte_count < expected - SB: no adder before the comparison.
                    m.d.sync += [byte_count.eq(byte_count + SB), in_payload.eq(byte_count < last_beat_at),
                                 at_last_beat.eq(byte_count == before_last_beat)]
                    with m.If(in_payload):
                        with m.If(is_op[Opcode.CONFIGURE_HEAD]):
                            m.d.comb += config_we_now.eq(Const(1, config_beats) << (byte_count[:8] >> log2(SB)))
                        with m.Else():
                            lane = (byte_count >> log2(SB)) % beats_per_word if beats_per_word > 1 else 0
                            with m.If(lane == beats_per_word - 1):
                                m.d.sync += payload_addr.eq(payload_addr + 1)
                            m.d.comb += [host_addr.eq(payload_addr),
                                         host_data.eq(Cat(*[self.s_axis_tdata] * beats_per_word)),
                                         host_en.eq(Const((1 << SB) - 1, W) << (lane * SB))]
                        with m.If(is_op[Opcode.LOAD_STATE] & beat_counters_bad):
                            m.d.sync += counters_bad.eq(1)
                    with m.If(self.s_axis_tlast):
                        length_ok = at_last_beat
                        with m.If(is_op[Opcode.LOAD_STATE]):
                            # Decided in LOAD_CHECK from registers (the last beat's counter check included).
                            m.d.sync += load_length_ok.eq(length_ok)
                            m.next = "LOAD_CHECK"
                        with m.Elif(length_ok):
                            m.next = "EXECUTE"
                            with m.If(is_op[Opcode.CONFIGURE_HEAD]):
                                m.d.sync += settle.eq(0)
                                m.next = "CONFIG_SETTLE"
                        with m.Else():
                            fail(ErrorCode.BAD_LENGTH, expected)
                            start_response()

            with m.State("LOAD_CHECK"):
                with m.If(~load_length_ok | counters_bad):
                    enter_clear(next_head_words, Mux(load_length_ok, ErrorCode.BAD_ARGUMENT, ErrorCode.BAD_LENGTH))
                with m.Else():
                    m.next = "EXECUTE"

            with m.State("CONFIG_SETTLE"):
                m.d.sync += settle.eq(settle + 1)
                with m.If(settle == CONFIG_SETTLE - 1):
                    m.d.sync += head_we.eq(Mux(config_ok, Cat(head == h for h in range(p.heads)), 0))
                    m.next = "EXECUTE"

            with m.State("DRAIN"):
                m.d.comb += self.s_axis_tready.eq(1)
                with m.If(s_beat & self.s_axis_tlast):
                    fail(pending_error, Mux(pending_error == ErrorCode.BAD_LENGTH, expected, 0))
                    start_response()

            with m.State("EXECUTE"):
                with m.If(is_op[Opcode.INFO]):
                    set_length(info_beats * SB, info_beats > 0)
                    start_response()
                with m.Elif(is_op[Opcode.REG_READ]):
                    m.d.sync += resp_result.eq(reg_value)
                    start_response()
                with m.Elif(is_op[Opcode.REG_WRITE]):
                    m.d.sync += scratch.eq(arg1)
                    start_response()
                with m.Elif(is_op[Opcode.CLEAR_ERROR]):
                    m.d.sync += [error_latched.eq(0), error_code.eq(0), error_opcode.eq(0)]
                    start_response()
                with m.Elif(is_op[Opcode.CONFIGURE_HEAD]):
                    # The head's registers are written in this cycle from head_we (above).
                    with m.If(~config_ok):
                        fail(ErrorCode.BAD_ARGUMENT)
                    start_response()
                with m.Elif(is_op[Opcode.LOAD_STATE]):
                    start_response()
                with m.Elif(is_op[Opcode.READ_STATE]):
                    set_length(state_words * W, state_words > 0)
                    start_response(state_words, head_words)
                with m.Elif(is_op[Opcode.RESET_STATE]):
                    enter_clear(end_head_words, 0)
                with m.Elif(is_op[Opcode.DECODE]):
                    # The decode unit samples its head's parameters at start: cur first.
                    m.d.sync += [cur.eq(head), last.eq(head_end - 1), dec_state_base.eq(head_words),
                                 dec_stage_base.eq(stage_word), dec_out_base.eq(out_word)]
                    m.next = "DECODE_NEXT"
                with m.Elif(is_op[Opcode.HCCS]):
                    m.d.sync += [row.eq(0), hccs_active.eq(1)]
                    set_length(hccs_bytes * out_bytes, hccs_bytes_nonzero)
                    start_response()

            with m.State("DECODE"):
                with m.If(dec.done):
                    m.d.sync += tokens.eq(tokens + 1)
                    with m.If(cur_is_last):
                        set_length(decode_out_bytes, decode_out_nonzero)
                        start_response(decode_out_words, out_word)
                    with m.Else():
                        m.d.sync += [cur.eq(cur_next), dec_state_base.eq(dec_state_base + state_words),
                                     dec_stage_base.eq(dec_stage_base + 3 * dw), dec_out_base.eq(dec_out_base + dw)]
                        m.next = "DECODE_NEXT"
            with m.State("DECODE_NEXT"):
                m.d.comb += dec_start.eq(1)
                m.next = "DECODE"

            with m.State("RESPOND_HEADER"):
                # header_last (resp_beat == HB - 1 whenever a beat can leave: not while header_hold) in place of
                # the comparison.
                m.d.comb += [resp_valid.eq(~header_hold), resp_data.eq(response_header.word_select(resp_beat, SW)),
                             resp_last_beat.eq(header_last & ~resp_has_payload)]
                with m.If(header_hold):
                    m.d.sync += [header_hold.eq(0), header_last.eq(1)]
                with m.If(m_beat):
                    m.d.sync += resp_beat.eq(resp_beat + 1)
                    if HB > 1:
                        with m.If(resp_beat == HB - 2):
                            m.d.sync += header_last.eq(1)
                    with m.If(header_last):
                        m.d.sync += header_last.eq(0)
                        with m.If(~resp_has_payload):
                            finish()
                        with m.Elif(hccs_active):
                            m.d.sync += [row_index.eq(0), row_start.eq(0), fetch_valid.eq(0), fetch_elem.eq(0),
                                         fetch_addr.eq(stage_word), fetching.eq(1)]
                            m.next = "HCCS_LOAD"
                        with m.Elif(is_op[Opcode.INFO]):
                            m.next = "RESPOND_INFO"
                        with m.Else():
                            m.d.sync += words_state.eq(1)
                            m.next = "RESPOND_WORDS"

            with m.State("RESPOND_INFO"):
                m.d.comb += [resp_valid.eq(1), resp_data.eq(info_payload.word_select(info_beat, SW)),
                             resp_last_beat.eq(info_beat == info_beats - 1)]
                # info_beat is 0 from reset and returns to 0 with the last beat, so that no other state's
                # response start writes it (those writes would sit in front of its enable).
                with m.If(m_beat):
                    m.d.sync += info_beat.eq(info_beat + 1)
                    with m.If(info_beat == info_beats - 1):
                        m.d.sync += info_beat.eq(0)
                        finish()

            with m.State("RESPOND_WORDS"):
                final = word_last & at_last_word
                m.d.comb += [resp_valid.eq(1), resp_data.eq(resp_word_reg.word_select(word_beat, SW)),
                             resp_last_beat.eq(final)]
                with m.If(m_beat):
                    m.d.sync += [word_beat.eq(Mux(word_last, 0, word_beat + 1)),
                                 word_last.eq(Mux(word_last, beats_per_word == 1, word_beat == beats_per_word - 2))]
                    with m.If(word_last):
                        m.d.sync += [resp_word.eq(resp_word + 1), at_last_word.eq(resp_word + 1 == resp_last_word)]
                    with m.If(final):
                        m.d.sync += words_state.eq(0)
                        finish()

            with m.State("HCCS_LOAD"):
                # Read the row's words from staging and write its n elements into the normaliser, one a cycle.
                # fetch_elem is the element whose word (fetch_addr) is addressed this cycle; the one consumed was
                # addressed the cycle before (its byte lane in fetched_lane).
                m.d.sync += [fetch_valid.eq(1), fetch_elem.eq(fetch_elem + 1)]
                with m.If(fetch_elem[:log2(W)] == W - 1):
                    m.d.sync += fetch_addr.eq(fetch_addr + 1)
                with m.If(fetch_valid):
                    m.d.comb += hccs_row_we.eq(1)
                    m.d.sync += row_index.eq(row_index + 1)
                    with m.If(row_index == arg1_last):
                        m.d.comb += hccs_start.eq(1)
                        m.d.sync += fetching.eq(0)
                        m.next = "HCCS_RUN"
            with m.State("HCCS_RUN"):
                # The probabilities are read one cycle after their index: HCCS_PACK consumes row_index's and
                # addresses the next; HCCS_SEND holds the address of the one it will consume next.
                m.d.comb += hccs_prob_index.eq(0)
                with m.If(norm.done):
                    m.d.sync += [row_index.eq(0), beat_fill.eq(0), beat_data.eq(0)]
                    m.next = "HCCS_PACK"
            with m.State("HCCS_PACK"):
                m.d.comb += hccs_prob_index.eq(row_index + 1)
                value = Mux(row_index < arg1, norm.prob, 0)[:8 * out_bytes]
                # row_done: the row's last element is packed (row_index == n_pad when HCCS_SEND reads it), in a
                # register: a comparison there was in front of the enables of the frame's counters.
                m.d.sync += [beat_data.word_select(beat_fill, 8 * out_bytes).eq(value),
                             beat_fill.eq(beat_fill + 1), row_index.eq(row_index + 1),
                             row_done.eq(row_index + 1 == n_pad)]
                with m.If(beat_fill == elems_per_beat - 1):
                    m.next = "HCCS_SEND"
            with m.State("HCCS_SEND"):
                final = row_done & last_row
                m.d.comb += [resp_valid.eq(1), resp_data.eq(beat_data), resp_last_beat.eq(final),
                             hccs_prob_index.eq(row_index)]
                with m.If(m_beat):
                    m.d.sync += [beat_fill.eq(0), beat_data.eq(0)]
                    with m.If(final):
                        m.d.sync += hccs_active.eq(0)
                        finish()
                    with m.Elif(row_done):
                        m.d.sync += [row.eq(row + 1), row_index.eq(0), row_start.eq(next_row_start),
                                     fetch_valid.eq(0), fetch_elem.eq(next_row_start),
                                     fetch_addr.eq(next_row_addr), fetching.eq(1)]
                        m.next = "HCCS_LOAD"
                    with m.Else():
                        m.next = "HCCS_PACK"
        return m
