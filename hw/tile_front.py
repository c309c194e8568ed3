"""The tile's command front end: the command header captured from the input stream, and the header's checks
(in the order of :class:`somatile.hw.tile_model.TileModel`) with the sizes and addresses the command derives
from it, as a pipeline of registered steps.

Contract:

- Capture: each cycle with ``beat`` high writes ``data`` into the header's next beat (``first_beat`` and
  ``last_beat`` say which beat comes next); ``restart`` makes the next beat a header's first. The fields
  (``header``) are read only once a frame's header is in (the register has no reset).
- Checks: free running on the captured header; every output describes the header of :data:`CHECK_SETTLE`
  cycles before (at most), provided the inputs do: ``reg_ok`` (the register reader's ``ok`` for the header's
  ``arg0``, :data:`somatile.hw.tile_regs.OK_LATENCY` behind it), ``configured``, and the header head's
  parameters ``head_params`` (:func:`somatile.hw.soma.head_params_layout` of the profile; the paper's HCCS
  rules read ``hccs_B``/``hccs_S``/``hccs_dmax``) at most :data:`PARAMS_DELAY` cycles after the header's last beat.
  ``check_error`` is the model's error code of the first failing check (0: none; ``check_failed`` is
  ``check_error != 0`` in a register of its own, ``action`` what the tile does with the frame given the
  ``header_last`` it holds, :data:`CHECK_ACTIONS`); ``length`` (:data:`PAYLOAD_LENGTH`, for the payload
  writer) holds the payload length the opcode expects (``expected``, the detail of a BAD_LENGTH).

Why a pipeline: the header register fans out to every check, product and comparison below; each is
registered on its own (at most 4 cycles after the header, the HCCS rules' RULES_LATENCY after the head's
parameters), then the priority of the checks, so that the state machine's branches on the result (CHECK,
PAYLOAD, EXECUTE, RESPOND_HEADER in the tile) start from flip-flops.
"""

from __future__ import annotations

import math

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2 as log2

from somatile.hw import regmap
from somatile.hw.hccs_rules import LATENCY as RULES_LATENCY, rules_ok
from somatile.hw.pipe import lut_mul, lut_mul_pipelined, minus_aligned, reg
from somatile.hw.regmap import HEAD_PARAMS, ErrorCode, Opcode, TileParams
from somatile.hw.soma import head_params_layout
from somatile.hw.tile_regs import OK_LATENCY

HEADER_LAYOUT = data.StructLayout({"magic": 8, "opcode": 8, "head": 8, "count": 8, "length": 32, "arg0": 32,
                                   "arg1": 32})
"""A command header's fields (regmap.HEADER_BYTES, little-endian)."""
OPCODE_FLAGS = data.StructLayout({op.name.lower(): 1 for op in Opcode})
"""One flag per opcode: the header's opcode is that one."""
PAYLOAD_LENGTH = wiring.Signature({"expected": Out(32), "last_beat_at": Out(signed(34)), "first_is_last": Out(1),
                                   "before_last_beat": Out(signed(35))})
"""The payload length the opcode expects and what the payload's byte counter is compared with: the byte count
of the payload's last beat (``expected - stream_bytes``), whether the first beat is the last, and the count
of the beat before the last."""
PARAMS_DELAY = 1
"""Cycles after the header's last beat (at most) that the header head's parameters reach ``hccs_*``: the
tile registers them from an index written with the header's first beat."""
CHECK_ACTIONS = data.StructLayout({name: 1 for name in
                                   ("fail", "execute", "clear", "refuse", "drain", "payload", "decode")})
"""``action``: what the tile's CHECK state does with the frame (given ``header_last``, its register: the frame
ended with the header), exactly one of the first six set: ``fail`` (a check failed: answer its error), ``execute``
(no payload expected), ``clear`` (a LOAD_STATE without its payload: clear the head's state), ``refuse`` (any other
command without the payload it expects: answer BAD_LENGTH), ``drain`` (the frame goes on though a check failed or
no payload is expected: drain it), ``payload`` (take the payload); ``decode``: ``payload`` of a DECODE frame."""

CHECK_SETTLE = PARAMS_DELAY + RULES_LATENCY + 1
"""Cycles between a header's last beat and the check result: the head parameters, the HCCS rules
(RULES_LATENCY), the check result's register."""


