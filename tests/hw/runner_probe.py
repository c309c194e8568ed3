"""A tiny counter and two cocotb tests for checking sim/runner.py itself (imported by the simulator)."""

import cocotb
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from cocotb.triggers import RisingEdge
from cocotb.clock import Clock

from somatile.sim.runner import job_inputs, write_job_outputs


class Counter(wiring.Component):
    """Counts cycles while ``enable`` is high; ``width`` bits."""

    def __init__(self, width: int):
        super().__init__({"enable": In(1), "count": Out(width)})

    def elaborate(self, platform):
        m = Module()
        with m.If(self.enable):
            m.d.sync += self.count.eq(self.count + 1)
        return m


async def _count(dut, cycles: int) -> int:
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    dut.enable.value = 0
    await RisingEdge(dut.clk)
    dut.rst.value = 0
    dut.enable.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.enable.value = 0
    await RisingEdge(dut.clk)
    return int(dut.count.value)


@cocotb.test()
async def counts_as_asked(dut):
    cycles = int(job_inputs()["cycles"])
    write_job_outputs(count=[await _count(dut, cycles)])


@cocotb.test()
async def always_fails(dut):
    count = await _count(dut, 3)
    assert count == 4, f"probe failure: count is {count}, this test expects 4"
