"""Long runs of a streaming unit in Verilator with no Python per cycle: the C++ stream harness (sim/stream_tb.cpp).

A unit with one valid/ready input stream and one valid/ready output stream (the HCCS unit's ``i``/``o``, the
tile's ``s_axis``/``m_axis``) is compiled together with the harness; Python writes the input beats in bulk, the
harness drives them (optionally with seeded idle cycles and output backpressure), and the output beats come
back as arrays, with the cycle at which every beat moved.

API::

    amaranth_stream(member) -> Stream          # "i" -> i__valid, i__ready, i__payload
    axis_stream(prefix) -> Stream              # "s_axis" -> s_axis_tvalid, s_axis_tready, tdata, tlast
    build(factory, params, toplevel, input=, output=, setup=None, report=()) -> StreamBuild
    run(build, beats, expect, setup=None, idle=0, stall=0, seed=1) -> StreamRun
    payload_fields(layout) -> PayloadLayout    # an Amaranth struct layout as offsets, for pack / unpack
    pack(fields, values) / unpack(fields, raw) # numpy, every beat at once

A record (one beat in a file) is the stream's ports in order, each little-endian in ``ceil(width / 8)``
bytes; :meth:`StreamBuild.records` and :meth:`StreamBuild.fields` convert between records and per-port byte
arrays. ``setup`` is a second input stream (a configuration port) whose beats all go in before the first input
beat; every other input port of the unit is held at 0, and ``rst`` comes from a reset counter in a generated
Verilog wrapper (see :func:`_wrapper`: it took the tile from 330k to 500k cycles/s). ``report`` names output
ports (up to 64 bits) whose values after the run come back in :attr:`StreamRun.report`.

Builds live beside the cocotb ones (``runner.build_root()``, one directory per hash of the Verilog, the
harness, its port header and the compiler flags) and are reused; one build at a time (a file lock),
``make -j 2``; the model's per-cycle code is compiled with -O3. A
:class:`StreamBuild` is a small picklable record, so jobs of ``somatile.eval.jobs`` take one and run it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from somatile.sim import runner

HARNESS = Path(__file__).resolve().parent / "stream_tb.cpp"
PORTS_HEADER = "stream_ports.h"
BINARY = "stream_tb"


@dataclasses.dataclass(frozen=True)
class Stream:
    """A valid/ready stream of a unit: its handshake ports and the data ports that make up a beat (``ready``
    None: always ready)."""
    valid: str
    ready: str | None
    data: tuple[str, ...]


def amaranth_stream(member: str) -> Stream:
    """An ``amaranth.lib.stream`` port as Verilog names it: ``<member>__payload/__valid/__ready``."""
    return Stream(f"{member}__valid", f"{member}__ready", (f"{member}__payload",))


def axis_stream(prefix: str) -> Stream:
    """An AXI4-Stream port of flat names: ``<prefix>_tvalid/_tready``, beats of ``tdata`` and ``tlast``."""
    return Stream(f"{prefix}_tvalid", f"{prefix}_tready", (f"{prefix}_tdata", f"{prefix}_tlast"))


@dataclasses.dataclass(frozen=True)
class StreamBuild:
    """A compiled harness: the binary and the byte width of every data port of its streams."""
    binary: Path
    toplevel: str
    port_bytes: dict[str, int]
    input: Stream
    output: Stream
    setup: Stream | None

    def records(self, stream: Stream, ports: dict[str, np.ndarray]) -> np.ndarray:
        """Beats as records (K, record bytes) uint8 from each data port's bytes (K, port bytes) or, for a
        port of up to 8 bytes, its integer values (K,)."""
        parts = []
        for name in stream.data:
            value = np.asarray(ports[name])
            width = self.port_bytes[name]
            if value.ndim == 1:
                value = value.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :width]
            if value.shape[1:] != (width,):
                raise ValueError(f"{self.toplevel}: port {name} takes {width} bytes a beat, got shape {value.shape}")
            parts.append(value.astype(np.uint8))
        return np.ascontiguousarray(np.concatenate(parts, axis=1))

    def fields(self, stream: Stream, records: np.ndarray) -> dict[str, np.ndarray]:
        """The inverse of :meth:`records`: each data port's bytes (K, port bytes)."""
        out, at = {}, 0
        for name in stream.data:
            width = self.port_bytes[name]
            out[name] = records[:, at:at + width]
            at += width
        return out

    def record_bytes(self, stream: Stream) -> int:
        return sum(self.port_bytes[name] for name in stream.data)


