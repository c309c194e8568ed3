"""The tile's head-parameter register file: every head's parameter registers (the table of the tile's profile,
``regmap.PROFILE_HEAD_PARAMS``: the same registers in the same order, with each profile's ranges and choices),
written by a CONFIGURE_HEAD block once its range checks and SomaConfig rules pass (the paper profile's HCCS
rules over the head's slots, the wide profile's rule of ``wide.check_params`` for an HCCS head), and the
copies of one head's parameters that the command front end and the decode unit read.

Contract:

- Block capture: a beat with ``block_we`` bit i high is word i of the block (``block_data``, a stream beat);
  it is in the block register :data:`CAPTURE_LATENCY` + 1 cycles later. ``config_ok`` (the block's values
  are in range and pass the rules) describes the block as its beats were :data:`CONFIG_SETTLE` cycles before
  (the last beat's cycle counted as 0), and ``commit`` in that cycle writes the block into head ``head``'s
  registers (when ``config_ok``) at the end of the next cycle and marks the head ``configured``. ``regs`` is
  every head's registers (reset: the defaults; ``configured`` 0).
- ``select_we``/``select``: the index of the header's head, written with the header's first beat (in
  copies); ``header_params`` are that head's parameters :data:`SELECT_LATENCY` cycles after the index is
  written (registered; they follow the registers' writes as late). ``hccs_mode`` is the ``hccs_mode`` of head
  ``head`` (combinational).
- ``cur_params`` load every cycle: while ``decoding``, the parameters of head ``cur`` + 1 of
  :data:`NEXT_LATENCY` cycles before, else ``header_params``. ``decoding`` is :data:`DECODING_COPIES` copies of
  one flag (every bit equal, each from a flip-flop of its own: each selects a share of the parameters).

Why copies: one head index steering all the parameter multiplexers would span the die; each of
``PARAM_INDEX_COPIES`` copies of the index steers a share. The decode unit's parameters come from registers
(``cur_params``), not through the head multiplexer from ``cur``: that path would fan out to the decode unit's
parameter registers across the die, and an enable from the command decoding would reach them as far.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from somatile.hw import regmap
from somatile.hw.hccs_rules import LATENCY as RULES_LATENCY, rules_ok, wide_rules_ok
from somatile.hw.pipe import Replicated, delay, reg, share_of
from somatile.hw.regmap import HEAD_INDEX, HEAD_PARAMS, PROFILE_HEAD_PARAMS, TileParams
from somatile.hw.soma import head_params_layout

PARAM_INDEX_COPIES = 4
"""Copies of a head index that selects the head parameters."""
DECODING_COPIES = 4
"""Copies of the decoding flag (``decoding``), each selecting a share of ``cur_params``' sources."""
HEAD_WE_COPIES = 4
"""Copies of the one-hot register that writes a head's parameters, each enabling a share of them."""
CAPTURE_LATENCY = 1
"""Cycles a block beat waits before it is written into the block register: the beat and its one-hot enable
in registers (decoded from the tile's state, the opcode and the byte counter in the same cycle, the enables
of the 600-odd flip-flops of the block were among the tile's longest paths)."""
CONFIG_SETTLE = CAPTURE_LATENCY + RULES_LATENCY + 2
"""Cycles between a CONFIGURE_HEAD block's last beat and its execution: the beat's capture, the rules'
pipeline depth (RULES_LATENCY + 1: the checks' AND in ``config_ok``), then the head's write enable in a
register (it enables some 150 flip-flops of the head's parameters)."""
SELECT_LATENCY = 1
"""Cycles from the head index's copies to ``header_params``: the selected parameters' registers."""
NEXT_LATENCY = 2
"""Cycles from ``cur`` to the parameters of ``cur`` + 1 that ``cur_params`` load: the index copies, the
selected parameters."""
BLOCK_BYTES = regmap.padded(regmap.REGISTER_BYTES * len(HEAD_PARAMS))
"""Bytes of a CONFIGURE_HEAD block: a 32-bit word per head parameter, padded to the frame granule."""


