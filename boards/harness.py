"""The board wrapper used for place-and-route: PLL clock, reset, and a serial shift harness around a unit.

A tile or an HCCS unit has far more port bits than a board has pins, and a port left unconnected lets
synthesis delete the logic behind it. :class:`ShiftHarness` therefore drives every input bit of the unit from
a shift register fed by one pin (the UART receive pin) and captures every output bit into a register that
is shifted out on one pin (the UART transmit pin), reloaded every 2**CAPTURE_BITS cycles. Nothing is
optimised away, all timing paths of the unit are register to register, and the harness adds exactly
``in_bits + out_bits`` flip-flops (plus ``out_bits`` 2:1 muxes and a CAPTURE_BITS counter), which the report
states so the unit's own figures can be read off.

This wrapper measures resources and Fmax. It is not a host link: the firmware reaches a tile through its
AXI4-Stream command layer, not through this harness.
"""

from __future__ import annotations

from amaranth.hdl import Cat, ClockDomain, ClockSignal, Elaboratable, Instance, Module, ResetSignal, Signal, Value
from amaranth.lib import io, wiring
from amaranth.build import ResourceError
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer

from .pll import Pll, PllSetting

CAPTURE_BITS = 10
RESET_BUFFER = "reset_buffer"
"""The ECP5 harness's global buffer (DCCA) for the synchronised reset; nextpnr names its input net
``reset_buffer_CLKI``."""


def port_bits(unit: wiring.Component) -> tuple[int, int]:
    """(input bits, output bits) of a component's signature."""
    ins, outs = _split_ports(unit)
    return sum(len(v) for v in ins), sum(len(v) for v in outs)


def _split_ports(unit: wiring.Component) -> tuple[list[Value], list[Value]]:
    ins, outs = [], []
    for _path, member, value in unit.signature.flatten(unit):
        (ins if member.flow == wiring.In else outs).append(Value.cast(value))
    return ins, outs


def board_clock(m: Module, platform, setting: PllSetting) -> Pll:
    """The ``sync`` domain of a board top: the PLL's clock from the board oscillator at
    ``setting.achieved_mhz``, reset held until the PLL locks; with a second output (``setting.secondary_mhz``)
    also the ``cpu`` domain on it, its reset likewise. Returns the PLL."""
    m.submodules.pll = pll = Pll(setting, platform.request(platform.default_clk, dir="-"))
    m.domains.sync = ClockDomain("sync")
    m.d.comb += ClockSignal("sync").eq(pll.clk)
    if setting.family == "ecp5":
        # The synchronised reset reaches the unit's flip-flops through a global buffer (DCCA): nextpnr
        # promotes only clocks on its own, and on general routing the reset net (to some 3,000 flip-flops
        # of the tile) takes longer than a cycle. The synchroniser runs in a domain of its own on the same clock.
        m.domains.reset_source = ClockDomain("reset_source")
        m.d.comb += ClockSignal("reset_source").eq(pll.clk)
        m.submodules.reset_sync = ResetSynchronizer(~pll.locked, domain="reset_source")
        m.submodules[RESET_BUFFER] = Instance("DCCA", i_CLKI=ResetSignal("reset_source"), i_CE=1,
                                             o_CLKO=ResetSignal("sync"))
    else:
        m.submodules.reset_sync = ResetSynchronizer(~pll.locked, domain="sync")
    if setting.secondary_mhz is not None:
        # The SoC's CPU side (some 2,000 flip-flops): its reset on general routing meets its slower clock.
        m.domains.cpu = ClockDomain("cpu")
        m.d.comb += ClockSignal("cpu").eq(pll.clk_secondary)
        m.submodules.cpu_reset_sync = ResetSynchronizer(~pll.locked, domain="cpu")
    return pll


def uart_pins(m: Module, platform):
    """Buffers of the board's UART receive and transmit pins (resource ``uart`` 0): (``.i``, ``.o``)."""
    uart = platform.request("uart", 0, dir="-")
    m.submodules.serial_in = serial_in = io.Buffer("i", uart.rx)
    m.submodules.serial_out = serial_out = io.Buffer("o", uart.tx)
    return serial_in, serial_out


class ShiftHarness(Elaboratable):
    """``unit`` on a board: PLL-made ``sync`` clock at ``pll.achieved_mhz``, reset held until the PLL locks,
    ports reached through one serial-in and one serial-out pin (see the module docstring)."""

    def __init__(self, unit: wiring.Component, pll: PllSetting):
        self.unit = unit
        self.pll = pll

    def elaborate(self, platform):
        m = Module()
        board_clock(m, platform, self.pll)
        serial_in, serial_out = uart_pins(m, platform)
        m.submodules.unit = unit = self.unit
        ins, outs = _split_ports(unit)
        inputs, outputs = Cat(*ins), Cat(*outs)

        shift_in = Signal(len(inputs))
        m.d.sync += shift_in.eq(Cat(serial_in.i, shift_in[:-1]))
        m.d.comb += inputs.eq(shift_in)

        shift_out = Signal(len(outputs))
        capture = Signal(CAPTURE_BITS)
        m.d.sync += capture.eq(capture + 1)
        with m.If(capture == 0):
            m.d.sync += shift_out.eq(outputs)
        with m.Else():
            m.d.sync += shift_out.eq(shift_out >> 1)
        m.d.comb += serial_out.o.eq(shift_out[0])
        return m


class SocBoard(Elaboratable):
    """The SoC (hw/soc.py) on a board: clocks and resets as :func:`board_clock` (``pll`` with a second output
    where the SoC's CPU side has a clock of its own), the UART on the board's
    USB-serial pins (resource ``uart`` 0), the CPU's trap and the peripheral's error (the tile array's, or the
    HCCS unit's sticky status) on LEDs 0 and 1 where the board has them. Unlike :class:`ShiftHarness` this is the design a user flashes: it talks to the host."""

    def __init__(self, soc, pll: PllSetting):
        self.soc = soc
        self.pll = pll

    def elaborate(self, platform):
        m = Module()
        if (self.pll.secondary_mhz is not None) != (self.soc.cpu_domain != "sync"):
            raise ValueError(f"SoC with cpu_domain {self.soc.cpu_domain!r} and a PLL with"
                             f"{'' if self.pll.secondary_mhz else 'out'} a second output: expected both or neither")
        board_clock(m, platform, self.pll)
        m.submodules.soc = soc = self.soc
        serial_in, serial_out = uart_pins(m, platform)
        # The receive pin crosses from the USB bridge's clock: two flip-flops before the UART samples it.
        m.submodules.rx_sync = FFSynchronizer(serial_in.i, soc.uart_rx, init=1, o_domain=soc.cpu_domain)
        m.d.comb += [serial_out.o.eq(soc.uart_tx), soc.hold.eq(0)]
        for index, flag in enumerate((soc.trap, soc.error)):
            try:
                led = platform.request("led", index, dir="-")
            except ResourceError:
                continue
            m.submodules[f"led{index}"] = buffer = io.Buffer("o", led)
            m.d.comb += buffer.o.eq(flag)
        return m
