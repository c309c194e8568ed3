"""A design of registered products in the shapes boards/dsp_pack.py meets, and the cocotb test that runs its
gate-level netlist cycle by cycle (imported by the simulator)."""

import cocotb
import numpy as np
from amaranth import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge

from somatile.sim.runner import job_inputs, write_job_outputs

INPUTS = {"rst": 1, "x": 16, "y": 18, "z": 12, "en": 1}
OUTPUTS = {"o_plain": 28, "o_signed": 36, "o_shared": 28, "o_raw": 20, "o_const": 24, "o_enabled": 28, "tap": 16}


class ProductMix(wiring.Component):
    """Registered products: plain (reset-less operands), signed with the domain's synchronous reset, an operand
    register with a second load, a product used beside its register, a constant operand, and an operand
    register with an enable (which must stay in the fabric)."""

    x: In(16)
    y: In(signed(18))
    z: In(12)
    en: In(1)
    o_plain: Out(28)
    o_signed: Out(signed(36))
    o_shared: Out(28)
    o_raw: Out(20)
    o_const: Out(24)
    o_enabled: Out(28)
    tap: Out(16)

    def elaborate(self, platform):
        m = Module()
        x_d, z_d, x_e = Signal(16), Signal(12), Signal(16)
        y_d = Signal(signed(18))
        x_r = Signal(16, reset_less=True)
        m.d.sync += [x_d.eq(self.x), z_d.eq(self.z), y_d.eq(self.y), x_r.eq(self.x)]
        with m.If(self.en):
            m.d.sync += x_e.eq(self.x)
        raw = Signal(28)
        m.d.comb += [raw.eq(x_d * z_d), self.tap.eq(x_d)]
        m.d.sync += [
            self.o_plain.eq(x_r * z_d),
            self.o_signed.eq(y_d * y_d),
            self.o_shared.eq(x_d * z_d + 1),
            self.o_const.eq(z_d * 3001),
            self.o_enabled.eq(x_e * z_d),
            self.o_raw.eq(raw[4:24] ^ raw[:20]),
        ]
        return m


@cocotb.test()
async def replay(dut):
    """Drive one row of inputs per cycle (changed on the falling edge) and record the outputs after each
    rising edge; ``rst`` is an ordinary input of the sequence."""
    inputs = job_inputs()
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    recorded = {name: [] for name in OUTPUTS}
    await FallingEdge(dut.clk)
    for cycle in range(len(inputs["x"])):
        for name in INPUTS:
            getattr(dut, name).value = int(inputs[name][cycle]) & ((1 << INPUTS[name]) - 1)
        await FallingEdge(dut.clk)  # one rising edge has taken this row in
        for name in OUTPUTS:
            recorded[name].append(getattr(dut, name).value.to_unsigned())
    write_job_outputs(**{name: np.array(values, dtype=np.uint64) for name, values in recorded.items()})
