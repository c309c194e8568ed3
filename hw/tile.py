"""An AI-Engine-style compute tile: AXI4-Stream in and out, a local data memory, the command layer of
:mod:`somatile.hw.regmap` and the Soma decode unit, whose streaming row unit also serves the HCCS command.

Ports (flat names, so that ``AxiStreamBus.from_prefix(dut, "s_axis")`` binds): ``s_axis_tdata``
(``stream_width`` bits), ``s_axis_tvalid``, ``s_axis_tready``, ``s_axis_tlast`` in; ``m_axis_*`` out; and
``error`` (STATUS bit 0, for a board LED). Frames are little-endian byte strings, ``tlast`` on the last
beat; the behaviour, frame for frame, is that of :class:`somatile.hw.tile_model.TileModel` (its docstring
lists the checks and the fault rules) except that CYCLES_LAST counts real cycles.

Profiles (``TileParams.profile``, docs/numerics.md "Two integer profiles"): "paper" (int8 logits and output;
HCCS rows, the command's and the decode steps', through the HCCS unit of :mod:`somatile.hw.hccs`, the
decode steps' integer-exp heads through the decode unit's exp-only
:class:`~somatile.hw.soma.RowNormaliser`) or "wide" (the head registers of the wide table, an int16 DECODE
output, and every row, the HCCS command's over int16 logits included, through the wide row unit of
:mod:`somatile.hw.wide`, normalised by the head's normaliser into Q15). Either way the tile has one row unit:
the decode unit's, lent to the HCCS command between steps (:mod:`~somatile.hw.tile_rows`). The command
layer, its checks and its latencies are the same.

Contract:

- Latency and throughput: the tile accepts a frame's header and payload at one beat per cycle, executes,
  then sends the response at one beat per cycle. A DECODE frame runs as a job (its heads, then its response)
  beside the intake: from its EXECUTE on, the tile takes the next frame in. A following DECODE frame that
  passes its checks takes its payload at once (into a second q, k, v area where the local memory has room,
  ``regmap.ahead_bytes``; else once the job is done) and executes as the job's heads end and its response's
  header has left: the response's payload streams from an output buffer while the next job computes. Any
  other frame waits at its check, ``s_axis_tready`` low, until the job and its response are done. Responses
  leave in frame order. While the decode unit writes the local memory (its WRITE and STORE phases)
  ``s_axis_tready`` is low. CYCLES_LAST counts a
  command's cycles from its first header beat, or from the cycle after the previous command's last response
  beat if that is later, through its own last response beat. :func:`expected_decode_cycles` gives that count
  for a DECODE frame of ``count`` heads without stalls, on its own or behind another DECODE frame (the
  period of DECODE frames sent back to back); it depends on the tile parameters and the heads' normalisers
  and write orders only (not on the sequence position).
- Backpressure: ``m_axis_tready`` low holds the response beat; ``s_axis_tvalid`` low pauses the intake; both
  only add cycles. The response leaves through a register slice (every ``m_axis_*`` output is a register,
  one cycle of latency, full throughput).
- Reset (synchronous ``rst``) at any point, also in the middle of a frame: the tile drops the frame, clears
  every head's state in local memory (``heads * state_bytes / word`` cycles with ``s_axis_tready`` low), marks
  the heads unconfigured and clears the error and counters; the next frame starts from a clean state.
- Elaboration raises ValueError when the heads' state plus the staging area do not fit ``local_memory_bytes``.

Parts, each a component with its own contract and latency constants: the command front end
(:mod:`~somatile.hw.tile_front`: header capture and checks, ``CHECK_SETTLE``), the head registers
(:mod:`~somatile.hw.tile_heads`: ``CONFIG_SETTLE``, ``SELECT_LATENCY``), the register reader
(:mod:`~somatile.hw.tile_regs`), the payload writer and clear sweep (:mod:`~somatile.hw.tile_payload`), the
response streamer (:mod:`~somatile.hw.tile_response`), the HCCS command's rows
(:mod:`~somatile.hw.tile_rows`: elements into the row unit's beats and back) and the decode unit
(:mod:`~somatile.hw.soma`); the state machine here sequences them.
"""

from __future__ import annotations

from contextlib import contextmanager

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2 as log2

from somatile.hw import regmap
from somatile.hw.pipe import Replicated, block_ram, delay, minus_aligned, reg
from somatile.hw.regmap import PROFILE_HEAD_PARAMS, ErrorCode, Opcode, TileParams
from somatile.hw.soma import SomaDecode, output_words, overlapped_cycles
from somatile.hw.tile_front import CHECK_SETTLE, PARAMS_DELAY, CommandFront
from somatile.hw.tile_heads import CONFIG_SETTLE, DECODING_COPIES, SELECT_LATENCY, HeadRegisters
from somatile.hw.tile_payload import PayloadWriter
from somatile.hw.tile_response import ResponseStreamer, header_wait
from somatile.hw.tile_rows import CommandRows
from somatile.hw.tile_regs import VALUE_LATENCY, RegisterReader


def stream_ports(stream_width: int) -> dict:
    """The AXI4-Stream ports of a tile or an array (flat names for cocotbext-axi) and the error output."""
    return {"s_axis_tdata": In(stream_width), "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
            "s_axis_tlast": In(1), "m_axis_tdata": Out(stream_width), "m_axis_tvalid": Out(1),
            "m_axis_tready": In(1), "m_axis_tlast": Out(1), "error": Out(1)}


