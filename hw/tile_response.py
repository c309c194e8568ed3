"""The tile's response streamer: a response's header beats, then its payload (memory words, the INFO words or
HCCS output rows packed into beats), out through a register slice, with the read pointer of the memory words.

Contract:

- ``start`` (one cycle) begins a response of ``words`` memory words from word ``base``; the tile's state
  machine then names the phase each cycle: ``send_header`` (the header beats of ``header``), ``send_info``,
  ``send_words`` or ``send_row`` (``pack`` fills the row beat an element ``value`` at a time, ``beat_full``:
  the next ``pack`` fills it; ``pack_clear`` empties it; ``send_row`` offers it, ``row_last`` marks the
  frame's last beat). ``header_done``, ``info_done`` and ``words_done`` are high in the cycle the phase's last
  beat leaves (combinational); ``beat`` in every cycle a beat leaves. After the header: the words when
  ``has_payload`` and neither ``rows`` nor ``info``.
- Latency and throughput: one beat per cycle; the ``m_axis_*`` outputs are registers (hw/pipe.py
  ``skid_buffer``: one cycle of latency). The first word's read costs a cycle only with a one-beat header
  (:data:`WORD_READ_LATENCY`: the header's beat waits for it); otherwise it overlaps the header.
- Backpressure: ``m_axis_tready`` low holds the beat; nothing is lost or repeated.
- Memory: ``rd_addr`` is the address of the word to read next, ``rd_data`` the block RAM's output a cycle
  after its address (the tile chooses whose address reaches the block RAM).

Why the word register: the response's memory words leave the block RAM into a register (the word whose beats
are being sent) and the block RAM already holds the next one at its output: the beats are selected from a
register, not from the block RAM's output (whose clock-to-output alone is over half a cycle on the ECP5).
"""

from __future__ import annotations

import struct

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from somatile.hw import regmap
from somatile.hw.pipe import skid_buffer
from somatile.hw.regmap import TileParams

WORD_READ_LATENCY = 1
"""Cycles a one-beat response header waits for the first memory word's read (0 with longer headers)."""


def header_wait(params: TileParams) -> int:
    """Cycles a word response's header waits for the first word: :data:`WORD_READ_LATENCY` with a one-beat
    header, else 0 (the read overlaps the header's beats)."""
    return WORD_READ_LATENCY if regmap.HEADER_BYTES // params.stream_bytes == 1 else 0


