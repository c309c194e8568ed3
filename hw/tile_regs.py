"""The tile's register read path (REG_READ): the command's address against every readable register, and the
value of the one it names, as a pipeline of registered steps.

Contract: ``address`` is sampled every cycle (free running, no handshake); ``ok`` (the address names a
register) follows it by :data:`OK_LATENCY` cycles and ``value`` (that register's value) by
:data:`VALUE_LATENCY`; where ``ok`` is 0, ``value`` is one of the registers' (the tile refuses that
REG_READ with BAD_REGISTER and never returns it). ``value`` reads the live inputs as they were ``VALUE_LATENCY - 1`` cycles before.
The tile reads both once its header has been captured and has settled (``CHECK_SETTLE`` cycles), so both
describe that header's address by then.

Why a pipeline: the header's address reaches some 70 comparisons of 32 bits and a 70-way multiplexer; in
one cycle that was among the tile's longest paths. The address is compared nibble by nibble (registered), the
nibbles' matches combined (registered) and encoded to an index; the value is selected by a multiplexer of 8
per group of 8 registers, each group with its own copy of the index (the registers are spread over the
die), then the group's (both registered).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from somatile.hw.pipe import Replicated, reg

OK_LATENCY = 3
"""Cycles from ``address`` to ``ok``: the nibbles' matches, their AND, the OR of the matches."""
VALUE_LATENCY = 5
"""Cycles from ``address`` to ``value``: the nibbles' matches, their AND, the index, the group, the value."""
GROUP = 8
"""Registers per first-level multiplexer."""
NIBBLE = 4
"""Address bits per first-level comparison (one LUT4)."""


class RegisterReader(wiring.Component):
    """``entries``: (address, constant value or None) per readable register, addresses distinct. A None
    entry is a live register, read from ``live[i]`` (in the order of the None entries, 32 bits, zero-extended
    by the caller); constants are folded in. Ports: ``address`` In(32), ``live`` In(32) x live count,
    ``ok`` Out(1), ``value`` Out(32)."""

    def __init__(self, entries: list[tuple[int, int | None]]):
        addresses = [a for a, _ in entries]
        if len(set(addresses)) != len(addresses):
            raise ValueError("RegisterReader: register addresses must be distinct")
        self.entries = list(entries)
        self.n_live = sum(v is None for _, v in entries)
        super().__init__({"address": In(32), "live": In(32).array(max(1, self.n_live)), "ok": Out(1),
                          "value": Out(32)})

    def elaborate(self, platform):
        m = Module()
        address, entries = self.address, self.entries
        # Each nibble of the address against the values it takes in the entries (one LUT each, registered),
        # then an entry's match as the AND of its nibbles' flags: as a 16-bit comparison per half, the mapped
        # chain in front of the match registers was six LUTs deep (the ULX3S tile's critical path at e554529).
        nibbles = range(0, len(address), NIBBLE)

        def nibble(a: int, k: int) -> int:
            return a >> k & (1 << NIBBLE) - 1

        flags = {(k, v): reg(m, address[k:k + NIBBLE] == v, f"reg_nibble{k // NIBBLE}_{v:x}")
                 for k in nibbles for v in sorted({nibble(a, k) for a, _ in entries})}
        matches = [reg(m, Cat(*[flags[k, nibble(a, k)] for k in nibbles]).all(), f"reg_match{i}")
                   for i, (a, _) in enumerate(entries)]
        index_now = Cat(*[Cat(*[matches[i] for i in range(len(entries)) if i >> b & 1]).any()
                          for b in range(max(1, (len(entries) - 1).bit_length()))])
        m.d.comb += self.ok.eq(reg(m, Cat(*matches).any(), "reg_ok"))
        live = iter(range(self.n_live))
        values = [Const(v, 32) if v is not None else self.live[next(live)] for _, v in entries]
        groups = range(0, len(values), GROUP)
        reg_index = Replicated(len(index_now), len(groups), "reg_index")
        m.d.sync += reg_index.eq(index_now)
        group_bits = (GROUP - 1).bit_length()
        group_values = [reg(m, Array(values[g:g + GROUP])[reg_index.copy(i)[:group_bits]], f"reg_group{i}",
                            unsigned(32)) for i, g in enumerate(groups)]
        m.d.comb += self.value.eq(reg(m, Array(group_values)[reg(m, reg_index.copy(0)[group_bits:],
                                                                     "reg_group_index")], "reg_value", unsigned(32)))
        return m