def decode_frame_phases(params: TileParams, configs, *, behind: bool = False) -> dict[str, int]:
    """The parts of :func:`expected_decode_cycles`: ``intake`` (header beats, ``CHECK_SETTLE`` settle cycles
    and a check cycle, payload beats), ``execute`` (one cycle and the first head's start cycle), ``heads``
    (:func:`somatile.hw.soma.overlapped_cycles` of the configs: each head after the first starts as the
    previous one is released by the decode unit's front) and ``respond`` (header and payload beats, and the
    streamer's ``header_wait``).

    ``behind`` a DECODE frame, from the end of that frame's response: the frame executes once that frame's
    heads are done and its response's header has left (the payload streams while this frame computes). With
    the second q, k, v area of ``regmap.ahead_bytes`` the intake is done by then: ``intake`` 0 and
    ``respond`` the header's cycles; without it the check cycle and the payload beats follow the heads'
    end (``intake``), and the header's cycles count only as far as they outlast them (``respond``)."""
    sb, count = params.stream_bytes, len(configs)
    header = regmap.HEADER_BYTES // sb
    payload = 3 * params.head_dim * count // sb
    respond = header + header_wait(params)
    if not behind:
        intake, respond = header + CHECK_SETTLE + 1 + payload, respond + regmap.decode_out_bytes(params) * count // sb
    else:
        intake = 0 if regmap.ahead_bytes(params) else 1 + payload
        respond = max(respond - intake, 0)
    return {"intake": intake, "execute": 2, "heads": overlapped_cycles(params, configs), "respond": respond}


def expected_decode_cycles(params: TileParams, configs, *, behind: bool = False) -> int:
    """CYCLES_LAST of a DECODE frame for heads with these configs (anything with ``normaliser``, ``hccs_mode``
    and ``include_self``, e.g. the heads' SomaConfig), with no idle input and no output backpressure: the sum of
    :func:`decode_frame_phases`. Independent of the sequence position.

    A frame on its own (``behind`` False) counts from the cycle its first header beat is accepted through the
    cycle its last response beat is accepted: header beats, ``CHECK_SETTLE`` settle cycles (the front end's)
    and a check cycle, payload beats, one execute cycle, the first head's start cycle and the heads' steps,
    each head's front beside the previous head's back (``soma.overlapped_cycles``), response header and payload
    beats (``regmap.decode_out_bytes``
    a head: int8, or int16 in the wide profile; up to the last beat entering the output register slice, which
    presents it one cycle later; a one-beat header waits for the first word's read, the streamer's
    ``header_wait``).

    ``behind``: the frame follows a DECODE frame in the stream and was taken in while that frame's job ran (at
    full rate it always is: a job outlasts a frame's intake). It counts from the cycle after the previous
    response's last beat, so that back to back this is the tile's period per DECODE frame: the execute cycle,
    the heads and the response's header (its payload streams out while the next frame computes); without the
    second q, k, v area, the check cycle and the payload too (see :func:`decode_frame_phases`)."""
    return sum(decode_frame_phases(params, configs, behind=behind).values())


