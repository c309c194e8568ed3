"""PLL settings for the open FPGA families: the board oscillator -> the tile clock target (and, on the ECP5,
a second clock from the same VCO for an SoC's CPU).

``ecp5_pll(osc_mhz, target_mhz, secondary_mhz)`` and ``ice40_pll(osc_mhz, target_mhz)`` search the divider
space within the datasheet limits and return the closest achievable output; :class:`Pll` turns a setting
into the vendor primitive. nextpnr derives the output clock's frequency constraint from the primitive's parameters,
so the timing report is against the frequency the PLL really makes (reported as ``achieved_mhz``).
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Elaboratable, Instance, Module, Signal
from amaranth.lib import io


@dataclass(frozen=True)
class PllSetting:
    """One PLL configuration. ``dividers`` holds the primitive's divider parameters by name."""
    family: str
    osc_mhz: float
    target_mhz: float
    achieved_mhz: float
    vco_mhz: float
    dividers: dict
    secondary_mhz: float | None = None
    """The second output's frequency (EHXPLLL CLKOS = VCO / CLKOS_DIV), where one was asked for."""

    @property
    def error_mhz(self) -> float:
        return self.achieved_mhz - self.target_mhz


# ECP5 EHXPLLL limits (Lattice TN1263): PFD 3.125-400 MHz, VCO 400-800 MHz, output 3.125-400 MHz.
_ECP5_PFD = (3.125, 400.0)
_ECP5_VCO = (400.0, 800.0)
_ECP5_OUT = (3.125, 400.0)
# iCE40 SB_PLL40 limits (Lattice iCE40 sysCLOCK PLL guide): PFD 10-133 MHz, VCO 533-1066 MHz, out 16-275 MHz.
_ICE40_PFD = (10.0, 133.0)
_ICE40_VCO = (533.0, 1066.0)
_ICE40_OUT = (16.0, 275.0)


def _unreachable(family: str, osc_mhz: float, target_mhz: float, out: tuple[float, float]) -> ValueError:
    return ValueError(f"{family} PLL: clock target {target_mhz} MHz from a {osc_mhz} MHz oscillator: expected a "
                      f"target from {out[0]} to {out[1]} MHz (clock_mhz in the board file)")


def ecp5_pll(osc_mhz: float, target_mhz: float, secondary_mhz: float | None = None) -> PllSetting:
    """EHXPLLL with feedback from CLKOP: out = osc / CLKI_DIV * CLKFB_DIV, VCO = out * CLKOP_DIV; with
    ``secondary_mhz`` also CLKOS = VCO / CLKOS_DIV (the primary output closest first, then the secondary)."""
    if not _ECP5_OUT[0] <= target_mhz <= _ECP5_OUT[1]:
        raise _unreachable("ECP5", osc_mhz, target_mhz, _ECP5_OUT)
    if secondary_mhz is not None and not _ECP5_OUT[0] <= secondary_mhz <= _ECP5_OUT[1]:
        raise _unreachable("ECP5", osc_mhz, secondary_mhz, _ECP5_OUT)
    best = None
    for clki_div in range(1, 129):
        pfd = osc_mhz / clki_div
        if not _ECP5_PFD[0] <= pfd <= _ECP5_PFD[1]:
            continue
        for clkfb_div in range(1, 81):
            out = pfd * clkfb_div
            if not _ECP5_OUT[0] <= out <= _ECP5_OUT[1]:
                continue
            for clkop_div in range(1, 129):
                vco = out * clkop_div
                if _ECP5_VCO[0] <= vco <= _ECP5_VCO[1]:
                    dividers = {"CLKI_DIV": clki_div, "CLKFB_DIV": clkfb_div, "CLKOP_DIV": clkop_div}
                    secondary_error = 0.0
                    if secondary_mhz is not None:
                        dividers["CLKOS_DIV"] = min(max(round(vco / secondary_mhz), 1), 128)
                        secondary_error = abs(vco / dividers["CLKOS_DIV"] - secondary_mhz)
                    # closest output, then the closest second output, then the highest VCO (least jitter)
                    key = (abs(out - target_mhz), secondary_error, -vco)
                    if best is None or key < best[0]:
                        best = (key, out, vco, dividers)
    if best is None:
        raise _unreachable("ECP5", osc_mhz, target_mhz, _ECP5_OUT)
    _, out, vco, dividers = best
    secondary = vco / dividers["CLKOS_DIV"] if secondary_mhz is not None else None
    return PllSetting("ecp5", osc_mhz, target_mhz, out, vco, dividers, secondary)