class HeadRegisters(wiring.Component):
    """The register file of a tile with :class:`~somatile.hw.regmap.TileParams` ``params``; ports as in the
    module docstring (``regs`` and the parameter ports are :func:`somatile.hw.soma.head_params_layout` of the
    profile)."""

    def __init__(self, params: TileParams):
        self.params = p = params
        self.index_bits = max(1, (p.heads - 1).bit_length())
        self.table = PROFILE_HEAD_PARAMS[p.profile]
        layout = head_params_layout(p.profile)
        super().__init__({
            "block_we": In(BLOCK_BYTES // p.stream_bytes), "block_data": In(8 * p.stream_bytes),
            "head": In(8), "commit": In(1), "config_ok": Out(1), "configured": Out(p.heads),
            "regs": Out(layout).array(p.heads),
            "select_we": In(1), "select": In(self.index_bits), "header_params": Out(layout),
            "hccs_mode": Out(layout["hccs_mode"].shape),
            "cur": In(8), "decoding": In(DECODING_COPIES), "cur_params": Out(layout),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        head_regs = [[Signal(range(hp.hi + 1), name=f"head{h}_{hp.name}", init=hp.default) for hp in self.table]
                     for h in range(p.heads)]
        configured = Signal(p.heads)
        for h in range(p.heads):
            m.d.comb += [self.regs[h][hp.name].eq(r) for hp, r in zip(self.table, head_regs[h])]
        m.d.comb += self.configured.eq(configured)

        def head_field(h_index, name):
            """Parameter ``name`` of head ``h_index``, selected by the index bits a valid head uses (a head
            out of range is refused before its parameters are used)."""
            regs = [head_regs[h][HEAD_INDEX[name]] for h in range(p.heads)]
            return regs[0] if p.heads == 1 else Array(regs)[h_index[:self.index_bits]]

        def copied_fields(copies: Replicated, prefix: str) -> dict:
            """Every head parameter of the head ``copies`` hold, registered: each copy of the index steers a
            share of the parameters."""
            return {hp.name: reg(m, head_field(copies.copy(share_of(i, len(self.table), PARAM_INDEX_COPIES)),
                                               hp.name), f"{prefix}_{hp.name}")
                    for i, hp in enumerate(self.table)}

        header_head = Replicated(self.index_bits, PARAM_INDEX_COPIES, "header_head")
        with m.If(self.select_we):
            m.d.sync += header_head.eq(self.select)
        head_params = copied_fields(header_head, "head_p")
        m.d.comb += [self.header_params[n].eq(v) for n, v in head_params.items()]
        m.d.comb += self.hccs_mode.eq(head_field(self.head, "hccs_mode"))

        # cur_params are registers, not the head multiplexer from cur: that path would fan out to the decode
        # unit's parameter registers across the die. The decode unit samples them in the cycle after the tile
        # sets cur; they were loaded at that same edge (from header_params for the first head, from cur + 1 of
        # the previous head for the others) and change at the earliest at the sampling edge.
        cur_next_index = Replicated(self.index_bits, PARAM_INDEX_COPIES, "cur_next_index")
        m.d.sync += cur_next_index.eq(self.cur + 1)
        next_params = copied_fields(cur_next_index, "next_p")
        cur_params = {hp.name: Signal(range(hp.hi + 1), name=f"cur_{hp.name}") for hp in self.table}
        m.d.sync += [cur_params[n].eq(Mux(self.decoding[share_of(i, len(cur_params), DECODING_COPIES)],
                                          next_params[n], head_params[n]))
                     for i, n in enumerate(cur_params)]
        m.d.comb += [self.cur_params[n].eq(v) for n, v in cur_params.items()]

        config_values = self.block(m)
        config_ok = self.block_checks(m, config_values)
        m.d.comb += self.config_ok.eq(config_ok)
        # One-hot: head h's parameters are written in this cycle (CONFIGURE_HEAD's EXECUTE cycle); set by
        # commit (the last CONFIG_SETTLE cycle), so that the enables of the head's registers come from
        # flip-flops, in copies each enabling a share of them: one flip-flop's net to all of a head's registers
        # (they sit beside their readers across the die) was the ULX3S tile's late path at 39717f3 (seed 2,
        # head_we -> regs__1.hccs_S: 10.3 ns of routing).
        head_we = Replicated(p.heads, HEAD_WE_COPIES, "head_we")
        m.d.sync += head_we.eq(0)
        with m.If(self.commit):
            m.d.sync += head_we.eq(Mux(config_ok, Cat(self.head == h for h in range(p.heads)), 0))
        for h in range(p.heads):
            for i, (r, value) in enumerate(zip(head_regs[h], config_values)):
                with m.If(head_we.copy(share_of(i, len(self.table), HEAD_WE_COPIES))[h]):
                    m.d.sync += r.eq(value)
            with m.If(head_we.copy(0)[h]):
                m.d.sync += configured[h].eq(1)
        return m

    def block(self, m) -> list:
        """The block register, written a beat at a time a cycle after the beat arrives; its 32-bit words."""
        SW = len(self.block_data)
        config = Signal(8 * BLOCK_BYTES, reset_less=True)  # applied only through head_we (reset)
        # The beat, and a one-hot enable of the word it fills, in registers (CAPTURE_LATENCY): decoded from the
        # tile's state, the opcode and the byte counter in the same cycle, the enables of the 600-odd
        # flip-flops of the block were among the tile's longest paths.
        config_we = reg(m, self.block_we, "config_we")  # no reset: config is applied only through head_we
        config_data = reg(m, self.block_data, "config_data")
        for i in range(len(self.block_we)):
            with m.If(config_we[i]):
                m.d.sync += config.word_select(i, SW).eq(config_data)
        return [config.word_select(i, 32) for i in range(len(self.table))]

    def block_checks(self, m, config_values):
        """The block's range checks and the SomaConfig rules, RULES_LATENCY + 1 cycles behind the block."""
        # Each range check registered on its own, their AND RULES_LATENCY - 1 cycles later (like the HCCS rules).
        ranges_ok = reg(m, Cat(*[(v >= hp.lo) & (v <= hp.hi) for v, hp in zip(config_values, self.table)]),
                        "ranges").all()
        cv = {hp.name: v for hp, v in zip(self.table, config_values)}
        choice = {name: self.table[HEAD_INDEX[name]].choices for name in ("gating", "field_source", "normaliser")}
        gating_ok = (cv["gating"] != choice["gating"].index("query")) | \
                    (cv["field_source"] == choice["field_source"].index("values"))
        uses_hccs = cv["normaliser"] == choice["normaliser"].index("hccs_int")
        if self.params.profile == "wide":
            config_hccs_ok = wide_rules_ok(m, "config_hccs_ok", cv["hccs_B"][:16], cv["hccs_S"][:16],
                                           cv["hccs_dmax"][:16])
        else:
            config_hccs_ok = rules_ok(m, "config_hccs_ok", cv["hccs_B"][:16], cv["hccs_S"][:8], cv["hccs_dmax"][:8],
                                      self.params.slots)
        ranges_ok = delay(m, ranges_ok, RULES_LATENCY - 1)
        gating_ok, uses_hccs = (delay(m, v, RULES_LATENCY) for v in (gating_ok, uses_hccs))
        # RULES_LATENCY + 2 cycles after the block's last beat: CONFIGURE_HEAD waits CONFIG_SETTLE cycles.
        return reg(m, ranges_ok & gating_ok & (~uses_hccs | config_hccs_ok), "config_ok")