class ResponseStreamer(wiring.Component):
    """The streamer of a tile with :class:`~somatile.hw.regmap.TileParams` ``params``; ``info``: the INFO
    command's 32-bit words. Ports as in the module docstring; ``value`` is one HCCS output element
    (``out_bytes`` bytes)."""

    def __init__(self, params: TileParams, info: list[int], out_bytes: int):
        self.params = p = params
        self.info_words = list(info)
        mem_words = p.local_memory_bytes // p.word_bytes
        SW = 8 * p.stream_bytes
        self.elems_per_beat = p.stream_bytes // out_bytes
        self.info_beats = regmap.padded(4 * len(self.info_words)) // p.stream_bytes
        super().__init__({
            "header": In(8 * regmap.HEADER_BYTES), "has_payload": In(1), "rows": In(1), "info": In(1),
            "start": In(1), "words": In(range(mem_words + 1)), "base": In(range(mem_words + 1)),
            "send_header": In(1), "send_info": In(1), "send_words": In(1), "send_row": In(1), "row_last": In(1),
            "pack": In(1), "pack_clear": In(1), "value": In(8 * out_bytes), "beat_full": Out(1),
            "beat": Out(1), "header_done": Out(1), "info_done": Out(1), "words_done": Out(1),
            "rd_addr": Out(range(mem_words + 2)), "rd_data": In(8 * p.word_bytes),
            "m_axis_tdata": Out(SW), "m_axis_tvalid": Out(1), "m_axis_tready": In(1), "m_axis_tlast": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        SB, W = p.stream_bytes, p.word_bytes
        SW, HB = 8 * SB, regmap.HEADER_BYTES // SB
        beats_per_word = W // SB
        mem_words = p.local_memory_bytes // W
        # The FSM's phases drive resp_valid, resp_data and resp_last; resp_ready is a register.
        resp_valid, resp_last_beat, resp_data = Signal(), Signal(), Signal(SW)
        resp_ready, out_valid, out_payload = skid_buffer(m, resp_valid, Cat(resp_data, resp_last_beat),
                                                         self.m_axis_tready, "m_axis")
        m.d.comb += [self.m_axis_tvalid.eq(out_valid), self.m_axis_tdata.eq(out_payload[:-1]),
                     self.m_axis_tlast.eq(out_payload[-1])]
        m_beat = resp_valid & resp_ready
        m.d.comb += self.beat.eq(m_beat)

        header_last = Signal()   # the header phase's last beat is presented (set by start and the beats)
        resp_beat = Signal(range(HB + 1))
        resp_word = Signal(range(mem_words + 1))
        resp_last_word = Signal(signed(len(Const(mem_words)) + 1))
        word_beat = Signal(range(beats_per_word + 1))
        info_bytes = struct.pack(f"<{len(self.info_words)}I", *self.info_words)
        info_beats = self.info_beats
        info_payload = Const(int.from_bytes(info_bytes, "little"), 8 * SB * info_beats)
        info_beat = Signal(range(info_beats + 1))

        # Read pointer: resp_addr (the word the block RAM shows, to be loaded next) and resp_addr + 1 in
        # registers; the pointer steps when a word's last beat leaves (or the header's, loading the first
        # word). The read address is selected by flags kept in registers beside the state (responding with
        # memory words, the last beat of a word, the header's last beat): decoded from the state and counters,
        # the selection was in front of the block RAMs' address inputs.
        words_state, word_last, at_last_word = Signal(), Signal(), Signal()
        header_hold = Signal()     # one-beat header of a word response: its first cycle waits for the read
        resp_addr = Signal(range(mem_words + 2))
        resp_addr_next = Signal(range(mem_words + 3))
        # The word whose beats are being sent, in a register: the block RAM already holds the next one at its
        # output, and its clock-to-output alone is over half a cycle on the ECP5.
        resp_word_reg = Signal(8 * W)
        step = resp_ready & Mux(words_state, word_last, header_last)
        # After a step the block RAM shows the next word one cycle late; with two or more beats per word the
        # next step is at least two cycles later, so the read address is the pointer itself (no path from the
        # output handshake to the block RAMs' address inputs). With one beat per word it steps ahead.
        m.d.comb += self.rd_addr.eq(Mux(step, resp_addr_next, resp_addr) if beats_per_word == 1 else resp_addr)
        with m.If(step):
            m.d.sync += [resp_word_reg.eq(self.rd_data), resp_addr.eq(resp_addr_next),
                         resp_addr_next.eq(resp_addr_next + 1)]
        # resp_addr_next is base + 1 from the cycle after start on, computed from resp_addr in that cycle: the
        # adder behind start's opcode decode and base's multiplexer did not fit a cycle on the ULX3S tile. No
        # step can use it before: a header leaves in its last beat, at the earliest in that cycle (HB > 1 or
        # a held one-beat header), and a one-beat header without words reads no word.
        addr_next_due = Signal()
        with m.If(addr_next_due):
            m.d.sync += [resp_addr_next.eq(resp_addr + 1), addr_next_due.eq(0)]

        with m.If(self.start):
            # A one-beat header of a word response is held a cycle: the first word is read in the first
            # cycle and loaded into resp_word_reg as the header's beat leaves.
            hold = self.words != 0 if HB == 1 else Const(0)
            m.d.sync += [resp_beat.eq(0), resp_word.eq(0), word_beat.eq(0),
                         resp_last_word.eq(self.words - 1), resp_addr.eq(self.base), addr_next_due.eq(1),
                         word_last.eq(beats_per_word == 1), at_last_word.eq(self.words == 1),
                         header_hold.eq(hold), header_last.eq(~hold if HB == 1 else 0)]

        with m.If(self.send_header):
            # header_last (resp_beat == HB - 1 whenever a beat can leave: not while header_hold) in place of
            # the comparison.
            m.d.comb += [resp_valid.eq(~header_hold), resp_data.eq(self.header.word_select(resp_beat, SW)),
                         resp_last_beat.eq(header_last & ~self.has_payload)]
            with m.If(header_hold):
                m.d.sync += [header_hold.eq(0), header_last.eq(1)]
            with m.If(m_beat):
                m.d.sync += resp_beat.eq(resp_beat + 1)
                if HB > 1:
                    with m.If(resp_beat == HB - 2):
                        m.d.sync += header_last.eq(1)
                with m.If(header_last):
                    m.d.comb += self.header_done.eq(1)
                    m.d.sync += header_last.eq(0)
                    with m.If(self.has_payload & ~self.rows & ~self.info):
                        m.d.sync += words_state.eq(1)

        with m.If(self.send_info):
            m.d.comb += [resp_valid.eq(1), resp_data.eq(info_payload.word_select(info_beat, SW)),
                         resp_last_beat.eq(info_beat == info_beats - 1)]
            # info_beat is 0 from reset and returns to 0 with the last beat, so that no response start writes
            # it (those writes would sit in front of its enable).
            with m.If(m_beat):
                m.d.sync += info_beat.eq(info_beat + 1)
                with m.If(info_beat == info_beats - 1):
                    m.d.sync += info_beat.eq(0)
                    m.d.comb += self.info_done.eq(1)

        with m.If(self.send_words):
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
                    m.d.comb += self.words_done.eq(1)

        self.row_beats(m, resp_valid, resp_data, resp_last_beat, m_beat)
        return m

    def row_beats(self, m, resp_valid, resp_data, resp_last_beat, m_beat):
        """HCCS output elements packed into a beat (filled by ``pack``, sent by ``send_row``)."""
        width = len(self.value)
        beat_data = Signal(len(resp_data))
        beat_fill = Signal(range(self.elems_per_beat + 1))
        m.d.comb += self.beat_full.eq(beat_fill == self.elems_per_beat - 1)
        with m.If(self.pack_clear):
            m.d.sync += [beat_fill.eq(0), beat_data.eq(0)]
        with m.If(self.pack):
            m.d.sync += [beat_data.word_select(beat_fill, width).eq(self.value), beat_fill.eq(beat_fill + 1)]
        with m.If(self.send_row):
            m.d.comb += [resp_valid.eq(1), resp_data.eq(beat_data), resp_last_beat.eq(self.row_last)]
            with m.If(m_beat):
                m.d.sync += [beat_fill.eq(0), beat_data.eq(0)]
