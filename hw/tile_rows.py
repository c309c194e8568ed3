"""The HCCS command's rows through the tile's one streaming row unit (the decode unit's, lent between steps).

:class:`CommandRows` turns the command's elements, fetched from staging one a cycle, into the unit's beats of
``lanes`` elements, and the unit's beats of probabilities back into elements one a cycle for the response.
It writes the command's head parameters into the unit first (``configure``), and holds the unit's port
(``unit.active``) while ``active`` is high.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from somatile.hw import regmap
from somatile.hw.pipe import delay, reg, skid_buffer
from somatile.hw.regmap import TileParams
from somatile.hw.soma import head_params_layout, near_field_port, near_field_unit, wide_code
from somatile.model import hccs

CONFIGURE_LATENCY = 2
"""Cycles from ``configure`` to the parameters' write into the unit (registers: the pulse comes from the
command's state, far from the unit's head table, and the unit takes ``active`` a cycle late)."""


class CommandRows(wiring.Component):
    """One row at a time (the row's elements, then its probabilities, before the next row's first element).

    - ``configure`` (pulse): the unit's head 0 takes ``head`` (the command's head: B, S, dmax and, paper,
      ``hccs_mode`` with the tile's ``hccs_out``; wide, the head's normaliser) :data:`CONFIGURE_LATENCY`
      cycles later; ``active`` must be high by then and stay high until the last row's last element is taken.
    - Elements: ``x`` (int8 paper, int16 wide) with ``mask`` (0: padding, output 0), ``first`` and ``last``
      (the row's first and last element, padding included) in a cycle with ``valid``. A beat goes to the unit
      a cycle after its last lane's element (or the row's last element: its spare lanes masked). The unit
      never refuses it: a row starts only after the previous row's last probability was taken (every bank
      free), and inside a row the unit takes a beat every cycle.
    - Probabilities: the unit's beats go into a row buffer as they come (the unit is never stalled);
      ``value`` (the element's ``8 * out_bytes`` bits) is valid while ``out_valid``, from the fifth cycle
      after its beat arrived, from two register slices; ``take`` consumes it (one a cycle, any stalls);
      ``final`` marks the row's ``n_last``-th (last) element. The unit's spare lanes beyond it are dropped.
    - ``refused`` (sticky until the next ``configure``): a beat was offered while the unit's ready was low,
      which the above says cannot happen; tests check it stays low, the tile leaves it unconnected.
    """

    def __init__(self, params: TileParams, out_bytes: int):
        self.params, self.out_bytes = params, out_bytes
        self.config = near_field_unit(params)
        bits = 8 * regmap.element_bytes(params)
        self.n_elements = regmap.hccs_row_bytes(params, params.n_max) // regmap.element_bytes(params)
        super().__init__({
            "unit": In(near_field_port(params)), "active": In(1),
            "configure": In(1), "head": In(head_params_layout(params.profile)),
            "valid": In(1), "x": In(signed(bits)), "mask": In(1), "first": In(1), "last": In(1),
            "n_last": In(range(self.n_elements)),
            "take": In(1), "out_valid": Out(1), "value": Out(8 * out_bytes), "final": Out(1),
            "refused": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p, unit, lanes = self.params, self.unit, self.config.lanes
        bits = 8 * regmap.element_bytes(p)
        m.d.comb += unit.active.eq(self.active)

        # The head's parameters, written CONFIGURE_LATENCY cycles after configure.
        cfg = unit.cfg.payload
        m.d.comb += unit.cfg.valid.eq(delay(m, self.configure, CONFIGURE_LATENCY, "rows_configure", reset_less=False))
        m.d.comb += [cfg.head.eq(0), cfg.params.B.eq(self.head["hccs_B"]), cfg.params.S.eq(self.head["hccs_S"]),
                     cfg.params.dmax.eq(self.head["hccs_dmax"])]
        if p.profile == "wide":
            m.d.comb += cfg.params.code.eq(wide_code(self.head))
        else:
            m.d.comb += [cfg.params.mode.eq(self.head["hccs_mode"]),
                         cfg.params.out.eq(hccs.OUT_INT16 if self.out_bytes == 2 else hccs.OUT_UINT8)]

        # Elements into a beat: the lane whose bit is set in the one-hot `lane` takes the element; the beat is
        # registered once its last lane (or the row's last element) is in, spare lanes masked (held_mask is
        # cleared with each beat, so a lane not written since holds 0). One-hot, each lane's select is one
        # register bit: a binary lane counter compared with every lane index was in front of the unit's beat
        # register (the ULX3S tile's last late path without rip-up).
        lane = Signal(lanes, init=1)
        held_x = Signal(bits * lanes, reset_less=True)
        held_mask = Signal(lanes)
        held_first = Signal()
        beat = unit.i.payload
        m.d.sync += unit.i.valid.eq(0)
        with m.If(self.valid):
            x_lanes = [Mux(lane[j], self.x.as_unsigned(), held_x.word_select(j, bits)) for j in range(lanes)]
            mask_lanes = [Mux(lane[j], self.mask, held_mask[j]) for j in range(lanes)]
            first = Mux(lane[0], self.first, held_first)
            m.d.sync += [held_x.eq(Cat(*x_lanes)), held_mask.eq(Cat(*mask_lanes)), held_first.eq(first),
                         lane.eq(lane.rotate_left(1))]
            with m.If(lane[-1] | self.last):
                m.d.sync += [unit.i.valid.eq(1), beat.data.eq(Cat(*x_lanes)), beat.mask.eq(Cat(*mask_lanes)),
                             beat.first.eq(first), beat.last.eq(self.last), beat.head.eq(0), lane.eq(1),
                             held_mask.eq(0)]
        with m.If(self.configure):
            m.d.sync += self.refused.eq(0)
        with m.Elif(unit.i.valid & ~unit.i.ready):
            m.d.sync += self.refused.eq(1)

        # The unit's beats into a row buffer (LUT RAM: an asynchronous read port, so it sits beside the logic
        # that addresses it; a block RAM was placed far from its read address), out of it an element at a
        # time: the unit is never stalled (its ready is constant, as in a decode step, so its output stage has
        # no enables). `matured` is a beat's write two cycles late; `pending` counts the beats written and not
        # yet fully taken, `offering` (pending > 0) is a register. The elements leave through a register slice,
        # so neither the lane multiplexer nor the counters reach the response's registers in one cycle.
        out_bits = 8 * self.out_bytes
        beats = -(-self.n_elements // lanes)
        m.submodules.row_buffer = buffer = Memory(shape=unsigned(out_bits * lanes), depth=beats, init=[])
        wr = buffer.write_port()
        wr_beat = Signal(range(beats + 1))
        m.d.comb += [unit.o.ready.eq(1), wr.addr.eq(wr_beat), wr.en.eq(unit.o.valid),
                     wr.data.eq(Cat(*[unit.o.payload.data[j][:out_bits] for j in range(lanes)]))]
        with m.If(unit.o.valid):
            m.d.sync += wr_beat.eq(wr_beat + 1)
        matured = delay(m, unit.o.valid, 2, "rows_matured", reset_less=False)
        pending = Signal(range(beats + 1))
        offering = Signal()
        # count: the elements of the row taken; the element offered is lane count % lanes of beat
        # count // lanes (rows start at element 0 and lanes is a power of two, so both are count's bits);
        # final (count == n_last) in a register.
        count = Signal(range(beats * lanes))
        lane_bits = (lanes - 1).bit_length()
        rd_beat, out_lane = count[lane_bits:], count[:lane_bits]
        lane_last = out_lane == lanes - 1
        final = Signal()
        # The offered element's beat is read into a register a cycle ahead, and the lane selected from that
        # register: each cycle the register takes the beat of count (read port rd) or, when this cycle's
        # element is its beat's last and leaves, the next beat (read port rd_next, at beat_next, registered
        # in next_word). Both read addresses are registers: the LUT RAM's read and the lane multiplexer in one
        # cycle were the two-tile array's late path (count -> value), and the handshake in front of the read
        # address the next build's (offering -> the beat register). A beat is counted (matured, pending)
        # three cycles after its write, so both ports have read it by the time it is offered.
        beat_next = Signal(range(beats + 1), init=1)
        rd, rd_next = buffer.read_port(domain="comb"), buffer.read_port(domain="comb")
        m.d.comb += [rd.addr.eq(rd_beat), rd_next.addr.eq(beat_next)]
        next_word = reg(m, rd_next.data, "rows_next_word")
        beat_word = Signal.like(rd.data, name="rows_beat_word", reset_less=True)
        lane_values = [beat_word.word_select(j, out_bits) for j in range(lanes)]
        value = Array(lane_values)[out_lane] if lanes > 1 else lane_values[0]
        # Two slices in a row: the first beside the buffer, the second where the placer puts the response's
        # packer, which takes from it (one slice left the response's take and valid on a path across the two-tile
        # array: fa1df9c7, 12.6 ns).
        near_ready = Signal()
        slice_ready, near_valid, near_data = skid_buffer(m, offering, Cat(value, final), near_ready, "rows_elem")
        ready_far, slice_valid, slice_data = skid_buffer(m, near_valid, near_data, self.take, "rows_out")
        m.d.comb += near_ready.eq(ready_far)
        advance = slice_ready & offering
        m.d.sync += beat_word.eq(Mux(advance & lane_last, next_word, rd.data))
        step = Signal()
        m.d.comb += [self.out_valid.eq(slice_valid), self.value.eq(slice_data[:out_bits]),
                     self.final.eq(slice_data[out_bits])]
        pending_next = Signal.like(pending)
        m.d.comb += pending_next.eq(pending + matured - step)
        m.d.sync += [pending.eq(pending_next), offering.eq(pending_next != 0)]
        with m.If(advance):
            m.d.sync += [count.eq(count + 1), final.eq(count + 1 == self.n_last)]
            m.d.comb += step.eq(lane_last | final)
            with m.If(lane_last):
                m.d.sync += beat_next.eq(beat_next + 1)
        with m.If(self.valid & self.first):  # a new row: its beats and probabilities count from 0
            m.d.sync += [count.eq(0), final.eq(self.n_last == 0), wr_beat.eq(0), pending.eq(0), offering.eq(0),
                         beat_next.eq(1)]
        return m