class CommandFront(wiring.Component):
    """The front end of a tile with :class:`~somatile.hw.regmap.TileParams` ``params``; the ports are listed
    in the module docstring (the sizes: ``head_end``, ``n_pad`` (arg1 rounded up to
    the elements of a frame granule: a row's elements, padding included, ``regmap.hccs_row_bytes`` /
    ``regmap.element_bytes``), ``rows_last`` (arg0 - 1), ``hccs_bytes`` (arg0 * the row's bytes) and its
    ``!= 0``, the DECODE
    output's ``decode_out_bytes``/``_words`` and ``count != 0``, the head's state addresses in words
    ``head_words``, ``next_head_words`` and ``end_head_words`` (of head, head + 1, head_end))."""

    def __init__(self, params: TileParams):
        self.params = p = params
        mem_words = p.local_memory_bytes // p.word_bytes
        n_pad_shape = Shape.cast(range(regmap.padded(p.n_max) + 1))
        hccs_bits = 32 + n_pad_shape.width - log2(regmap.FRAME_GRANULE // regmap.element_bytes(p))
        super().__init__({
            "beat": In(1), "data": In(8 * p.stream_bytes), "restart": In(1), "first_beat": Out(1),
            "last_beat": Out(1), "header": Out(HEADER_LAYOUT),
            "reg_ok": In(1), "configured": In(p.heads),
            "head_params": In(head_params_layout(p.profile)),
            "check_error": Out(8), "check_failed": Out(1), "is_op": Out(OPCODE_FLAGS), "no_payload": Out(1),
            "header_last": In(1), "action": Out(CHECK_ACTIONS),
            "length": Out(PAYLOAD_LENGTH),
            "head_end": Out(9), "n_pad": Out(n_pad_shape), "rows_last": Out(signed(33)),
            "hccs_bytes": Out(hccs_bits + log2(regmap.FRAME_GRANULE)), "hccs_bytes_nonzero": Out(1),
            "decode_out_bytes": Out(32), "decode_out_nonzero": Out(1), "decode_out_words": Out(range(mem_words + 1)),
            "head_words": Out(32), "next_head_words": Out(32), "end_head_words": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        self.capture(m)
        fields = self.header
        opcode, head, count, arg1 = fields.opcode, fields.head, fields.count, fields.arg1
        is_counted = (opcode == Opcode.DECODE) | (opcode == Opcode.RESET_STATE)
        self.sizes(m, is_counted)
        head_end, hccs_bytes, expected = self.head_end, self.hccs_bytes, self.length.expected

        # Header checks (combinational on the captured header), in the order of tile_model.
        is_head_op = Signal()
        known = Signal()
        m.d.comb += known.eq(0)
        with m.Switch(opcode):
            for op in Opcode:
                with m.Case(int(op)):
                    m.d.comb += known.eq(1)
                    if op in (Opcode.CONFIGURE_HEAD, Opcode.LOAD_STATE, Opcode.READ_STATE, Opcode.DECODE,
                              Opcode.HCCS, Opcode.RESET_STATE):
                        m.d.comb += is_head_op.eq(1)
        bad_head = is_head_op & ((head >= p.heads) | (head_end > p.heads) | (is_counted & (count == 0)))
        # The register reader's ok (hw/tile_regs.py) feeds a registered condition and the registered check
        # result read CHECK_SETTLE cycles after the header.
        assert OK_LATENCY + 2 <= CHECK_SETTLE + 1
        scratch_address = [n for n, _, _ in regmap.GLOBAL_REGISTERS].index("SCRATCH") * regmap.REGISTER_BYTES
        rows = fields.arg0
        bad_hccs_args = ((arg1 < 1) | (arg1 > p.n_max) | (rows < 1) | (hccs_bytes > regmap.staging_bytes(p)))
        cmd_head_ok = head < p.heads
        # 6 cycles after the header (PARAMS_DELAY + RULES_LATENCY).
        hccs = self.head_params
        if p.profile == "wide":
            # The wide rule (wide.check_params of the head's normaliser) depends on no row length and is the
            # rule CONFIGURE_HEAD applied to the head: a configured head (NOT_CONFIGURED is checked first) passes.
            hccs_param_ok = Const(1)
        else:
            hccs_param_ok = rules_ok(m, "hccs_param_ok", hccs.hccs_B, hccs.hccs_S, hccs.hccs_dmax, arg1[:16])
        mask = Signal(p.heads)
        for h in range(p.heads):
            m.d.comb += mask[h].eq((h >= head) & (h < head_end))
        heads_configured = (self.configured & mask) == mask

        # Each condition is registered on its own (at most 4 cycles after the header), then the priority.
        conditions = [
            (reg(m, fields.magic != regmap.FRAME_MAGIC), ErrorCode.BAD_MAGIC),
            (reg(m, ~known), ErrorCode.UNKNOWN_OPCODE),
            (reg(m, bad_head), ErrorCode.BAD_HEAD),
            (reg(m, ((opcode == Opcode.REG_READ) & ~self.reg_ok) |
                 ((opcode == Opcode.REG_WRITE) & (fields.arg0 != scratch_address))), ErrorCode.BAD_REGISTER),
            (reg(m, (opcode == Opcode.HCCS) & bad_hccs_args), ErrorCode.BAD_ARGUMENT),
            (reg(m, ((opcode == Opcode.DECODE) | (opcode == Opcode.HCCS)) & ~heads_configured),
             ErrorCode.NOT_CONFIGURED),
            (reg(m, (opcode == Opcode.HCCS) & cmd_head_ok) & ~hccs_param_ok, ErrorCode.BAD_ARGUMENT),
            (reg(m, fields.length != expected), ErrorCode.BAD_LENGTH),
        ]
        check_error_now = Signal(8)
        for condition, code in reversed(conditions):
            with m.If(condition):
                m.d.comb += check_error_now.eq(code)
        m.d.comb += [self.check_error.eq(reg(m, check_error_now, "check_error")),
                     self.check_failed.eq(reg(m, check_error_now != 0, "check_failed"))]  # check_error != 0, beside it
        # The opcode as one flag per command, and expected == 0, registered in the settle cycles: the state
        # machine's branches on them then start from flip-flops.
        for op in Opcode:
            m.d.comb += self.is_op[op.name.lower()].eq(reg(m, opcode == op, f"is_{op.name.lower()}"))
        m.d.comb += self.no_payload.eq(reg(m, expected == 0, "no_payload"))
        # What the tile's CHECK does with the frame, one flag each, beside check_failed (the tile's decision
        # from check_failed, header_last, no_payload and the opcode took up to seven LUTs in front of the
        # response's fields: the ULX3S tile's late paths without rip-up at f864cce).
        failed, no_payload, ended = check_error_now != 0, expected == 0, self.header_last
        actions = {"fail": ended & failed, "execute": ended & ~failed & no_payload,
                   "clear": ended & ~failed & ~no_payload & (opcode == Opcode.LOAD_STATE),
                   "refuse": ended & ~failed & ~no_payload & (opcode != Opcode.LOAD_STATE),
                   "drain": ~ended & (failed | no_payload), "payload": ~ended & ~failed & ~no_payload,
                   "decode": ~ended & ~failed & ~no_payload & (opcode == Opcode.DECODE)}
        for name, value in actions.items():
            m.d.comb += self.action[name].eq(reg(m, value, f"action_{name}"))
        return m

    def capture(self, m):
        """The header register, written a beat at a time."""
        SB = self.params.stream_bytes
        HB = regmap.HEADER_BYTES // SB
        header = Signal(8 * regmap.HEADER_BYTES, reset_less=True)  # read only after a frame's header is in
        header_beat = Signal(range(HB + 1))
        with m.If(self.beat):
            m.d.sync += [header.word_select(header_beat, 8 * SB).eq(self.data), header_beat.eq(header_beat + 1)]
        with m.If(self.restart):
            m.d.sync += header_beat.eq(0)
        m.d.comb += [self.header.eq(header), self.first_beat.eq(header_beat == 0),
                     self.last_beat.eq(header_beat == HB - 1)]

    def sizes(self, m, is_counted):
        """The command's sizes and addresses from the header fields (registered) and the payload length the
        opcode expects with the registers the payload's byte counter is compared with; ``is_counted``: the
        opcode takes ``count`` heads."""
        p = self.params
        SB, D = p.stream_bytes, p.head_dim
        fields = self.header
        head, count, arg1 = fields.head, fields.count, fields.arg1
        state_words = regmap.state_bytes(p) // p.word_bytes
        out = {"head_end": reg(m, head + Mux(is_counted, count, 1), "head_end", unsigned(9))}
        # HCCS command arguments: rows * the row's bytes, 3 cycles after the header: n_pad is a multiple of the
        # granule's elements, so the product is rows times its few high bits, in the fabric (a DSP block's row
        # is too far from the header register).
        granule = regmap.FRAME_GRANULE // regmap.element_bytes(p)   # elements of a granule
        n_pad = out["n_pad"] = reg(m, (arg1[:16] + granule - 1) & ~(granule - 1), "n_pad",
                                   range(regmap.padded(p.n_max) + 1))
        rows = fields.arg0
        out["rows_last"] = reg(m, rows - 1, "rows_last", signed(33))
        granule_bits = log2(granule)
        hi_shape = unsigned(len(rows) + len(n_pad) - granule_bits)
        hccs_bytes = out["hccs_bytes"] = lut_mul_pipelined(m, rows, n_pad[granule_bits:], "hccs_bytes_hi",
                                                           hi_shape) << log2(regmap.FRAME_GRANULE)
        out["hccs_bytes_nonzero"] = reg(m, hccs_bytes != 0, "hccs_bytes_nonzero")  # 4 cycles after

        # Products of header fields, registered like hccs_bytes (the first settle cycle).
        decode_bytes = reg(m, 3 * D * count, "decode_bytes", unsigned(32))
        out["decode_out_bytes"] = reg(m, regmap.decode_out_bytes(p) * count, "decode_out_bytes", unsigned(32))
        out["decode_out_nonzero"] = reg(m, count != 0, "decode_out_nonzero")
        out["decode_out_words"] = reg(m, regmap.decode_out_bytes(p) // p.word_bytes * count, "decode_out_words",
                                      range(p.local_memory_bytes // p.word_bytes + 1))
        # Products by the constant state_words as shifted sums in the fabric (a DSP block's row is too far from
        # the header register).
        head_words = out["head_words"] = reg(m, lut_mul(head, Const(state_words)), "head_words", unsigned(32))
        # (head + 1) * state_words as a sum: an adder in front of a multiplier is two slow steps in one cycle.
        out["next_head_words"] = reg(m, head_words + state_words, "next_head_words", unsigned(32))
        out["end_head_words"] = reg(m, lut_mul(out["head_end"], Const(state_words)), "end_head_words", unsigned(32))

        # The payload length the opcode expects, registered at the end of the second settle cycle.
        expected_now = Signal(32)
        with m.Switch(fields.opcode):
            with m.Case(Opcode.CONFIGURE_HEAD):
                m.d.comb += expected_now.eq(regmap.padded(regmap.REGISTER_BYTES * len(HEAD_PARAMS)))
            with m.Case(Opcode.LOAD_STATE):
                m.d.comb += expected_now.eq(regmap.state_bytes(p))
            with m.Case(Opcode.DECODE):
                m.d.comb += expected_now.eq(decode_bytes)
            with m.Case(Opcode.HCCS):
                m.d.comb += expected_now.eq(hccs_bytes)
        expected = out["expected"] = reg(m, expected_now, "expected")
        # byte_count of the payload's last beat; byte_count == last_beat_at is kept in a register (the tile's
        # at_last_beat) beside byte_count, from these two. Every expected length is a multiple of `align`, so
        # their low bits are constants, outside the registers: registered, they would hold a nonzero constant
        # from their first load but start from 0, and Yosys shared one tile's with the other's in a flattened
        # array (tile0's last_beat_at drove tile1's payload comparisons).
        align = math.gcd(regmap.padded(regmap.REGISTER_BYTES * len(HEAD_PARAMS)), regmap.state_bytes(p), 3 * D,
                         regmap.FRAME_GRANULE)
        low = (align & -align).bit_length() - 1
        last_beat_at, rest = minus_aligned(m, expected, SB, low, "last_beat_at", signed(34))
        out["last_beat_at"] = last_beat_at
        out["first_is_last"] = reg(m, last_beat_at == 0, "first_is_last")
        out["before_last_beat"], _ = minus_aligned(m, last_beat_at, SB, low, "before_last_beat", signed(35), rest)
        m.d.comb += [self.head_end.eq(out["head_end"]), self.n_pad.eq(n_pad),
                     self.rows_last.eq(out["rows_last"]), self.hccs_bytes.eq(hccs_bytes),
                     self.hccs_bytes_nonzero.eq(out["hccs_bytes_nonzero"]),
                     self.decode_out_bytes.eq(out["decode_out_bytes"]),
                     self.decode_out_nonzero.eq(out["decode_out_nonzero"]),
                     self.decode_out_words.eq(out["decode_out_words"]), self.head_words.eq(head_words),
                     self.next_head_words.eq(out["next_head_words"]), self.end_head_words.eq(out["end_head_words"]),
                     self.length.expected.eq(expected), self.length.last_beat_at.eq(last_beat_at),
                     self.length.first_is_last.eq(out["first_is_last"]),
                     self.length.before_last_beat.eq(out["before_last_beat"])]