def hccs_out_bytes(params: TileParams) -> int:
    """Bytes of one HCCS command output element: Q15 uint16 in the wide profile, else ``hccs_out``."""
    return regmap.hccs_out_dtype(params).itemsize


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
        mem_words = p.local_memory_bytes // p.word_bytes
        out_bytes = hccs_out_bytes(p)
        info = regmap.info_values(p, self.tile_index)
        # Two read ports: the decode unit's WEIGHTED SUM reads V rows through the second (rd_v).
        mem, (rd, rd_v) = block_ram(m, "mem", unsigned(8 * p.word_bytes), mem_words, reads=2)
        wr = mem.write_port(granularity=8)
        m.submodules.decode = dec = SomaDecode(p, mem_words)
        # The HCCS command's rows through the decode unit's row unit (lent between steps).
        m.submodules.rows = rows = CommandRows(p, out_bytes)
        wiring.connect(m, rows.unit, dec.command)
        # Command header, its checks and the sizes it implies (hw/tile_front.py).
        m.submodules.front = front = CommandFront(p)
        # Every head's parameters (hw/tile_heads.py); the header's head index bits once more, in copies written
        # with the header's first beat (for the head parameter multiplexers).
        m.submodules.heads = heads = HeadRegisters(p)
        # The payload's beats and the clear sweep (hw/tile_payload.py).
        m.submodules.payload = payload = PayloadWriter(p)
        # The response (hw/tile_response.py): header beats, then memory words, the INFO words or HCCS rows.
        m.submodules.response = resp = ResponseStreamer(p, info, out_bytes)
        seq = _Sequencer(m, self, front, heads, payload, resp, dec, rows)
        # The DECODE jobs' outputs, two halves used in turn: the decode unit's output words (dec.wr_out) go
        # here as they go to local memory, and the job's response reads them here, so that it needs no local
        # memory read while the next job computes.
        obuf, obuf_rd = block_ram(m, "out_buffer", unsigned(8 * p.word_bytes), 2 * seq.obuf_half)
        obuf_wr = obuf.write_port()
        m.d.comb += [obuf_wr.addr.eq(seq.obuf_fill), obuf_wr.data.eq(dec.wr_data), obuf_wr.en.eq(dec.wr_out),
                     obuf_rd.addr.eq(resp.rd_addr)]

        fields = front.header
        # The header head's parameters (the HCCS rule check reads three of them; the decode unit's parameters
        # are loaded from them for its first head).
        assert SELECT_LATENCY == PARAMS_DELAY
        m.d.comb += [front.data.eq(self.s_axis_tdata), front.configured.eq(heads.configured),
                     front.head_params.eq(heads.header_params), front.header_last.eq(seq.header_last),
                     heads.head.eq(fields.head), heads.block_data.eq(self.s_axis_tdata),
                     heads.select.eq(self.s_axis_tdata[16:16 + heads.index_bits]), heads.block_we.eq(payload.block_we),
                     heads.cur.eq(seq.cur), dec.head.eq(heads.cur_params)]
        wiring.connect(m, front.length, payload.length)
        decode_area = Mux(seq.is_op[Opcode.DECODE] & seq.area_next, seq.ahead_word, seq.stage_word)
        m.d.comb += [payload.base.eq(Mux(seq.is_op[Opcode.LOAD_STATE], front.head_words, decode_area)),
                     payload.data.eq(self.s_axis_tdata), payload.to_block.eq(seq.is_op[Opcode.CONFIGURE_HEAD]),
                     payload.check_counters.eq(seq.is_op[Opcode.LOAD_STATE]), payload.clear_from.eq(front.head_words)]
        m.d.comb += [resp.header.eq(Cat(Const(regmap.FRAME_MAGIC, 8), seq.resp_opcode, seq.resp_head, seq.resp_error,
                                        seq.resp_length, seq.resp_result, Const(0, 32))),
                     resp.has_payload.eq(seq.resp_has_payload), resp.rows.eq(seq.hccs_active),
                     # (a DECODE job's response may stream while the next frame's header is decoded)
                     resp.info.eq(seq.is_op[Opcode.INFO] & ~seq.resp_busy),
                     resp.rd_data.eq(Mux(seq.from_buffer, obuf_rd.data, rd.data)),
                     resp.m_axis_tready.eq(self.m_axis_tready), self.m_axis_tdata.eq(resp.m_axis_tdata),
                     self.m_axis_tvalid.eq(resp.m_axis_tvalid), self.m_axis_tlast.eq(resp.m_axis_tlast),
                     self.error.eq(seq.error_latched)]

        # Register read decode (hw/tile_regs.py): registered like every product and rule check on the captured
        # header, and read CHECK_SETTLE cycles after HEADER's last beat, when it describes this header.
        globals_ = {"ID": regmap.ID_VALUE, "API_LEVEL": regmap.API_LEVEL, "STATUS": seq.error_latched,
                    "ERROR_CODE": seq.error_code, "ERROR_OPCODE": seq.error_opcode, "CYCLES_LAST": seq.cycles_last,
                    "COMMANDS": seq.commands, "TOKENS": seq.tokens, "CONFIGURED": heads.configured,
                    "SCRATCH": seq.scratch}
        readable = ([(i * regmap.REGISTER_BYTES, globals_[name]) for i, (name, _, _) in
                     enumerate(regmap.GLOBAL_REGISTERS)]
                    + [(regmap.INFO_BASE + i * regmap.REGISTER_BYTES, value) for i, value in enumerate(info)]
                    + [(regmap.head_register(h, i), heads.regs[h][hp.name]) for h in range(p.heads)
                       for i, hp in enumerate(PROFILE_HEAD_PARAMS[p.profile])])
        m.submodules.registers = registers = RegisterReader(
            [(a, v if isinstance(v, int) else None) for a, v in readable])
        m.d.comb += [registers.address.eq(fields.arg0), front.reg_ok.eq(registers.ok)]
        for port, value in zip(registers.live, [v for _, v in readable if not isinstance(v, int)]):
            m.d.comb += port.eq(value)
        # The value is read in EXECUTE, at least one cycle after CHECK.
        assert VALUE_LATENCY <= CHECK_SETTLE + 1

        seq.drive_rows(rd)
        # Decode unit: addresses, memory ports. The current head's addresses advance with cur (no multiplier
        # between cur and the decode unit).
        m.d.comb += [dec.state_base.eq(seq.dec_state_base), dec.stage_base.eq(seq.dec_stage_base),
                     dec.out_base.eq(seq.dec_out_base), dec.rd_data.eq(rd.data), dec.start.eq(seq.dec_start),
                     rd_v.addr.eq(dec.v_rd_addr), dec.v_rd_data.eq(rd_v.data)]
        # Memory port defaults: the read address follows the response stream; writes come from the payload,
        # the clear sweep or the decode unit. The read address is selected by flags kept in registers beside
        # the state (the decode unit's busy, fetching HCCS rows, the response's own): decoded from the state and
        # counters, the selection was in front of the block RAMs' address inputs. The next DECODE frame's
        # payload may be written while the decode unit runs: never in a cycle the unit writes (the intake holds
        # its beats while the unit is in a writing phase, seq.s_beat), so the write port goes to whichever
        # writes, named by the payload writer's register.
        m.d.comb += [rd.addr.eq(Mux(dec.busy, dec.rd_addr, Mux(seq.fetching, seq.fetch_addr, resp.rd_addr))),
                     wr.addr.eq(Mux(payload.writing, payload.wr_addr, dec.wr_addr)),
                     wr.data.eq(Mux(payload.writing, payload.wr_data, dec.wr_data)),
                     wr.en.eq(payload.wr_en | dec.wr_en)]

        with m.FSM(init="CLEAR"):
            seq.intake_states()
            seq.execute_states(registers.value)
            seq.response_states()
            seq.hccs_states()
        # The DECODE job (its heads) and its response run beside the frame state machine, which meanwhile takes
        # the next frame; the response's end restarts the counts through counts_restart, a cycle later.
        with m.FSM(name="job") as job:
            seq.job_states()
        # A token's head is done (the back finishes the heads in order).
        with m.If(dec.done):
            m.d.sync += seq.tokens.eq(seq.tokens + 1)
        # The job is in DECODE_NEXT, DECODE or DRAIN: flags set and cleared with the job's transitions into and out of
        # them, in copies (each selects a share of the decode unit's parameter sources): decoded from the job's
        # state, one net reached 150 multiplexers across the die (the lone ULX3S tile's late path at f71c059,
        # seed 1: job_state -> decode.head.score_mult).
        m.d.comb += heads.decoding.eq(Cat(*(seq.decoding.copy(i) for i in range(DECODING_COPIES))))
        with m.FSM(name="job_response"):
            seq.job_response_states()
        return m


