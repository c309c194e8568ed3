"""A row of tiles behind one AXI4-Stream pair: frames routed to a tile by their head byte, responses
returned in the order the frames arrived.

Routing: a frame whose header names (global) head ``g`` goes to tile ``g // heads`` as local head
``g % heads`` (``heads`` = heads per tile); the response's head byte is turned back into ``g``. Frames of
every opcode route this way (INFO or REG_READ with head ``t * heads`` address tile t). A head beyond the
last tile goes to the last tile, which answers with BAD_HEAD where the opcode takes a head. A DECODE frame
covers heads of one tile (the host sends one frame per tile); the tiles then decode in parallel: the array
accepts the next frame as soon as the target tile is ready, while earlier tiles still compute.

Ports: as :class:`somatile.hw.tile.Tile` (``s_axis_*``, ``m_axis_*``, ``error`` = any tile's error).
Throughput: one beat per cycle in and out; responses wait for the tiles in arrival order (a FIFO of up to
``FRAMES_PER_TILE * n_tiles`` frames in flight: a tile takes the next frame in while it computes). Latency: a
tile's own, plus one cycle in (each tile is fed through its own register slice, hw/pipe.py ``skid_buffer``)
and one cycle out (one register slice after the response multiplexer). Why: on the ULX3S two-tile array the
input beat reached both tiles' header and write-data registers directly, a route across the die longer than a
clock period; with a slice per tile, a copy of the beat sits beside each tile, and no ready travels
combinationally between the ports and a tile.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import wiring

from somatile.hw.regmap import RTL_PROFILES, TileParams
from somatile.hw.pipe import skid_buffer
from somatile.hw.tile import Tile, stream_ports

FRAMES_PER_TILE = 3
"""Frames a tile holds at once, back to back: one whose response streams out, one computing, one taken in."""


class TileArray(wiring.Component):
    """``n_tiles`` tiles; the other keyword arguments are those of :class:`Tile` (``BoardConfig.array_kwargs``)."""

    def __init__(self, *, n_tiles: int = 1, **tile_kwargs):
        self.params = TileParams(n_tiles=n_tiles, **tile_kwargs)
        if self.params.profile not in RTL_PROFILES:
            raise ValueError(f"TileParams.profile = {self.params.profile!r}: the tile RTL implements "
                             f"{', '.join(RTL_PROFILES)} (emu:// computes every profile)")
        self.tiles = [Tile(tile_index=i, n_tiles=n_tiles, **tile_kwargs) for i in range(n_tiles)]
        super().__init__(stream_ports(self.params.stream_width))

    def elaborate(self, platform):
        m = Module()
        n, heads = self.params.n_tiles, self.params.heads
        for i, tile in enumerate(self.tiles):
            m.submodules[f"tile{i}"] = tile
        m.d.comb += self.error.eq(Cat(*[t.error for t in self.tiles]).any())

        # Input side: the first beat of a frame picks the tile; later beats follow it.
        in_frame = Signal()
        target = Signal(range(n))
        global_head = self.s_axis_tdata[16:24]
        first_target = Signal(range(n))
        m.d.comb += first_target.eq(Mux(global_head >= (n - 1) * heads, n - 1, global_head // heads))
        selected = Mux(in_frame, target, first_target)

        # In-order response FIFO of tile indices.
        depth = FRAMES_PER_TILE * n
        order = Array(Signal(range(n), name=f"order{i}") for i in range(depth))
        count = Signal(range(depth + 1))
        read_at = Signal(range(depth))
        write_at = Signal(range(depth))
        full = count == depth
        starting = ~in_frame & self.s_axis_tvalid
        accept = Signal()

        blocked = starting & full
        slice_ready = []
        for i, tile in enumerate(self.tiles):
            beat = Signal.like(self.s_axis_tdata, name=f"in_beat{i}")
            m.d.comb += beat.eq(self.s_axis_tdata)
            with m.If(~in_frame):
                m.d.comb += beat[16:24].eq(global_head - i * heads)
            ready_i, valid_i, payload_i = skid_buffer(
                m, self.s_axis_tvalid & (selected == i) & ~blocked, Cat(beat, self.s_axis_tlast),
                tile.s_axis_tready, f"in{i}")
            slice_ready.append(ready_i)
            m.d.comb += [tile.s_axis_tdata.eq(payload_i[:-1]), tile.s_axis_tlast.eq(payload_i[-1]),
                         tile.s_axis_tvalid.eq(valid_i)]
        m.d.comb += [self.s_axis_tready.eq(Array(slice_ready)[selected] & ~blocked),
                     accept.eq(self.s_axis_tvalid & self.s_axis_tready)]
        push = accept & ~in_frame
        with m.If(accept):
            m.d.sync += in_frame.eq(~self.s_axis_tlast)
            with m.If(~in_frame):
                m.d.sync += target.eq(first_target)
        with m.If(push):
            m.d.sync += [order[write_at].eq(first_target), write_at.eq(Mux(write_at == depth - 1, 0, write_at + 1))]

        # Output side: the oldest frame's tile drives m_axis until its tlast; its first beat gets the global head.
        out_first = Signal(init=1)
        source = order[read_at]
        has_response = count != 0
        tdata = Array(t.m_axis_tdata for t in self.tiles)[source]
        tvalid = Array(t.m_axis_tvalid for t in self.tiles)[source] & has_response
        tlast = Array(t.m_axis_tlast for t in self.tiles)[source]
        head_fixed = Signal.like(tdata)
        m.d.comb += head_fixed.eq(tdata)
        with m.If(out_first):
            m.d.comb += head_fixed[16:24].eq(tdata[16:24] + source * heads)
        out_ready, out_valid, out_payload = skid_buffer(m, tvalid, Cat(head_fixed, tlast), self.m_axis_tready, "out")
        m.d.comb += [self.m_axis_tdata.eq(out_payload[:-1]), self.m_axis_tlast.eq(out_payload[-1]),
                     self.m_axis_tvalid.eq(out_valid)]
        for i, tile in enumerate(self.tiles):
            m.d.comb += tile.m_axis_tready.eq(out_ready & has_response & (source == i))
        pop = Signal()
        with m.If(tvalid & out_ready):
            m.d.sync += out_first.eq(tlast)
            m.d.comb += pop.eq(tlast)
        with m.If(pop):
            m.d.sync += read_at.eq(Mux(read_at == depth - 1, 0, read_at + 1))
        m.d.sync += count.eq(count + push - pop)
        return m