def ice40_pll(osc_mhz: float, target_mhz: float) -> PllSetting:
    """SB_PLL40 in SIMPLE feedback: out = osc * (DIVF + 1) / ((DIVR + 1) * 2**DIVQ)."""
    if not _ICE40_OUT[0] <= target_mhz <= _ICE40_OUT[1]:
        raise _unreachable("iCE40", osc_mhz, target_mhz, _ICE40_OUT)
    best = None
    for divr in range(16):
        pfd = osc_mhz / (divr + 1)
        if not _ICE40_PFD[0] <= pfd <= _ICE40_PFD[1]:
            continue
        for divf in range(128):
            vco = pfd * (divf + 1)
            if not _ICE40_VCO[0] <= vco <= _ICE40_VCO[1]:
                continue
            for divq in range(1, 7):
                out = vco / 2 ** divq
                key = abs(out - target_mhz)
                if best is None or key < best[0]:
                    best = (key, out, vco, {"DIVR": divr, "DIVF": divf, "DIVQ": divq,
                                            "FILTER_RANGE": _ice40_filter_range(pfd)})
    if best is None:
        raise _unreachable("iCE40", osc_mhz, target_mhz, _ICE40_OUT)
    _, out, vco, dividers = best
    return PllSetting("ice40", osc_mhz, target_mhz, out, vco, dividers)


def _ice40_filter_range(pfd_mhz: float) -> int:
    # Loop-filter setting by PFD frequency, from the iCE40 PLL configuration tables.
    for limit, setting in ((17, 1), (26, 2), (44, 3), (66, 4), (101, 5)):
        if pfd_mhz < limit:
            return setting
    return 6


def pll_for(family: str, osc_mhz: float, target_mhz: float, secondary_mhz: float | None = None) -> PllSetting:
    """The PLL setting of a family ('ecp5' or 'ice40'); ``secondary_mhz`` asks the ECP5 for a second output."""
    search = {"ecp5": ecp5_pll, "ice40": ice40_pll}.get(family)
    if search is None:
        raise ValueError(f"PLL: family {family!r}: expected 'ecp5' or 'ice40'")
    if secondary_mhz is None:
        return search(osc_mhz, target_mhz)
    if family != "ecp5":
        raise ValueError(f"PLL: family {family!r} makes one clock here (SB_PLL40_PAD), expected no second "
                         f"output ({secondary_mhz} MHz asked)")
    return ecp5_pll(osc_mhz, target_mhz, secondary_mhz)


# The ECP5 PLL's pin of the second output (an SoC's CPU clock): a build times the endpoints it clocks against
# its period (boards/timing.py finds each endpoint's clock source in the SDF).
SECONDARY_OUTPUT = "CLKOS"


class Pll(Elaboratable):
    """The vendor PLL primitive fed from the board's oscillator pin (``clk_pin``: a platform port requested
    with ``dir="-"``). ``clk`` is the generated clock, ``locked`` its lock indicator.

    ECP5: the pin goes through an input buffer into EHXPLLL.CLKI. iCE40: the oscillator pin of the boards used
    here is the PLL's pad, so SB_PLL40_PAD takes the pin itself (a buffered pin conflicts with the PLL bel).
    """

    def __init__(self, setting: PllSetting, clk_pin):
        self.setting = setting
        self.clk_pin = clk_pin
        self.clk = Signal()
        self.clk_secondary = Signal()
        self.locked = Signal()

    def elaborate(self, platform):
        m = Module()
        s, d = self.setting, self.setting.dividers
        if s.family == "ecp5":
            m.submodules.clk_buf = clk_buf = io.Buffer("i", self.clk_pin)
            secondary = {}
            if s.secondary_mhz is not None:
                # CLKOS from the same VCO; its phase parameters as CLKOP's (no shift).
                secondary = dict(a_FREQUENCY_PIN_CLKOS=f"{s.secondary_mhz:g}", p_CLKOS_ENABLE="ENABLED",
                                 p_CLKOS_DIV=d["CLKOS_DIV"], p_CLKOS_CPHASE=d["CLKOS_DIV"] - 1, p_CLKOS_FPHASE=0,
                                 o_CLKOS=self.clk_secondary, i_ENCLKOS=0)
            m.submodules.pll = Instance(
                "EHXPLLL",
                a_FREQUENCY_PIN_CLKI=f"{s.osc_mhz:g}", a_FREQUENCY_PIN_CLKOP=f"{s.achieved_mhz:g}",
                a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
                p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
                p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
                p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
                p_CLKI_DIV=d["CLKI_DIV"], p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=d["CLKOP_DIV"],
                p_CLKOP_CPHASE=d["CLKOP_DIV"] - 1, p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
                p_CLKFB_DIV=d["CLKFB_DIV"],
                i_RST=0, i_STDBY=0, i_CLKI=clk_buf.i, o_CLKOP=self.clk, i_CLKFB=self.clk,
                i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0,
                i_ENCLKOP=0, o_LOCK=self.locked, **secondary)
        else:
            m.submodules.pll = Instance(
                "SB_PLL40_PAD",
                p_FEEDBACK_PATH="SIMPLE", p_PLLOUT_SELECT="GENCLK",
                p_DIVR=d["DIVR"], p_DIVF=d["DIVF"], p_DIVQ=d["DIVQ"], p_FILTER_RANGE=d["FILTER_RANGE"],
                i_PACKAGEPIN=self.clk_pin.io, o_PLLOUTGLOBAL=self.clk, i_RESETB=1, i_BYPASS=0,
                o_LOCK=self.locked)
        return m
