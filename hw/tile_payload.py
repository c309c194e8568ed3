"""The tile's payload writer and clear sweep: where a command's payload beats go (local memory words, or the
CONFIGURE_HEAD block of hw/tile_heads.py), the byte counter that finds the payload's last beat, the
LOAD_STATE counter checks, and the sweep that zeroes a range of memory words.

Contract:

- ``begin`` (the tile's CHECK cycle) starts a payload of ``length`` (the front end's
  :data:`~somatile.hw.tile_front.PAYLOAD_LENGTH`); ``base_we`` sets the word the
  first beat goes to (``base``). Each cycle with ``beat`` is one payload beat (``data``): while the payload
  lasts it is written into memory at its word and byte lane, or, with ``to_block``, raises its bit of the
  block's one-hot ``block_we`` (combinational); with ``check_counters`` (LOAD_STATE), a ring counter of the
  state beyond its limit sets ``counters_bad``. ``at_last_beat``: the next beat is the payload's last.
- ``clear_start`` sets the sweep's range [``clear_from``, ``clear_to``) (at least two words); each cycle with
  ``clearing`` zeroes a word, ``clear_last``: the word zeroed in this cycle is the range's last. After reset
  the range is every head's state and ``after_reset`` is high until the first ``clear_start``.
- Memory: ``wr_addr``/``wr_data``/``wr_en`` are the memory write port's, :data:`WRITE_LATENCY` cycles after
  the beat or the sweep's cycle that makes them; nothing reads a word in the cycle after they write it.
  ``writing`` (a register) is high exactly when ``wr_en`` is not zero: the tile selects the write port's
  address and data with it.

Why registers in front of the write port: the state, the opcode and the byte counter decoded in front of the
block RAMs' write ports were the tile's longest paths. ``in_payload`` (byte_count < expected) is kept in a
register beside the byte counter: it gates the write port, where a 32-bit comparison in the same cycle was
among the longest paths of the ECP5 tile.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2 as log2

from somatile.hw import regmap
from somatile.hw.pipe import reg
from somatile.hw.regmap import TileParams
from somatile.hw.tile_front import PAYLOAD_LENGTH
from somatile.hw.tile_heads import BLOCK_BYTES

WRITE_LATENCY = 1
"""Cycles from a payload beat (or a sweep cycle) to its write at the memory port: the write registers."""


class PayloadWriter(wiring.Component):
    """The writer of a tile with :class:`~somatile.hw.regmap.TileParams` ``params``; ports as in the module
    docstring."""

    def __init__(self, params: TileParams):
        self.params = p = params
        mem_words = p.local_memory_bytes // p.word_bytes
        W = p.word_bytes
        super().__init__({
            "begin": In(1), "length": In(PAYLOAD_LENGTH), "base_we": In(1), "base": In(range(mem_words + 1)),
            "beat": In(1), "data": In(8 * p.stream_bytes), "to_block": In(1), "check_counters": In(1),
            "block_we": Out(BLOCK_BYTES // p.stream_bytes), "at_last_beat": Out(1), "counters_bad": Out(1),
            "clear_start": In(1), "clear_from": In(range(mem_words + 1)), "clear_to": In(range(mem_words + 1)),
            "clearing": In(1), "clear_last": Out(1), "after_reset": Out(1),
            "wr_addr": Out(range(mem_words)), "wr_data": Out(8 * W), "wr_en": Out(W), "writing": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        SB, W = p.stream_bytes, p.word_bytes
        beats_per_word = W // SB
        mem_words = p.local_memory_bytes // W
        # The writes reach the memory a cycle late, from registers (host_*): the state, the opcode and the byte
        # counter decoded in front of the block RAMs' write ports were the tile's longest paths. Nothing reads a
        # word in the cycle after it is written by them.
        host_addr, host_data, host_en = Signal.like(self.wr_addr), Signal.like(self.wr_data), Signal.like(self.wr_en)
        m.d.comb += [port.eq(reg(m, value, f"host_{name}", reset_less=name != "en")) for name, value, port in
                     (("addr", host_addr, self.wr_addr), ("data", host_data, self.wr_data),
                      ("en", host_en, self.wr_en))]
        m.d.comb += self.writing.eq(reg(m, host_en.any(), "host_writing"))
        # The address and data registers take the payload's next word and the beat's data every cycle (the clear
        # sweep's aside): host_en alone says whether they are written, so no enable decoded from the handshake
        # (the intake's valid, the decode unit's writes, the payload's position) reaches all of their bits (the
        # two-tile array's s_axis_tvalid -> wr_data, wr_addr group at fa1df9c7).
        m.d.comb += host_data.eq(Mux(self.clearing, 0, Cat(*[self.data] * beats_per_word)))

        byte_count = Signal(32)
        # byte_count < expected, kept in a register beside byte_count (it gates the memory's write port, where a
        # 32-bit comparison in the same cycle was among the longest paths of the ECP5 tile).
        in_payload = Signal()
        payload_addr = Signal(range(mem_words + 1))   # word the next payload beat goes to
        clear_word = Signal(range(mem_words + 1))
        m.d.comb += host_addr.eq(Mux(self.clearing, clear_word, payload_addr))
        counters_bad = Signal()
        at_last_beat = Signal()
        m.d.comb += [self.at_last_beat.eq(at_last_beat), self.counters_bad.eq(counters_bad)]
        counter_offset = dict((n, o) for n, o, _, _ in regmap.state_layout(p))["counters"]
        counter_limits = (p.ring - 1, p.ring, (1 << 31) - 1)
        beat_counters_bad = Signal()
        for i, limit in enumerate(counter_limits):
            offset = counter_offset + 4 * i
            value = self.data.word_select((offset % SB) // 4, 32)
            with m.If((byte_count == offset - offset % SB) & (value > limit)):
                m.d.comb += beat_counters_bad.eq(1)

        with m.If(self.begin):
            m.d.sync += [byte_count.eq(0), in_payload.eq(self.length.expected > 0), counters_bad.eq(0),
                         at_last_beat.eq(self.length.first_is_last)]
        with m.If(self.base_we):
            m.d.sync += payload_addr.eq(self.base)
        with m.If(self.beat):
            # byte_count + SB < expected, i.e. byte_count < expected - SB: no adder before the comparison.
            m.d.sync += [byte_count.eq(byte_count + SB), in_payload.eq(byte_count < self.length.last_beat_at),
                         at_last_beat.eq(byte_count == self.length.before_last_beat)]
            with m.If(in_payload):
                with m.If(self.to_block):
                    m.d.comb += self.block_we.eq(Const(1, len(self.block_we)) << (byte_count[:8] >> log2(SB)))
                with m.Else():
                    lane = (byte_count >> log2(SB)) % beats_per_word if beats_per_word > 1 else 0
                    with m.If(lane == beats_per_word - 1):
                        m.d.sync += payload_addr.eq(payload_addr + 1)
                    m.d.comb += host_en.eq(Const((1 << SB) - 1, W) << (lane * SB))
                with m.If(self.check_counters & beat_counters_bad):
                    m.d.sync += counters_bad.eq(1)

        # clear_last (the word being cleared is the last one) is kept in a register: every sweep covers at
        # least one head's state, which is more than one word.
        assert regmap.state_bytes(p) // W >= 2
        clear_end = Signal(range(mem_words + 1), init=p.heads * regmap.state_bytes(p) // W)
        after_reset = Signal(init=1)
        clear_last = Signal()
        m.d.comb += [self.clear_last.eq(clear_last), self.after_reset.eq(after_reset)]
        with m.If(self.clear_start):
            m.d.sync += [clear_word.eq(self.clear_from), clear_end.eq(self.clear_to), after_reset.eq(0),
                         clear_last.eq(0)]
        with m.If(self.clearing):
            m.d.comb += host_en.eq((1 << W) - 1)
            m.d.sync += [clear_word.eq(clear_word + 1), clear_last.eq(clear_word + 2 >= clear_end)]
        return m