@dataclasses.dataclass(frozen=True)
class StreamRun:
    """What one harness run returns: the output records, when each input and output beat moved, the cycles
    from the first input beat accepted to the last output beat taken (inclusive) and the wall and CPU time of
    the simulator's cycle loop (without start-up and file I/O; on a loaded machine the two differ)."""
    out: np.ndarray
    in_cycles: np.ndarray
    out_cycles: np.ndarray
    cycles: int
    cycles_run: int
    timeout: bool
    seconds: float
    cpu_seconds: float
    report: dict[str, int]


def _ports(component) -> dict[str, tuple[str, int]]:
    """Verilog name -> (flow "In"/"Out", width) of every port of an Amaranth component."""
    from amaranth.hdl import Value

    return {"__".join(map(str, path)): (member.flow.name, Value.cast(value).shape().width)
            for path, member, value in component.signature.flatten(component)}


def _member(name: str) -> str:
    """The C++ member of a port of a Verilated model: Verilator escapes a double underscore as ``___05F``."""
    return name.replace("__", "___05F")


def _header(toplevel: str, ports: dict[str, tuple[str, int]], streams: dict[str, Stream | None],
            report: tuple[str, ...]) -> str:
    """stream_ports.h: the Verilated class, the ports of each stream ("IN", "OUT", "SETUP") and their byte
    widths, the inputs held at 0 and the ports reported after the run (see sim/stream_tb.cpp)."""
    nbytes = {name: -(-width // 8) for name, (_, width) in ports.items()}
    lines = [f"// Generated by somatile.sim.stream for {toplevel}.", f'#include "V{toplevel}_stream.h"',
             f"#define TOP_CLASS V{toplevel}_stream", f"#define RESET_CYCLES {RESET_CYCLES}"]
    driven = {"clk", "rst"}
    for role, spec in streams.items():
        if spec is None:
            continue
        for name in (spec.valid, spec.ready, *spec.data):
            if name is not None and name not in ports:
                raise ValueError(f"{toplevel}: {role} stream port {name!r} is not a port of the unit "
                                 f"(ports: {', '.join(sorted(ports))})")
        driven.update(spec.data if role != "OUT" else ())
        driven.add(spec.valid if role != "OUT" else spec.ready)
        fields = " ".join(f"F({_member(name)}, {nbytes[name]})" for name in spec.data)
        lines.append(f"#define {role}_FIELDS(F) {fields}")
        lines.append(f"#define {role}_VALID {_member(spec.valid)}")
        if role == "SETUP":
            accepted = f"(t->{_member(spec.ready)})" if spec.ready else "true"
            lines.append(f"#define SETUP_ACCEPTED(t) {accepted}")
        elif role == "IN":
            lines.append(f"#define IN_READY {_member(spec.ready)}")
        else:
            lines.append(f"#define OUT_READY {_member(spec.ready)}")
    for name in report:
        if name not in ports or ports[name][0] != "Out" or ports[name][1] > 64:
            raise ValueError(f"{toplevel}: report port {name!r} must be an output of at most 64 bits")
    tied = [name for name, (flow, _) in ports.items() if flow == "In" and name not in driven]
    tie = " ".join(f"t->{_member(name)} = 0;" for name in tied)
    lines.append(f"#define TIE_LOW(t) {tie}")
    lines.append("#define REPORT_PORTS(F) " + " ".join(f'F({_member(name)}, "{name}")' for name in report))
    return "\n".join(lines) + "\n"


VERILATOR_FLAGS = ("-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert", "-Wno-fatal", "-Wno-lint",
                   "-Wno-style")
OPT_FAST = "-O3"
"""The C++ optimisation of the model's per-cycle code (Verilator's default is -Os): -O3 ran the tile's cycle loop
in 20 % less CPU time than -O2."""
RESET_CYCLES = 4
"""Cycles the wrapper holds the unit's ``rst`` high after time zero."""


def _wrapper(toplevel: str, ports: dict[str, tuple[str, int]]) -> str:
    """A Verilog top ``<toplevel>_stream`` with the unit's ports but ``rst``, which a counter holds high for
    :data:`RESET_CYCLES` cycles. With ``rst`` a top-level input, the logic that reads it (the next state of
    almost every register, through Yosys's synchronous reset) is input-combinational logic, which Verilator
    evaluates again on every ``eval()``; behind a register it is evaluated at the clock edge only."""
    others = [name for name in ports if name not in ("clk", "rst")]
    declarations = [f"    {'input' if flow == 'In' else 'output'} wire [{width - 1}:0] {name}"
                    for name, (flow, width) in ports.items() if name in others]
    connections = ", ".join(f".{name}({name})" for name in others)
    return "\n".join([
        f"module {toplevel}_stream(", "    input wire clk,", ",\n".join(declarations), ");",
        f"    reg [7:0] reset_left = 8'd{RESET_CYCLES};",
        "    always @(posedge clk) if (reset_left != 0) reset_left <= reset_left - 8'd1;",
        f"    {toplevel} unit(.clk(clk), .rst(reset_left != 0), {connections});", "endmodule", ""])


def build(component_factory, params: dict, toplevel: str, *, input: Stream, output: Stream,
          setup: Stream | None = None, report: tuple[str, ...] = (), timeout_s: float = 1800) -> StreamBuild:
    """Elaborate ``component_factory(**params)`` and compile it with the stream harness unless an identical
    build exists (see the module docstring)."""
    runner.prepare_environment()
    component = component_factory(**params)
    ports = _ports(component)
    header = _header(toplevel, ports, {"IN": input, "OUT": output, "SETUP": setup}, tuple(report))
    verilog = runner.verilog_for(component, toplevel) + _wrapper(toplevel, ports)
    digest = hashlib.sha256("\n".join([verilog, header, " ".join(VERILATOR_FLAGS), OPT_FAST]).encode()
                            + HARNESS.read_bytes()).hexdigest()[:12]
    directory = runner.build_root() / f"{toplevel}-stream-{digest}"
    binary = directory / BINARY
    with runner.locked(directory):
        if not binary.exists():
            (directory / f"{toplevel}.v").write_text(verilog)
            (directory / PORTS_HEADER).write_text(header)
            command = ["verilator", "--cc", "--exe", "--build", "-j", "2", *VERILATOR_FLAGS, "--top-module",
                       f"{toplevel}_stream", "--Mdir", str(directory / "obj"), "-o", str(binary), "-CFLAGS",
                       f"-I{directory}", str(directory / f"{toplevel}.v"), str(HARNESS)]
            env = {**os.environ, **runner.VERILATOR_BUILD_ENV}
            env["MAKEFLAGS"] = f"{env['MAKEFLAGS']} OPT_FAST={OPT_FAST}"
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
            (directory / "build.log").write_text(result.stdout + result.stderr)
            if result.returncode or not binary.exists():
                raise runner.SimulationFailure(f"Verilator build of the {toplevel} stream harness failed; log "
                                               f"{directory / 'build.log'}:\n{result.stderr[-4000:]}")
            runner.drop_intermediates(directory / "obj")
    port_bytes = {name: -(-width // 8) for name, (_, width) in ports.items()}
    return StreamBuild(binary, toplevel, port_bytes, input, output, setup)


def run(sim: StreamBuild, beats: np.ndarray, expect: int, *, setup: np.ndarray | None = None, idle: float = 0.0,
        stall: float = 0.0, seed: int = 1, max_cycles: int | None = None) -> StreamRun:
    """Stream the input records ``beats`` (K, record bytes) through the unit and collect ``expect`` output
    beats (fewer when the run times out: :attr:`StreamRun.timeout`)."""
    if beats.ndim != 2 or beats.shape[1] != sim.record_bytes(sim.input):
        raise ValueError(f"beats: expected records of {sim.record_bytes(sim.input)} bytes, got shape {beats.shape}")
    with tempfile.TemporaryDirectory(prefix="stream-") as tmp:
        tmp = Path(tmp)
        np.ascontiguousarray(beats, np.uint8).tofile(tmp / "in.bin")
        command = [str(sim.binary), "--in", str(tmp / "in.bin"), "--out", str(tmp / "out.bin"), "--expect",
                   str(expect), "--in-cycles", str(tmp / "in_cycles.bin"), "--out-cycles",
                   str(tmp / "out_cycles.bin"), "--idle", repr(float(idle)), "--stall", repr(float(stall)),
                   "--seed", str(seed)]
        if max_cycles is not None:
            command += ["--max-cycles", str(max_cycles)]
        if setup is not None:
            if sim.setup is None:
                raise ValueError(f"{sim.toplevel}: setup beats given but the build has no setup stream")
            np.ascontiguousarray(setup, np.uint8).tofile(tmp / "setup.bin")
            command += ["--setup", str(tmp / "setup.bin")]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode:
            raise runner.SimulationFailure(f"{sim.binary} stopped with status {result.returncode}: "
                                           f"{result.stderr[-2000:]}")
        summary = json.loads(result.stdout)
        out = np.fromfile(tmp / "out.bin", np.uint8).reshape(-1, sim.record_bytes(sim.output))
        in_cycles = np.fromfile(tmp / "in_cycles.bin", "<u8").astype(np.int64)
        out_cycles = np.fromfile(tmp / "out_cycles.bin", "<u8").astype(np.int64)
    return StreamRun(out, in_cycles, out_cycles, summary["cycles"], summary["cycles_run"], summary["timeout"],
                     summary["seconds"], summary["cpu_seconds"], summary["report"])


@dataclasses.dataclass(frozen=True)
class PayloadLayout:
    """An Amaranth struct layout flattened for numpy: per field (name, bit offset, element width, element
    count (0 for a scalar), signed), and the payload's bytes. Picklable, needs no Amaranth to use."""
    fields: tuple[tuple[str, int, int, int, bool], ...]
    nbytes: int


def payload_fields(layout) -> PayloadLayout:
    """The :class:`PayloadLayout` of a ``data.StructLayout`` whose fields are integers or arrays of them."""
    from amaranth.hdl import Shape
    from amaranth.lib import data

    fields = []
    for name, field in layout:
        if isinstance(field.shape, data.ArrayLayout):
            elem = Shape.cast(field.shape.elem_shape)
            fields.append((name, field.offset, elem.width, field.shape.length, elem.signed))
        else:
            shape = Shape.cast(field.shape)
            fields.append((name, field.offset, shape.width, 0, shape.signed))
    return PayloadLayout(tuple(fields), -(-Shape.cast(layout).width // 8))


def _scalars(fields: PayloadLayout):
    """(field name, element index or None, bit offset, width, signed) of every scalar in the payload."""
    for name, offset, width, count, signed in fields.fields:
        if count:
            for j in range(count):
                yield name, j, offset + j * width, width, signed
        else:
            yield name, None, offset, width, signed


def bits_value(bits: np.ndarray) -> np.ndarray:
    """Integers (K,) from bits (K, width <= 64) of booleans, bit 0 first (a lane mask as one field)."""
    packed = np.packbits(np.asarray(bits, bool), axis=1, bitorder="little")
    if packed.shape[1] > 8:
        raise ValueError(f"bits_value: {np.shape(bits)[1]} bits do not fit one 64-bit field")
    words = np.zeros((len(packed), 8), np.uint8)
    words[:, :packed.shape[1]] = packed
    return words.view("<u8").ravel().astype(np.int64)


def pack(fields: PayloadLayout, values: dict[str, np.ndarray]) -> np.ndarray:
    """Payload bytes (K, nbytes) of K beats from every field's values ((K,), or (K, count) for an array, or
    (K, width) booleans for an integer field given bit by bit, see :func:`bits_value`); values are cut to
    their field's width (two's complement for signed fields)."""
    beats = len(next(iter(values.values())))
    words = np.zeros((beats, -(-fields.nbytes // 8) + 1), np.uint64)
    for name, j, offset, width, _ in _scalars(fields):
        value = np.asarray(values[name])
        if j is None and value.ndim == 2:
            value = bits_value(value)
        value = (value if j is None else value[:, j]).astype(np.int64).view(np.uint64)
        value &= np.uint64((1 << width) - 1)
        word, shift = divmod(offset, 64)
        words[:, word] |= value << np.uint64(shift)
        if shift + width > 64:
            words[:, word + 1] |= value >> np.uint64(64 - shift)
    return words.astype("<u8").view(np.uint8).reshape(beats, -1)[:, :fields.nbytes]


def unpack(fields: PayloadLayout, raw: np.ndarray) -> dict[str, np.ndarray]:
    """The inverse of :func:`pack`: int64 values per field ((K,) or (K, count)), sign-extended where signed."""
    beats = len(raw)
    padded = np.zeros((beats, 8 * (-(-fields.nbytes // 8) + 1)), np.uint8)
    padded[:, :raw.shape[1]] = raw
    words = padded.view("<u8")
    out = {name: np.zeros((beats, count) if count else beats, np.int64)
           for name, _, _, count, _ in fields.fields}
    for name, j, offset, width, signed in _scalars(fields):
        word, shift = divmod(offset, 64)
        value = words[:, word] >> np.uint64(shift)
        if shift + width > 64:
            value |= words[:, word + 1] << np.uint64(64 - shift)
        value = (value & np.uint64((1 << width) - 1)).astype(np.int64)
        if signed:
            value -= (value >> (width - 1)) << width
        if j is None:
            out[name] = value
        else:
            out[name][:, j] = value
    return out
