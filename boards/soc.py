"""A board's SoC (hw/soc.py) from its config: the firmware cross-built for the board's CPU, clock and bit rate,
and the SoC component holding that image.

The firmware is ``make -C firmware soc`` (the same core as the host build, with ``hal/soc/``) run with the
values of the board's ``soc:`` section; Debian's ``gcc-riscv64-unknown-elf`` and
``picolibc-riscv64-unknown-elf`` build it. Bad values fail here, at build time, naming the board key: an
image larger than ``soc.code_kib``, buffers larger than ``soc.data_kib``, a ``soc.baud`` the clock cannot
divide to within :data:`BAUD_TOLERANCE`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shutil
from pathlib import Path

from somatile.boards.config import BoardConfig, BoardError
from somatile.host.transport_firmware import FIRMWARE_DIR, firmware_make
from somatile.hw.soc_map import CPU_MARCH, HCCS_DIV_BITS, SOFT_TILE_PROFILE, SPRAM_PAIR_BYTES

CROSS = "riscv64-unknown-elf-"
UART_EXTRA_CYCLES = 2
"""simpleuart's bit lasts ``divider + 2`` cycles (its counter runs to ``divider + 1`` and restarts at 0)."""
BAUD_TOLERANCE = 0.02
"""Largest relative error of the bit rate the divider gives: a UART receiver samples each bit in its middle,
so over ten bits an error of a few percent still lands inside the bit."""


@dataclasses.dataclass(frozen=True)
class Firmware:
    """A cross-built image: the ELF the firmware's Makefile wrote (``firmware.bin`` and ``size.txt`` beside it)
    and the UART divider it programs for ``clock_hz``; the image, its section sizes and bit rate derive from them."""
    elf: Path
    uart_div: int
    clock_hz: int

    @property
    def image(self) -> bytes:
        """The image (``objcopy -O binary`` of the ELF) the code memory holds."""
        return self.elf.with_suffix(".bin").read_bytes()

    @property
    def sizes(self) -> dict[str, int]:
        """Bytes of each section (``size -A`` of the ELF)."""
        return _section_sizes(self.elf.with_name("size.txt"))

    @property
    def baud_achieved(self) -> float:
        """The bit rate ``uart_div`` gives at ``clock_hz`` (see :data:`UART_EXTRA_CYCLES`)."""
        return self.clock_hz / (self.uart_div + UART_EXTRA_CYCLES)


def soc_section(cfg: BoardConfig) -> dict:
    """The board's ``soc:`` section, its values checked against each other and the board's tile parameters
    (a BoardError names the key)."""
    if cfg.soc is None:
        raise BoardError(f"{cfg.source}: key 'soc': missing; --top soc needs the board's soc section "
                         f"(cpu, baud, code_kib, data_kib, max_payload; boards/config.py SOC_SCHEMA)")
    soc = dict(cfg.soc)
    if soc["peripheral"] == "hccs_unit":
        # The command layer in firmware drives one 1-lane unit of the paper profile (hw/soc.py).
        for key, want in (("profile", SOFT_TILE_PROFILE), ("hccs_lanes", 1), ("n_tiles", 1)):
            if getattr(cfg, key) != want:
                raise BoardError(f"{cfg.source}: key '{key}': got {getattr(cfg, key)!r}, expected {want!r} for "
                                 f"soc.peripheral: hccs_unit (the SoC's one HCCS unit, an element per register "
                                 f"write)")
    if separate_cpu_clock(cfg) and cfg.fpga is not None and cfg.fpga["family"] != "ecp5":
        raise BoardError(f"{cfg.source}: key 'soc.cpu_mhz': got {soc['cpu_mhz']:g}, expected 0 or clock_mhz = "
                         f"{cfg.clock_mhz:g} on {cfg.fpga['device']} (its PLL makes one clock here; a CPU clock of "
                         f"its own needs the ECP5's second PLL output)")
    if soc["data_ram"] == "spram":
        if cfg.fpga is not None and not cfg.fpga["device"].startswith("iCE40UP"):
            raise BoardError(f"{cfg.source}: key 'soc.data_ram': got 'spram', expected 'block' on "
                             f"{cfg.fpga['device']} (SB_SPRAM256KA blocks are the iCE40 UltraPlus's)")
        if soc["data_kib"] * 1024 % SPRAM_PAIR_BYTES:
            raise BoardError(f"{cfg.source}: key 'soc.data_kib': got {soc['data_kib']}, expected a multiple of "
                             f"{SPRAM_PAIR_BYTES // 1024} with data_ram: spram (a pair of 32 KiB blocks makes "
                             f"the 32-bit words)")
    return soc


def uart_divider(cfg: BoardConfig, clock_hz: float) -> tuple[int, float]:
    """(divider register value, achieved bit rate) for the board's ``soc.baud`` at ``clock_hz``."""
    baud = soc_section(cfg)["baud"]
    period = round(clock_hz / baud)
    div = period - UART_EXTRA_CYCLES
    achieved = clock_hz / period if period > 0 else 0.0
    if div < 4 or abs(achieved - baud) / baud > BAUD_TOLERANCE:
        raise BoardError(f"{cfg.source}: key 'soc.baud': got {baud}, expected a bit rate the {clock_hz / 1e6:g} MHz "
                         f"clock divides into at least {4 + UART_EXTRA_CYCLES} cycles per bit within "
                         f"{BAUD_TOLERANCE:.0%} (nearest: {achieved:.0f} bit/s)")
    return div, achieved


