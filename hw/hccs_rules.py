"""The HCCS parameter rules of ``somatile.model.hccs.check_params`` in hardware: B - S*Dmax >= 0, the floor's
mass over the row >= MIN_FLOOR_MASS and the row's mass <= MAX_ROW_MASS, for (B, S, Dmax) over ``cols``
columns. The tile checks them on an HCCS command's head (over the command's row length) and on a
CONFIGURE_HEAD block (over the head's slots).

Contract: free running (no handshake); ``ok`` describes the inputs of :data:`LATENCY` cycles before. S and
Dmax are used on their low 8 bits (the head registers hold range-checked values; a CONFIGURE_HEAD block's
range checks run beside this). B is unsigned.

Why so many registers: S*Dmax (two 8-bit operands) is built in the fabric in two steps (through a DSP
block's row it did not fit a cycle, nor in one step); then the floor B - S*Dmax; the two masses; each
comparison in a register of its own (behind the floor mass's multiplier the comparison and the AND do not
fit a cycle). The AND of the three is left to the user's next register (the tile's check priority or its
config_ok), so ``ok`` itself is combinational on the last registers.

The wide profile's HCCS rule (``somatile.model.wide.check_params``: 1 <= B and B - ((S*Dmax) >> 8) >= 0, over
no row length) is :class:`WideHccsRules`, with the same ports but ``cols`` and the same :data:`LATENCY`, so
that the tile's settle counts do not depend on the profile.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Shape, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from somatile.hw.pipe import delay, lut_mul_pipelined, reg
from somatile.model import hccs, wide

LATENCY = 5
"""Cycles from the inputs to ``ok``: S*Dmax (2), the floor, the masses, their comparisons."""


class HccsRules(wiring.Component):
    """Ports ``B`` (``b_shape``), ``S`` (``s_shape``), ``dmax`` (``dmax_shape``), ``cols`` (16 bits, unless
    ``cols`` is given as a constant here), ``ok`` Out(1)."""

    def __init__(self, b_shape, s_shape, dmax_shape, cols: int | None = None):
        self.cols_const = cols
        members = {"B": In(Shape.cast(b_shape)), "S": In(Shape.cast(s_shape)), "dmax": In(Shape.cast(dmax_shape)),
                   "ok": Out(1)}
        if cols is None:
            members["cols"] = In(16)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        product = lut_mul_pipelined(m, self.S[:8], self.dmax[:8], "s_dmax", unsigned(16))
        # B zero-extended: it is a magnitude (1..32767), whatever its port's width.
        floor = reg(m, delay(m, self.B, 2).as_unsigned() - product, "floor", signed(18))
        cols = self.cols_const if self.cols_const is not None else delay(m, self.cols, 3)
        B = delay(m, self.B, 3)
        floor_mass = reg(m, cols * floor, "floor_mass", signed(36))
        row_mass = reg(m, cols * B, "row_mass", unsigned(34))
        checks = Cat(delay(m, floor >= 0, 1), floor_mass >= hccs.MIN_FLOOR_MASS, row_mass <= hccs.MAX_ROW_MASS)
        m.d.comb += self.ok.eq(reg(m, checks, "checks").all())
        return m


def rules_ok(m, name: str, B, S, dmax, cols):
    """The rules on these values as submodule ``name`` of ``m``: its ``ok``, LATENCY cycles behind them
    (``cols`` a value or a constant int)."""
    m.submodules[name] = rules = HccsRules(B.shape(), S.shape(), dmax.shape(), cols if isinstance(cols, int) else None)
    m.d.comb += [rules.B.eq(B), rules.S.eq(S), rules.dmax.eq(dmax)]
    if not isinstance(cols, int):
        m.d.comb += rules.cols.eq(cols)
    return rules.ok


class WideHccsRules(wiring.Component):
    """The wide profile's HCCS rule on ``B`` (``b_shape``), ``S`` and ``dmax`` (16 bits each): ``ok`` describes
    the inputs of :data:`LATENCY` cycles before. S*Dmax (two 16-bit operands) in the fabric in two steps like
    the paper's, its Q8 shift free, then the floor and the two comparisons, each in a register; the rest of
    the latency is a delay, so that the wide tile settles in the paper tile's cycles."""

    def __init__(self, b_shape):
        super().__init__({"B": In(Shape.cast(b_shape)), "S": In(16), "dmax": In(16), "ok": Out(1)})

    def elaborate(self, platform):
        m = Module()
        product = lut_mul_pipelined(m, self.S[:16], self.dmax[:16], "s_dmax", unsigned(32))
        B = delay(m, self.B, 2).as_unsigned()
        floor = reg(m, B - (product >> wide.S_FRAC_BITS), "floor", signed(26))
        checks = Cat(floor >= 0, delay(m, B >= wide.B_MIN, 1))
        m.d.comb += self.ok.eq(delay(m, reg(m, checks, "checks"), LATENCY - 4).all())
        return m


def wide_rules_ok(m, name: str, B, S, dmax):
    """The wide rule on these values as submodule ``name`` of ``m``: its ``ok``, LATENCY cycles behind them."""
    m.submodules[name] = rules = WideHccsRules(B.shape())
    m.d.comb += [rules.B.eq(B), rules.S.eq(S), rules.dmax.eq(dmax)]
    return rules.ok