class _Sequencer:
    """The tile's command sequencing: its registers (error, counters, the response's fields, the decode loop
    over heads, the HCCS rows) and the states of its state machine, which steer the parts (front end, head
    registers, payload writer, response streamer, decode unit, the HCCS command's rows)."""

    def __init__(self, m, tile: Tile, front, heads, payload, resp, dec, rows):
        self.m, self.tile, self.front, self.heads, self.payload, self.resp = m, tile, front, heads, payload, resp
        self.dec, self.rows = dec, rows
        p = self.p = tile.params
        W = p.word_bytes
        self.state_words = regmap.state_bytes(p) // W
        self.stage_word = p.heads * self.state_words
        mem_words = p.local_memory_bytes // W
        # The next DECODE frame's q, k, v go past the staging area while a DECODE job runs, where they fit
        # (regmap.ahead_bytes); DECODE frames alternate between the two areas (area_next: the next one's).
        self.ahead = regmap.ahead_bytes(p) > 0
        self.ahead_word = self.stage_word + regmap.staging_bytes(p) // W if self.ahead else self.stage_word
        self.area_next = Signal()
        self.out_word = self.stage_word + 3 * p.heads * (p.head_dim // W)
        self.out_bytes = hccs_out_bytes(p)
        # Elements of a staging word (HCCS rows: int8, or int16 in the wide profile).
        self.word_elems = W // regmap.element_bytes(p)
        self.is_op = {op: front.is_op[op.name.lower()] for op in Opcode}
        # The states that take input beats (HEADER, PAYLOAD, DRAIN), as flags in registers kept beside the state
        # by goto: decoded from the state register, s_axis_tready and the header's and payload's beat enables
        # began paths to the write port's and the header's registers longer than the ULX3S clock period.
        for flag in self.FLAG_STATES:
            setattr(self, flag, Signal(name=flag))
        # A beat is taken in a state that accepts, so inside HEADER, PAYLOAD and DRAIN (and with at_header or
        # at_payload, which imply accepting) tvalid alone is the beat: accepting drives s_axis_tready only (as a
        # term of every beat enable it reached the payload writer's address and the header's registers, the
        # ULX3S tile's worst routes without rip-up).
        # While the decode unit is in a writing phase (dec.writes) the intake holds its beats: a payload beat's
        # write would meet the unit's at the memory's one write port (a DECODE job runs beside the intake).
        m.d.comb += [tile.s_axis_tready.eq(self.accepting & ~dec.writes),
                     resp.send_header.eq(self.sending_header), resp.send_words.eq(self.sending_words)]
        self.s_beat = tile.s_axis_tvalid & ~dec.writes
        m.d.comb += [front.beat.eq(self.s_beat & self.at_header), payload.beat.eq(self.s_beat & self.at_payload)]
        self.settle = Signal(range(max(CHECK_SETTLE, CONFIG_SETTLE) + 1))
        self.here = None  # the state whose transitions are being written (see state and goto)

        # Registers.
        self.error_latched = Signal()
        self.error_code = Signal(8)
        self.error_opcode = Signal(8)
        self.cycles_last = Signal(32)
        self.cycles_run = Signal(32)
        self.commands = Signal(32)
        self.tokens = Signal(32)
        self.scratch = Signal(32)
        m.d.sync += self.cycles_run.eq(self.cycles_run + 1)
        # finish() counts the command a cycle later, from this flag: cycles_last takes cycles_run then, which is
        # the finishing cycle's cycles_run + 1 (a header's first beat in that cycle resets cycles_run after it is
        # read). As enables decoded from the response's beat, the state register reached the 64 flip-flops of
        # COMMANDS and CYCLES_LAST (the two-tile ULX3S array's second-widest late group). A register read sees
        # them settled: it comes CHECK_SETTLE cycles after a header of several beats.
        self.finished = Signal()
        m.d.sync += self.finished.eq(0)
        # The DECODE job (job_states) counts its own cycles (job_cycles, cycles_run's value had the frame state
        # machine not moved on) and hands them to its response (job_response_states), which finishes the
        # command through resp_finished as finish() does through finished.
        self.job_busy = Signal()    # the job's heads (EXECUTE through the hand-off to its response)
        self.job_kick = Signal()
        self.decoding = Replicated(1, DECODING_COPIES, "decoding")  # the job is in DECODE_NEXT, DECODE or DRAIN
        self.job_cycles = Signal(32)
        self.out_words = Signal(range(mem_words + 1))  # the job's response words (the header's, at EXECUTE)
        # Its response: resp_busy from the hand-off through the last beat, resp_in_header while its header
        # leaves (the next job's EXECUTE rewrites the response's fields, so it waits for the header), its
        # own count (resp_cycles, job_cycles' at the hand-off), resp_finished as finished.
        self.resp_busy, self.resp_in_header, self.resp_kick = Signal(), Signal(), Signal()
        self.resp_cycles = Signal(32)
        self.resp_finished = Signal()
        # The output buffer: two halves of every head's output words; obuf_fill is where the decode unit's next
        # output word goes, from_buffer: the streamer's words come from the buffer (a job's response).
        self.obuf_half = p.heads * output_words(p)
        self.obuf_fill = Signal(range(2 * self.obuf_half))
        self.obuf_next = Signal()   # the half of the next job
        self.obuf_base = Signal(range(2 * self.obuf_half))   # the running job's half
        self.from_buffer = Signal()
        with m.If(dec.wr_out):
            m.d.sync += self.obuf_fill.eq(self.obuf_fill + 1)
        m.d.sync += [self.job_cycles.eq(self.job_cycles + 1), self.resp_cycles.eq(self.resp_cycles + 1),
                     self.resp_finished.eq(0)]
        # A job's response restarts cycles_run and job_cycles at its last beat, but a cycle late, from a register
        # (counts_restart: as the reset, the response's handshake reached their 64 flip-flops, the ULX3S tile's
        # late group without rip-up at fa1df9c7); in that cycle their readers see the 0 the restart left
        # (cycles_now, job_cycles_now), and from the next on the counts are those of a restart in time.
        self.counts_restart = Signal()
        self.cycles_now = Mux(self.counts_restart, 0, self.cycles_run)
        self.job_cycles_now = Mux(self.counts_restart, 0, self.job_cycles)
        m.d.sync += self.counts_restart.eq(0)
        with m.If(self.counts_restart):
            m.d.sync += [self.cycles_run.eq(1), self.job_cycles.eq(1)]
        with m.If(self.finished | self.resp_finished):
            m.d.sync += [self.cycles_last.eq(Mux(self.resp_finished, self.resp_cycles, self.cycles_run)),
                         self.commands.eq(self.commands + 1)]
        # A frame other than a clean DECODE waits at its check (or its BAD_END) until the job and its response
        # are done and the counters readable: busy, or done less than the register reader's latency ago.
        busy = self.job_busy | self.resp_busy
        tail = Signal(VALUE_LATENCY + 1)
        m.d.sync += tail.eq(Cat(busy, tail[:-1]))
        self.job_active = busy | reg(m, tail.any(), "job_tail")
        # The header's last beat came with tlast (the frame has no payload), from HEADER to the check.
        self.header_last = Signal()

        # Response fields.
        self.resp_opcode = Signal(8)
        self.resp_head = Signal(8)
        self.resp_error = Signal(8)
        self.resp_length = Signal(32)
        # resp_length != 0, set with it (a 32-bit comparison in RESPOND_HEADER was in front of the response's
        # and the HCCS command's registers).
        self.resp_has_payload = Signal()
        self.resp_result = Signal(32)
        self.pending_error = Signal(8)
        self.header_cut = Signal()  # the frame ended inside its header (BAD_END answers without an echo)
        self.load_length_ok = Signal()

        # The decode loop over heads.
        self.cur = Signal(8)
        self.last = Signal(8)
        self.cur_is_last = reg(m, self.cur == self.last, "cur_is_last")  # cur and last change long before a step's done
        # The decode unit's head parameters come from registers (heads.cur_params, hw/tile_heads.py), not
        # through the head multiplexer from cur. They load every cycle, in DECODE and DECODE_NEXT those of
        # cur + 1 (registered NEXT_LATENCY times behind cur), else those of the header's head (registered; the
        # header is decoded cycles before EXECUTE). The unit samples them in DECODE_NEXT, the cycle after cur
        # was set; they were loaded at that same edge (in EXECUTE for the first head, from cur + 1 of the
        # previous head for the others) and change at the earliest at the sampling edge. The normaliser takes
        # its parameters from the unit's sampled copies (n_B, ...), held for the whole step.
        self.cur_next = reg(m, self.cur + 1, "cur_next", self.cur.shape())
        self.dec_state_base = Signal(range(mem_words))
        self.dec_stage_base = Signal(range(mem_words))
        self.dec_out_base = Signal(range(mem_words))
        self.dec_start = Signal()

        # HCCS rows: row r's bytes sit at stage_word + r * n_pad / W; the output is packed into beats.
        self.hccs_active = Signal()
        self.row = Signal(32)
        self.row_index = Signal(range(regmap.padded(p.n_max) + 1))
        self.row_start = Signal(32)
        # The next row's first element is taken into row_start (and row counts) the cycle after the row changes,
        # from this flag (set by the change, clear a cycle later): as an enable decoded from the state and the
        # response's beat, the state register's route to row_start's 32 flip-flops was the two-tile ULX3S
        # array's latest.
        self.row_advance = Signal()
        self.fetch_valid = Signal()
        self.fetch_elem = Signal(32)
        self.last_row = Signal()   # row == rows_last, registered (row changes many cycles before it is read)
        m.d.sync += self.last_row.eq(self.row == front.rows_last)
        self.row_done = Signal()
        self.fetch_addr = Signal(range(mem_words + 1))
        self.fetching = Signal()
        # The next row's first element and word, in registers (row_start changes a row's length of cycles
        # before they are read): as two adders in front of the fetch registers they would not fit a cycle.
        self.next_row_start = reg(m, self.row_start + front.n_pad, "next_row_start", 32)
        self.next_row_addr = reg(m, self.stage_word + (self.next_row_start >> log2(self.word_elems)),
                                 "next_row_addr", range(mem_words + 1))
        # row (read only through last_row, a row's fetch later) counts from the flag too: behind the response's
        # beat, its 32 enables were the lone ULX3S tile's late path at 39717f3 (seed 4: send_row -> row).
        with m.If(self.row_advance):
            m.d.sync += [self.row_start.eq(self.next_row_start), self.row_advance.eq(0), self.row.eq(self.row + 1)]
        self.fetched_lane = reg(m, self.fetch_elem[:log2(self.word_elems)], "fetched_lane")
        self.hccs_row_we = Signal()
        self.hccs_configure = Signal()
        # The row's last element, padding included (the row unit takes the padding, masked).
        # n_pad is a whole number of granules: the low bits of n_pad - 1 are constants (pipe.minus_aligned).
        granule_bits = log2(regmap.FRAME_GRANULE // regmap.element_bytes(p))
        self.n_pad_last, _ = minus_aligned(m, front.n_pad, 1, granule_bits, "n_pad_last",
                                           range(regmap.padded(p.n_max)))

    # The flags kept beside the state and the states they stand for: the intake's (see ``accepting``), and the
    # response phases the streamer is told (the DECODE job's response machine sets them too: decoded from the
    # two machines' states, they began the ULX3S tile's longest path without rip-up, through the streamer's
    # done signals back into the frame state machine).
    FLAG_STATES = {"at_header": ("HEADER",), "at_payload": ("PAYLOAD",), "accepting": ("HEADER", "PAYLOAD", "DRAIN"),
                   "sending_header": ("RESPOND_HEADER",), "sending_words": ("RESPOND_WORDS",)}

    @contextmanager
    def state(self, name: str):
        """``m.State(name)``, remembering the state for :meth:`goto`."""
        with self.m.State(name):
            self.here = name
            yield
        self.here = None

    def goto(self, state: str):
        """The state machine's next state, and the flags that go with it: a flag is written only where
        the transition changes it (entering or leaving its states; it is low in the reset state CLEAR), so each
        flag's next value depends on the few transitions that touch it, not on every state's."""
        for flag, states in self.FLAG_STATES.items():
            if (state in states) != (self.here in states):
                self.m.d.sync += getattr(self, flag).eq(state in states)
        self.m.next = state

    def drive_rows(self, rd):
        """The HCCS command's rows: its head's parameters written at EXECUTE, the row's n_pad elements (those
        beyond n masked) two cycles after their fetch: the memory word is registered as it leaves the block
        RAM, the element selected out of it the next cycle."""
        m, rows, p = self.m, self.rows, self.p
        bits = 8 * regmap.element_bytes(p)
        fetched_word = reg(m, rd.data, "fetched_word")
        late_x = reg(m, fetched_word.word_select(delay(m, self.fetched_lane, 1), bits), "late_x")
        row_index, arg1 = self.row_index, self.front.header.arg1
        late_we = delay(m, self.hccs_row_we, 2, reset_less=False)
        late_mask, late_first, late_last = (delay(m, v, 2) for v in (row_index < arg1, row_index == 0,
                                                                      row_index == self.n_pad_last))
        m.d.comb += [rows.valid.eq(late_we), rows.x.eq(late_x), rows.mask.eq(late_mask), rows.first.eq(late_first),
                     rows.last.eq(late_last), rows.n_last.eq(self.n_pad_last), rows.active.eq(self.hccs_active),
                     rows.configure.eq(self.hccs_configure), rows.head.eq(self.heads.header_params)]

    def set_length(self, value, nonzero):
        self.m.d.sync += [self.resp_length.eq(value), self.resp_has_payload.eq(nonzero)]

    def fail(self, code, detail=0, echo=True):
        """The response reports error ``code`` (``detail`` in its result); the error latch keeps the first."""
        m = self.m
        m.d.sync += [self.resp_error.eq(code), self.resp_result.eq(detail)]
        self.set_length(0, 0)
        # The echo from the header (a DECODE frame's check leaves the fields to its EXECUTE, see CHECK).
        m.d.sync += [self.resp_opcode.eq(self.front.header.opcode if echo else 0),
                     self.resp_head.eq(self.front.header.head if echo else 0)]
        with m.If(~self.error_latched):
            m.d.sync += [self.error_latched.eq(1), self.error_code.eq(code),
                         self.error_opcode.eq(self.front.header.opcode if echo else 0)]

    def fail_pending(self):
        """Report the error found before the frame's end (a BAD_LENGTH with the expected length)."""
        self.fail(self.pending_error, Mux(self.pending_error == ErrorCode.BAD_LENGTH, self.front.length.expected, 0))

    def enter_clear(self, end, error):
        """The sweep clears [head_words, end), then the response reports ``error`` (0: none)."""
        self.m.d.comb += [self.payload.clear_start.eq(1), self.payload.clear_to.eq(end)]
        self.m.d.sync += self.pending_error.eq(error)
        self.goto("CLEAR")

    def start_response(self, words=0, base=0):
        self.m.d.comb += [self.resp.start.eq(1), self.resp.words.eq(words), self.resp.base.eq(base)]
        self.m.d.sync += self.from_buffer.eq(0)
        self.goto("RESPOND_HEADER")

    def finish(self):
        self.m.d.sync += self.finished.eq(1)
        self.m.d.comb += self.front.restart.eq(1)
        self.goto("HEADER")

    def intake_states(self):
        """CLEAR, then a frame's header, its check, its payload (or the drain of a refused frame)."""
        m, tile, front, payload, is_op, settle = self.m, self.tile, self.front, self.payload, self.is_op, self.settle
        fail, start_response, enter_clear = self.fail, self.start_response, self.enter_clear
        expected = front.length.expected
        header_last = self.header_last
        with self.state("CLEAR"):
            # After reset, and for RESET_STATE / a faulting LOAD_STATE: zero the sweep's range.
            m.d.comb += payload.clearing.eq(1)
            with m.If(payload.clear_last):
                with m.If(payload.after_reset):
                    m.d.comb += front.restart.eq(1)
                    self.goto("HEADER")
                with m.Else():
                    with m.If(self.pending_error != 0):
                        self.fail_pending()
                    start_response()

        with self.state("HEADER"):
            with m.If(self.s_beat):
                with m.If(front.first_beat):
                    m.d.sync += self.cycles_run.eq(1)
                    m.d.comb += self.heads.select_we.eq(1)
                with m.If(front.last_beat):
                    m.d.sync += [header_last.eq(tile.s_axis_tlast), settle.eq(0)]
                    self.goto("SETTLE")
                with m.Elif(tile.s_axis_tlast):
                    m.d.sync += self.header_cut.eq(1)
                    self.goto("BAD_END")

        with self.state("SETTLE"):
            m.d.sync += settle.eq(settle + 1)
            with m.If(settle == CHECK_SETTLE - 1):
                self.goto("CHECK")

        with self.state("CHECK"):
            m.d.sync += self.header_cut.eq(0)
            m.d.comb += payload.begin.eq(1)
            # A DECODE frame that passes its checks takes its payload at once, also while a DECODE job runs
            # (into the other q, k, v area; without one, once the job is done); its EXECUTE waits for the job
            # and sets the response's fields. Any other frame waits here until the job is done.
            # The front end's action flags (exactly one of fail ... payload set) decide, each on its own.
            action = front.action
            ahead_ok = Const(1) if self.ahead else ~self.job_busy
            with m.If(action.decode & ahead_ok):
                m.d.comb += payload.base_we.eq(1)
                self.goto("PAYLOAD")
            with m.Elif(~self.job_active):
                # No job: the response's fields from the header; the payload, or a refusal.
                m.d.sync += [self.resp_opcode.eq(front.header.opcode), self.resp_head.eq(front.header.head),
                             self.resp_error.eq(0), self.resp_result.eq(0)]
                self.set_length(0, 0)
                with m.If(action.fail):
                    fail(front.check_error, Mux(front.check_error == ErrorCode.BAD_LENGTH, expected, 0))
                    start_response()
                # The frame ends where the payload should start (refuse, clear), or carries one the opcode
                # forbids, or a check failed before its end (drain).
                with m.If(action.refuse):
                    fail(ErrorCode.BAD_LENGTH, expected)
                    start_response()
                with m.If(action.clear):
                    enter_clear(front.next_head_words, ErrorCode.BAD_LENGTH)
                with m.If(action.drain):
                    m.d.sync += self.pending_error.eq(Mux(front.check_failed, front.check_error,
                                                          ErrorCode.BAD_LENGTH))
                    self.goto("DRAIN")
                with m.If(action.execute | action.payload):
                    m.d.comb += payload.base_we.eq(1)
                with m.If(action.execute):
                    self.goto("EXECUTE")
                with m.If(action.payload):
                    self.goto("PAYLOAD")

        with self.state("PAYLOAD"):
            with m.If(self.s_beat & tile.s_axis_tlast):
                length_ok = payload.at_last_beat
                with m.If(is_op[Opcode.LOAD_STATE]):
                    # Decided in LOAD_CHECK from registers (the last beat's counter check included).
                    m.d.sync += self.load_length_ok.eq(length_ok)
                    self.goto("LOAD_CHECK")
                with m.Elif(length_ok):
                    self.goto("EXECUTE")
                    with m.If(is_op[Opcode.CONFIGURE_HEAD]):
                        m.d.sync += settle.eq(0)
                        self.goto("CONFIG_SETTLE")
                with m.Else():
                    m.d.sync += self.pending_error.eq(ErrorCode.BAD_LENGTH)
                    self.goto("BAD_END")

        with self.state("LOAD_CHECK"):
            with m.If(~self.load_length_ok | payload.counters_bad):
                enter_clear(front.next_head_words,
                            Mux(self.load_length_ok, ErrorCode.BAD_ARGUMENT, ErrorCode.BAD_LENGTH))
            with m.Else():
                self.goto("EXECUTE")

        with self.state("CONFIG_SETTLE"):
            m.d.sync += settle.eq(settle + 1)
            with m.If(settle == CONFIG_SETTLE - 1):
                m.d.comb += self.heads.commit.eq(1)
                self.goto("EXECUTE")

        with self.state("DRAIN"):
            with m.If(self.s_beat & tile.s_axis_tlast):
                self.goto("BAD_END")

        with self.state("BAD_END"):
            # The response to a frame that ended too early (inside the header: no opcode or head echoed) or
            # late, a cycle after its last beat: answered from registers, the last beat's tlast reached the
            # response's fields, the error latch and the streamer's start in one cycle (the ULX3S array's
            # latest path, s_axis_tlast -> response.resp_beat). It waits for a DECODE job's end, as CHECK does.
            with m.If(~self.job_active):
                with m.If(self.header_cut):
                    fail(ErrorCode.BAD_LENGTH, 0, echo=False)
                with m.Else():
                    self.fail_pending()
                start_response()

    def execute_states(self, reg_value):
        """EXECUTE (a command's one cycle, or the start of its decode loop or clear sweep) and the decode loop;
        ``reg_value``: the register reader's value for the header's address."""
        m, front, is_op, p, dec = self.m, self.front, self.is_op, self.p, self.dec
        start_response, set_length = self.start_response, self.set_length
        dw = p.head_dim // p.word_bytes
        with self.state("EXECUTE"):
            with m.If(self.job_busy | self.resp_in_header):
                pass   # a DECODE frame taken in while the previous job ran waits for its heads and header
            with m.Elif(is_op[Opcode.INFO]):
                set_length(self.resp.info_beats * p.stream_bytes, self.resp.info_beats > 0)
                start_response()
            with m.Elif(is_op[Opcode.REG_READ]):
                m.d.sync += self.resp_result.eq(reg_value)
                start_response()
            with m.Elif(is_op[Opcode.REG_WRITE]):
                m.d.sync += self.scratch.eq(front.header.arg1)
                start_response()
            with m.Elif(is_op[Opcode.CLEAR_ERROR]):
                m.d.sync += [self.error_latched.eq(0), self.error_code.eq(0), self.error_opcode.eq(0)]
                start_response()
            with m.Elif(is_op[Opcode.CONFIGURE_HEAD]):
                # The head's registers are written in this cycle (committed in CONFIG_SETTLE).
                with m.If(~self.heads.config_ok):
                    self.fail(ErrorCode.BAD_ARGUMENT)
                start_response()
            with m.Elif(is_op[Opcode.LOAD_STATE]):
                start_response()
            with m.Elif(is_op[Opcode.READ_STATE]):
                set_length(self.state_words * p.word_bytes, self.state_words > 0)
                start_response(self.state_words, front.head_words)
            with m.Elif(is_op[Opcode.RESET_STATE]):
                self.enter_clear(front.end_head_words, 0)
            with m.Elif(is_op[Opcode.DECODE]):
                # The job takes everything it needs from the header now (the next frame's replaces it): the
                # decode unit samples its head's parameters at start, cur first; the response's fields. The
                # frame state machine goes on to the next frame's header.
                area = self.area_next
                m.d.sync += [self.cur.eq(front.header.head), self.last.eq(front.head_end - 1),
                             self.dec_state_base.eq(front.head_words),
                             self.dec_stage_base.eq(Mux(area, self.ahead_word, self.stage_word)),
                             self.dec_out_base.eq(self.out_word), self.area_next.eq(~area if self.ahead else 0),
                             self.resp_opcode.eq(Opcode.DECODE), self.resp_head.eq(front.header.head),
                             self.resp_error.eq(0), self.resp_result.eq(0), self.out_words.eq(front.decode_out_words),
                             self.job_busy.eq(1), self.job_cycles.eq(self.cycles_now + 1),
                             self.obuf_fill.eq(Mux(self.obuf_next, self.obuf_half, 0)),
                             self.obuf_base.eq(Mux(self.obuf_next, self.obuf_half, 0)),
                             self.obuf_next.eq(~self.obuf_next)]
                set_length(front.decode_out_bytes, front.decode_out_nonzero)
                m.d.comb += [self.job_kick.eq(1), front.restart.eq(1)]
                self.goto("HEADER")
            with m.Elif(is_op[Opcode.HCCS]):
                m.d.sync += [self.row.eq(0), self.hccs_active.eq(1)]
                m.d.comb += self.hccs_configure.eq(1)
                # hccs_bytes counts the input rows' bytes; the output element may be wider (paper int16).
                set_length(front.hccs_bytes * (self.out_bytes // regmap.element_bytes(p)), front.hccs_bytes_nonzero)
                start_response()

    def job_states(self):
        """The DECODE job: its heads through the decode unit (each started as the unit's front releases the
        previous one, so that a head's LOAD runs beside the previous head's normaliser and its scores beside
        that head's weighted sum; the job
        waits in DRAIN for the last head's done), then the hand-off of its
        response to :meth:`job_response_states` (at once, or when the previous job's response is done). It
        starts in the frame's EXECUTE cycle (job_kick)."""
        m, dec, p = self.m, self.dec, self.p
        dw = p.head_dim // p.word_bytes
        with m.State("IDLE"):
            with m.If(self.job_kick):
                m.d.sync += self.decoding.eq(1)
                m.next = "DECODE_NEXT"
        with m.State("DECODE_NEXT"):
            m.d.comb += self.dec_start.eq(1)
            m.next = "DECODE"
        with m.State("DECODE"):
            # The next head starts as soon as the unit's front has released this one (handed); the last
            # head's done ends the job (the back finishes one head at a time, in order).
            with m.If(dec.handed):
                with m.If(self.cur_is_last):
                    m.next = "DRAIN"
                with m.Else():
                    m.d.sync += [self.cur.eq(self.cur_next),
                                 self.dec_state_base.eq(self.dec_state_base + self.state_words),
                                 self.dec_stage_base.eq(self.dec_stage_base + 3 * dw),
                                 self.dec_out_base.eq(self.dec_out_base + output_words(p))]
                    m.next = "DECODE_NEXT"
        with m.State("DRAIN"):
            with m.If(dec.done):
                m.d.sync += self.decoding.eq(0)
                with m.If(self.resp_busy):
                    m.next = "HAND_OFF"
                with m.Else():
                    self.hand_off()
        with m.State("HAND_OFF"):
            with m.If(~self.resp_busy):
                self.hand_off()

    def hand_off(self):
        """The job's response starts (from its half of the output buffer); the job is done."""
        m = self.m
        m.d.comb += [self.resp.start.eq(1), self.resp.words.eq(self.out_words), self.resp.base.eq(self.obuf_base),
                     self.resp_kick.eq(1)]
        m.d.sync += [self.from_buffer.eq(1), self.job_busy.eq(0), self.resp_busy.eq(1), self.resp_in_header.eq(1),
                     self.resp_cycles.eq(self.job_cycles_now + 1), self.sending_header.eq(1)]
        m.next = "IDLE"

    def job_response_states(self):
        """A DECODE job's response (header and output words) while the next job may compute. Its last beat
        restarts cycles_run and job_cycles: the next frame's CYCLES_LAST counts from the cycle after, or from
        its first header beat if that is later."""
        m = self.m
        with m.State("IDLE"):
            with m.If(self.resp_kick):
                m.next = "RESPOND_HEADER"
        with m.State("RESPOND_HEADER"):
            with m.If(self.resp.header_done):
                m.d.sync += [self.resp_in_header.eq(0), self.sending_header.eq(0)]
                with m.If(self.resp_has_payload):
                    m.d.sync += self.sending_words.eq(1)
                    m.next = "RESPOND_WORDS"
                with m.Else():
                    self.job_finish()
        with m.State("RESPOND_WORDS"):
            with m.If(self.resp.words_done):
                self.job_finish()

    def job_finish(self):
        self.m.d.sync += [self.resp_finished.eq(1), self.resp_busy.eq(0), self.resp_in_header.eq(0),
                          self.sending_header.eq(0), self.sending_words.eq(0), self.counts_restart.eq(1)]
        self.m.next = "IDLE"

    def response_states(self):
        """The response's header, then its INFO or memory words (an HCCS response goes on in hccs_states)."""
        m, resp, finish = self.m, self.resp, self.finish
        with self.state("RESPOND_HEADER"):
            with m.If(resp.header_done):
                with m.If(~self.resp_has_payload):
                    finish()
                with m.Elif(self.hccs_active):
                    m.d.sync += [self.row_index.eq(0), self.row_start.eq(0), self.fetch_valid.eq(0),
                                 self.fetch_elem.eq(0), self.fetch_addr.eq(self.stage_word), self.fetching.eq(1)]
                    self.goto("HCCS_LOAD")
                with m.Elif(self.is_op[Opcode.INFO]):
                    self.goto("RESPOND_INFO")
                with m.Else():
                    self.goto("RESPOND_WORDS")
        with self.state("RESPOND_INFO"):
            m.d.comb += resp.send_info.eq(1)
            with m.If(resp.info_done):
                finish()
        with self.state("RESPOND_WORDS"):
            with m.If(resp.words_done):
                finish()

    def hccs_states(self):
        """The HCCS command's rows: each loaded from staging into the row unit, its probabilities packed into
        the response's beats as the unit answers them, sent."""
        m, resp, rows = self.m, self.resp, self.rows
        row_index, fetch_elem, fetch_addr = self.row_index, self.fetch_elem, self.fetch_addr
        with self.state("HCCS_LOAD"):
            # Read the row's words from staging and hand its n_pad elements to the row unit, one a cycle (the
            # padding masked). fetch_elem is the element whose word (fetch_addr) is addressed this cycle; the
            # one consumed was addressed the cycle before (its lane in fetched_lane).
            m.d.sync += [self.fetch_valid.eq(1), fetch_elem.eq(fetch_elem + 1)]
            with m.If(fetch_elem[:log2(self.word_elems)] == self.word_elems - 1):
                m.d.sync += fetch_addr.eq(fetch_addr + 1)
            with m.If(self.fetch_valid):
                m.d.comb += self.hccs_row_we.eq(1)
                m.d.sync += row_index.eq(row_index + 1)
                with m.If(row_index == self.n_pad_last):
                    m.d.sync += self.fetching.eq(0)
                    # The unit answers the row as it comes: its elements are packed as they arrive.
                    m.d.comb += resp.pack_clear.eq(1)
                    self.goto("HCCS_PACK")
        with self.state("HCCS_PACK"):
            # One element a cycle from the row unit; row_done: it was the row's last.
            m.d.comb += [rows.take.eq(1), resp.pack.eq(rows.out_valid), resp.value.eq(rows.value)]
            with m.If(rows.out_valid):
                m.d.sync += self.row_done.eq(rows.final)
                # The next row's fetch from its first element, set with the row's last answer rather than with
                # the beat HCCS_SEND sends (behind the beat's handshake, their enables were the ULX3S tile's late
                # path send_row -> row_index, fetch_elem at 6db64c4): the row's fetch ended long before. After
                # the last row they are unused (RESPOND_HEADER sets them for the next command).
                with m.If(rows.final):
                    m.d.sync += [row_index.eq(0), self.fetch_valid.eq(0), fetch_elem.eq(self.next_row_start),
                                 fetch_addr.eq(self.next_row_addr)]
                with m.If(resp.beat_full):
                    self.goto("HCCS_SEND")
        with self.state("HCCS_SEND"):
            final = self.row_done & self.last_row
            m.d.comb += [resp.send_row.eq(1), resp.row_last.eq(final)]
            with m.If(resp.beat):
                with m.If(final):
                    m.d.sync += self.hccs_active.eq(0)
                    self.finish()
                with m.Elif(self.row_done):
                    m.d.sync += [self.row_advance.eq(1), self.fetching.eq(1)]
                    self.goto("HCCS_LOAD")
                with m.Else():
                    self.goto("HCCS_PACK")