def build_firmware(cfg: BoardConfig, clock_hz: float, out: Path, board_arg: str | None = None) -> Firmware:
    """Cross-build the firmware for ``cfg``'s SoC at ``clock_hz`` into ``out``; ``board_arg`` is what the
    firmware's Makefile takes as BOARD (the board's file; a generated YAML where overrides apply)."""
    soc = soc_section(cfg)
    if shutil.which(CROSS + "gcc") is None:
        raise FileNotFoundError(f"{CROSS}gcc not found: apt-get install gcc-riscv64-unknown-elf "
                                f"picolibc-riscv64-unknown-elf (the SoC firmware's cross toolchain)")
    div, _ = uart_divider(cfg, clock_hz)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    variables = {"BOARD": board_arg or str(cfg.source), "BOARD_NAME": cfg.name, "BUILD": str(out / "host"),
                 "SOC_BUILD": str(out), "SOC_CROSS": CROSS, "SOC_MARCH": CPU_MARCH[soc["cpu"]],
                 "SOC_CLOCK_HZ": str(int(round(clock_hz))), "SOC_UART_DIV": str(div),
                 "SOC_CODE_BYTES": str(soc["code_kib"] * 1024), "SOC_DATA_BYTES": str(soc["data_kib"] * 1024),
                 "SOC_MAX_PAYLOAD": str(soc["max_payload"]), "SOC_TILE_TIMEOUT_MS": str(soc["tile_timeout_ms"]),
                 "SOC_PERIPHERAL": soc["peripheral"]}
    result = firmware_make("soc", *(f"{k}={v}" for k, v in variables.items()))
    log = result.stdout + result.stderr
    if result.returncode:
        overflow = re.search(r"region `(CODE|DATA)' overflowed by (\d+) bytes|no room for the stack", log)
        if overflow:
            key = "soc.code_kib" if overflow.group(1) == "CODE" else "soc.data_kib"
            size = soc[key.partition(".")[2]]
            what = (f"overflowed by {overflow.group(2)} bytes" if overflow.group(2)
                    else "leaves no room for the stack")
            raise BoardError(f"{cfg.source}: key '{key}': got {size} KiB, the firmware {what} "
                             f"(soc.max_payload = {soc['max_payload']} sizes its two frame buffers)")
        raise RuntimeError(f"SoC firmware build for board {cfg.name} failed:\n{log}")
    return Firmware(elf=out / "firmware.elf", uart_div=div, clock_hz=int(round(clock_hz)))


def _section_sizes(path: Path) -> dict[str, int]:
    sizes = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0].startswith(".") and fields[1].isdigit():
            sizes[fields[0]] = int(fields[1])
    return sizes


def separate_cpu_clock(cfg: BoardConfig) -> bool:
    """Whether the SoC's CPU side (CPU, memories, UART) has a clock domain of its own (``soc.cpu_mhz`` set and
    not the tile clock)."""
    cpu_mhz = cfg.soc["cpu_mhz"] if cfg.soc is not None else 0.0
    return cpu_mhz not in (0.0, cfg.clock_mhz)


def soc_pll(cfg: BoardConfig):
    """The PLL setting of ``cfg``'s SoC: the tile clock, and the CPU's clock as the second output where it has
    one of its own."""
    from somatile.boards.pll import pll_for

    secondary = cfg.soc["cpu_mhz"] if separate_cpu_clock(cfg) else None
    return pll_for(cfg.fpga["family"], cfg.fpga["osc_mhz"], cfg.clock_mhz, secondary)


def soc_clock_hz(cfg: BoardConfig) -> float:
    """The CPU's clock, which the firmware and the UART count in: the PLL's achieved frequency (its second
    output where the CPU has a clock of its own) on an FPGA board, ``soc.cpu_mhz`` (or ``clock_mhz``) elsewhere."""
    if cfg.kind == "fpga":
        pll = soc_pll(cfg)
        return (pll.secondary_mhz or pll.achieved_mhz) * 1e6
    return (cfg.soc["cpu_mhz"] if separate_cpu_clock(cfg) else cfg.clock_mhz) * 1e6


def soc_unit(cfg: BoardConfig, board_arg: str | None = None):
    """The SoC of ``cfg`` with its firmware cross-built for :func:`soc_clock_hz` (``somatile build --top soc``);
    the firmware is also ``unit.firmware``."""
    soc_section(cfg)
    digest = hashlib.sha256(repr(cfg.parameters()).encode()).hexdigest()[:10]
    firmware = build_firmware(cfg, soc_clock_hz(cfg), FIRMWARE_DIR / "build" / "soc" / f"{cfg.name}-{digest}",
                              board_arg)
    return make_soc(cfg, firmware)


def make_soc(cfg: BoardConfig, firmware: Firmware):
    """The SoC component of ``cfg`` holding ``firmware`` (kept as its ``firmware`` attribute)."""
    from somatile.hw.soc import Soc

    soc = soc_section(cfg)
    if soc["peripheral"] == "tile_array":
        if cfg.stream_width != 32:
            raise BoardError(f"{cfg.source}: key 'stream_width': got {cfg.stream_width}, expected 32 for --top soc "
                             f"(the CPU's tile-bus registers are 32 bits)")
        unit_kwargs = cfg.array_kwargs()
    else:
        unit_kwargs = {**cfg.hccs_kwargs(), "div_bits": HCCS_DIV_BITS}
    unit = Soc(image=firmware.image, code_bytes=soc["code_kib"] * 1024, data_bytes=soc["data_kib"] * 1024,
               uart_div=firmware.uart_div, cpu=soc["cpu"], peripheral=soc["peripheral"], data_ram=soc["data_ram"],
               cpu_domain="cpu" if separate_cpu_clock(cfg) else "sync", **unit_kwargs)
    unit.firmware = firmware
    return unit
