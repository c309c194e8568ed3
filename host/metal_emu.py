"""Run unchanged Metal kernels on the CPU: g++ against the `metal_stdlib` shim, one fiber per GPU thread.

`compile_library(source)` compiles a Metal source (as C++17, `-fsigned-char`, the shim's include folder
first) into a shared library cached under ``build/metal/<hash>/`` (or ``$SOMATILE_METAL_BUILD``); the hash
covers the source, the shim and the compiler flags, so a changed kernel or shim rebuilds and an unchanged one
loads in milliseconds. Every ``kernel void NAME(...)`` entry point (and MLX's ``[[kernel]] void``) gets a
generated launcher; `EmulatedLibrary.dispatch` runs it like ``dispatchThreads(grid, threadgroup)``.

The stand-ins `EmulatedMLX` and `EmulatedMetal` imitate the parts of ``mlx.core`` (``mx.fast.metal_kernel``)
and of PyObjC's ``Metal`` module that `somatile.host.metal_backend` uses, running the kernels here, so the
dispatch code of both paths is exercised on Linux.

What this proves and what it cannot: see docs/metal.md (Metal-only compile errors, GPU memory ordering,
real float rounding and speed need a Mac).
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

METAL_DIR = Path(__file__).resolve().parent / "metal"
SHIM_DIR = METAL_DIR / "shim"
CXX_FLAGS = ("-std=c++17", "-fsigned-char", "-Wno-attributes", "-O2", "-fPIC", "-shared")
THREAD_ORDERS = {"forward": 0, "reverse": 1, "random": 2}
DEFAULT_MARKER = 0xA5
GUARD = np.frombuffer(b"somatile-guard!!" * 4, np.uint8)
"""Bytes placed before and after every buffer of an emulated dispatch (64, not a multiple of any element)."""

# MSL element type -> numpy dtype of the buffer bound to a pointer of that type.
ELEMENT_DTYPES = {
    "char": np.int8, "uchar": np.uint8, "short": np.int16, "ushort": np.uint16, "int": np.int32,
    "uint": np.uint32, "long": np.int64, "ulong": np.uint64, "float": np.float32,
}
GRID_ATTRIBUTES = ("thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
                   "threads_per_threadgroup", "threads_per_grid", "threadgroups_per_grid")
INDEX_ATTRIBUTES = ("thread_index_in_threadgroup", "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup",
                    "threads_per_simdgroup", "simdgroups_per_threadgroup")
_ADDRESS_SPACES = {"device", "constant", "thread", "threadgroup", "const", "volatile"}


class EmulationError(RuntimeError):
    """A kernel could not be compiled or ran into a barrier/simd deadlock."""


def default_build_dir() -> Path:
    env = os.environ.get("SOMATILE_METAL_BUILD")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "build" / "metal"


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a kernel entry point: ``type_text name [[attribute(index)]]``."""

    type_text: str
    name: str
    attribute: str
    index: int | None

    @property
    def element(self) -> str:
        """The element type name with address spaces, qualifiers, ``*`` and ``&`` removed."""
        words = [w for w in re.split(r"[\s*&]+", self.type_text) if w and w not in _ADDRESS_SPACES]
        return " ".join(words)

    @property
    def is_reference(self) -> bool:
        return self.type_text.rstrip().endswith("&")


@dataclasses.dataclass(frozen=True)
class EntryPoint:
    name: str
    params: tuple[Param, ...]

    @property
    def buffers(self) -> dict[int, Param]:
        return {p.index: p for p in self.params if p.attribute == "buffer"}


_ENTRY = re.compile(r"(?:\bkernel|\[\[\s*kernel\s*\]\])\s+void\s+(\w+)\s*\(")
_PARAM = re.compile(r"^(?P<type>.*?)\b(?P<name>\w+)\s*\[\[\s*(?P<attr>\w+)\s*(?:\(\s*(?P<index>\d+)\s*\))?\s*\]\]$",
                    re.S)


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_entry_points(source: str) -> list[EntryPoint]:
    """The kernel entry points of a Metal source with their parameters, in source order."""
    text = _strip_comments(source)
    entries = []
    for match in _ENTRY.finditer(text):
        depth, i = 1, match.end()
        while depth:
            if i >= len(text):
                raise EmulationError(f"kernel {match.group(1)}: unbalanced parentheses in its parameter list")
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        params = []
        for raw in _split_params(text[match.end():i - 1]):
            m = _PARAM.match(raw)
            if not m:
                raise EmulationError(f"kernel {match.group(1)}: parameter {raw!r} has no [[attribute]]")
            attr = m.group("attr")
            if attr not in ("buffer", *GRID_ATTRIBUTES, *INDEX_ATTRIBUTES):
                raise EmulationError(f"kernel {match.group(1)}: parameter {m.group('name')!r} uses the attribute "
                                     f"[[{attr}]], which the emulator does not provide")
            index = int(m.group("index")) if m.group("index") is not None else None
            params.append(Param(m.group("type").strip(), m.group("name"), attr, index))
        entries.append(EntryPoint(match.group(1), tuple(params)))
    return entries


def _argument(p: Param) -> str:
    if p.attribute == "buffer":
        base = p.type_text.rstrip()[:-1] if p.is_reference else p.type_text
        return f"*({base}*)b[{p.index}]" if p.is_reference else f"({p.type_text})b[{p.index}]"
    if p.attribute in GRID_ATTRIBUTES:
        if p.element.endswith(("2", "3")):
            lanes = "xyz"[: int(p.element[-1])]
            return f"{p.element}{{" + ", ".join(f"decltype({p.element}::x)(a.{p.attribute}.{c})" for c in lanes) + "}"
        return f"({p.element})a.{p.attribute}.x"
    return f"({p.element})a.{p.attribute}"


def launcher_source(entries: Sequence[EntryPoint]) -> str:
    """C++ that gives each entry point an ``extern "C" somatile_emu_<name>`` dispatch function."""
    out = []
    for e in entries:
        args = ", ".join(_argument(p) for p in e.params)
        out.append(
            f"static void somatile_launch_{e.name}(void* const* b, const metal_emu::ThreadAttrs& a) {{\n"
            f"  (void)b; (void)a;\n  {e.name}({args});\n}}\n"
            f'extern "C" int somatile_emu_{e.name}(void* const* b, const unsigned* grid, const unsigned* group, '
            f"int order, unsigned long long seed, int marker, char* error, int error_len) {{\n"
            f"  return metal_emu::dispatch(somatile_launch_{e.name}, b, grid, group, order, seed, marker, error, "
            f"error_len);\n}}\n")
    return "\n".join(out)


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx:
        raise EmulationError("the Metal emulator needs a C++17 compiler: install g++ (apt-get install g++) or set CXX")
    return cxx


class EmulatedLibrary:
    """A compiled Metal source; `dispatch` runs one of its entry points on the CPU."""

    def __init__(self, path: Path, entries: Sequence[EntryPoint]):
        self.path = path
        self.entries = {e.name: e for e in entries}
        self._lib = ctypes.CDLL(str(path))

    def dispatch(self, name: str, buffers: Sequence[np.ndarray], grid: Sequence[int], threadgroup: Sequence[int],
                 order: str = "forward", seed: int = 0, marker: int = DEFAULT_MARKER) -> None:
        """Run kernel ``name`` over ``grid`` threads in ``threadgroup``-sized groups (both 1-3 ints).

        ``buffers[i]`` is bound to ``[[buffer(i)]]``: a C-contiguous numpy array whose dtype matches the
        pointer's element type; kernels write their outputs into these arrays in place. ``order`` is the
        order in which the threads of a threadgroup (and the threadgroups) are resumed: "forward",
        "reverse" or "random" (seeded by ``seed``); ``marker`` is the byte written over threadgroup memory
        before each threadgroup.
        """
        if name not in self.entries:
            raise EmulationError(f"no kernel named {name!r} in {self.path.name}; have {sorted(self.entries)}")
        if order not in THREAD_ORDERS:
            raise ValueError(f"order: expected one of {sorted(THREAD_ORDERS)}, got {order!r}")
        entry = self.entries[name]
        wanted = entry.buffers
        if sorted(wanted) != list(range(len(buffers))):
            raise EmulationError(f"kernel {name}: expects buffers at indices {sorted(wanted)}, got {len(buffers)}")
        for index, param in wanted.items():
            array = buffers[index]
            if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
                raise EmulationError(f"kernel {name}: buffer {index} ({param.name}) must be a C-contiguous ndarray")
            dtype = ELEMENT_DTYPES.get(param.element)
            if dtype is not None and array.dtype != dtype:
                raise EmulationError(f"kernel {name}: buffer {index} ({param.name}) is {param.element}*, expected "
                                     f"dtype {np.dtype(dtype)}, got {array.dtype}")
        dims = [tuple(int(v) for v in d) + (1,) * (3 - len(d)) for d in (grid, threadgroup)]
        # Each buffer runs in a copy fenced by guard bytes on both sides: a write outside the buffer
        # changes a guard and fails the dispatch (reads outside it are not detected).
        fenced = [np.concatenate([GUARD, a.view(np.uint8).reshape(-1), GUARD]) for a in buffers]
        pointers = (ctypes.c_void_p * max(1, len(buffers)))(*[f.ctypes.data + GUARD.size for f in fenced])
        grid3, group3 = ((ctypes.c_uint * 3)(*d) for d in dims)
        error = ctypes.create_string_buffer(512)
        fn = getattr(self._lib, f"somatile_emu_{name}")
        fn.restype = ctypes.c_int
        status = fn(pointers, grid3, group3, THREAD_ORDERS[order], ctypes.c_ulonglong(seed), marker, error, 512)
        if status != 0:
            raise EmulationError(f"kernel {name}: {error.value.decode()}")
        for index, (array, copy) in enumerate(zip(buffers, fenced)):
            if not (np.array_equal(copy[:GUARD.size], GUARD) and np.array_equal(copy[copy.size - GUARD.size:], GUARD)):
                raise EmulationError(f"kernel {name}: wrote outside buffer {index} ({wanted[index].name}, "
                                     f"{array.nbytes} bytes)")
            array.view(np.uint8).reshape(-1)[...] = copy[GUARD.size:copy.size - GUARD.size]


def compile_library(source: str, build_dir: Path | None = None) -> EmulatedLibrary:
    """Compile ``source`` (a complete Metal source) for the CPU, reusing a cached build when unchanged."""
    if not sys.platform.startswith("linux"):
        raise EmulationError(f"the Metal CPU emulator runs on Linux only (ELF sections and ucontext), not on "
                             f"{sys.platform}; on macOS use the Apple GPU (metal:// without emulate)")
    entries = parse_entry_points(source)
    if not entries:
        raise EmulationError("the Metal source has no `kernel void` entry point")
    unit = "#include <metal_stdlib>\n" + source + "\n\n" + launcher_source(entries)
    cxx = _compiler()
    digest = hashlib.sha256()
    for part in (unit, " ".join(CXX_FLAGS), cxx, *(p.read_text() for p in sorted(SHIM_DIR.iterdir()))):
        digest.update(part.encode())
    folder = (build_dir or default_build_dir()) / digest.hexdigest()[:16]
    library = folder / "kernels.so"
    if not library.exists():
        folder.mkdir(parents=True, exist_ok=True)
        # Every build works on its own temporary files and renames them into place (atomic), so concurrent
        # test processes never compile or load a half-written file.
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".cpp", delete=False) as tmp:
            tmp.write(unit)
        source_file, partial = Path(tmp.name), Path(tmp.name).with_suffix(".so")
        command = [cxx, *CXX_FLAGS, "-I", str(SHIM_DIR), str(source_file), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        source_file.replace(folder / "kernels.cpp")
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise EmulationError(f"g++ could not compile the Metal source ({folder / 'kernels.cpp'}):\n"
                                 f"{result.stderr.strip()}")
        partial.replace(library)
    return EmulatedLibrary(library, entries)


MSL_TYPES = {np.dtype(v): k for k, v in ELEMENT_DTYPES.items()}

# Thread attributes MLX turns into kernel parameters when a body names them, with the types MLX gives them.
MLX_ATTRIBUTE_TYPES = {**{name: "uint3" for name in GRID_ATTRIBUTES}, **{name: "uint" for name in INDEX_ATTRIBUTES}}


class _EmulatedMlxKernel:
    """What ``mx.fast.metal_kernel`` returns: called with inputs, output shapes/dtypes, grid and threadgroup."""

    def __init__(self, owner: "EmulatedMLX", name: str, input_names, output_names, source: str, header: str):
        self.owner, self.name = owner, name
        self.input_names, self.output_names = list(input_names), list(output_names)
        self.source, self.header = source, header

    def source_for(self, input_dtypes: Sequence[np.dtype], output_dtypes: Sequence[np.dtype]) -> str:
        """The kernel MLX would generate for these dtypes: inputs ``const device T*``, outputs ``device T*`` in
        buffer order, then the thread attributes the body names."""
        params = []
        for i, (name, dtype) in enumerate(zip(self.input_names, input_dtypes)):
            params.append(f"const device {MSL_TYPES[np.dtype(dtype)]}* {name} [[buffer({i})]]")
        for j, (name, dtype) in enumerate(zip(self.output_names, output_dtypes)):
            params.append(f"device {MSL_TYPES[np.dtype(dtype)]}* {name} [[buffer({len(input_dtypes) + j})]]")
        for attr, type_name in MLX_ATTRIBUTE_TYPES.items():
            if re.search(rf"\b{attr}\b", self.source):
                params.append(f"{type_name} {attr} [[{attr}]]")
        return (f"{self.header}\n[[kernel]] void {self.name}(\n    " + ",\n    ".join(params) +
                f") {{\n{self.source}\n}}\n")

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None, init_value=None,
                 verbose=False, stream=None):
        if template:
            raise EmulationError(f"{self.name}: the MLX stand-in does not emulate template arguments")
        if len(inputs) != len(self.input_names) or len(output_shapes) != len(self.output_names):
            raise EmulationError(f"{self.name}: expected {len(self.input_names)} inputs and "
                                 f"{len(self.output_names)} outputs, got {len(inputs)} and {len(output_shapes)}")
        arrays = [np.ascontiguousarray(np.asarray(a)) for a in inputs]  # ensure_row_contiguous=True
        for name, a in zip(self.input_names, arrays):
            if a.dtype not in MSL_TYPES or a.size == 0:
                raise EmulationError(f"{self.name}: input {name} must be a non-empty array of a Metal element "
                                     f"type, got {a.dtype} {a.shape}")
        dtypes = [np.dtype(d) for d in output_dtypes]
        # MLX outputs start uninitialised: fill them with the marker so an element a kernel forgets to write
        # shows up.
        outputs = [np.full(tuple(s), init_value, d) if init_value is not None else
                   np.frombuffer(bytes([self.owner.marker]) * (int(np.prod(s)) * d.itemsize), d).reshape(s).copy()
                   for s, d in zip(output_shapes, dtypes)]
        library = self.owner.library(self.source_for([a.dtype for a in arrays], dtypes))
        library.dispatch(self.name, arrays + outputs, grid, threadgroup, order=self.owner.order, seed=self.owner.seed,
                         marker=self.owner.marker)
        self.owner.dispatches += 1
        return outputs


class EmulatedMLX:
    """Stand-in for ``mlx.core`` as somatile.host.metal_backend uses it: numpy arrays for ``mx.array``, dtype
    names, and ``mx.fast.metal_kernel`` whose kernels run on the CPU emulator. ``order``/``seed``/``marker``
    go to every dispatch (see `EmulatedLibrary.dispatch`)."""

    int8, uint8, int16, uint16, int32, uint32, float32 = (np.dtype(t) for t in (
        np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.float32))

    def __init__(self, order: str = "forward", seed: int = 0, marker: int = DEFAULT_MARKER,
                 build_dir: Path | None = None):
        self.order, self.seed, self.marker, self.build_dir = order, seed, marker, build_dir
        self.dispatches = 0
        self._libraries: dict[str, EmulatedLibrary] = {}
        self.fast = type("fast", (), {"metal_kernel": staticmethod(self.metal_kernel)})

    @staticmethod
    def array(a, dtype=None) -> np.ndarray:
        return np.array(a, dtype=dtype)

    def metal_kernel(self, name: str, input_names, output_names, source: str, header: str = "",
                     ensure_row_contiguous: bool = True, atomic_outputs: bool = False):
        if atomic_outputs or not ensure_row_contiguous:
            raise EmulationError(f"{name}: the MLX stand-in emulates ensure_row_contiguous=True, atomic_outputs=False")
        return _EmulatedMlxKernel(self, name, input_names, output_names, source, header)

    def library(self, source: str) -> EmulatedLibrary:
        if source not in self._libraries:
            self._libraries[source] = compile_library(source, self.build_dir)
        return self._libraries[source]


class _Contents:
    def __init__(self, storage: np.ndarray):
        self._storage = storage

    def as_buffer(self, n: int) -> memoryview:
        return memoryview(self._storage)[:n]


class _Buffer:
    def __init__(self, data: bytes | None, length: int):
        self.storage = np.zeros(length, np.uint8)
        if data is not None:
            self.storage[:] = np.frombuffer(bytes(data)[:length], np.uint8)

    def contents(self) -> _Contents:
        return _Contents(self.storage)

    def length(self) -> int:
        return self.storage.size


class _CompileOptions:
    def __init__(self):
        self.fast_math = True  # Metal's default

    @classmethod
    def new(cls):
        return cls()

    def setFastMathEnabled_(self, enabled: bool) -> None:  # noqa: N802 - PyObjC selector name
        self.fast_math = bool(enabled)


class _Function:
    def __init__(self, library: EmulatedLibrary, name: str):
        self.library, self.name = library, name


class _Library:
    def __init__(self, library: EmulatedLibrary):
        self.library = library

    def newFunctionWithName_(self, name: str):  # noqa: N802
        return _Function(self.library, name) if name in self.library.entries else None


class _Pipeline:
    def __init__(self, function: _Function):
        self.function = function

    def maxTotalThreadsPerThreadgroup(self) -> int:  # noqa: N802
        return 1024


class _Encoder:
    def __init__(self, command_buffer: "_CommandBuffer"):
        self.command_buffer = command_buffer
        self.pipeline: _Pipeline | None = None
        self.buffers: dict[int, _Buffer] = {}
        self.bytes: dict[int, np.ndarray] = {}

    def setComputePipelineState_(self, pipeline: _Pipeline) -> None:  # noqa: N802
        self.pipeline = pipeline

    def setBuffer_offset_atIndex_(self, buffer: _Buffer, offset: int, index: int) -> None:  # noqa: N802
        if offset:
            raise EmulationError("the PyObjC stand-in binds buffers at offset 0 only")
        self.buffers[index] = buffer

    def setBytes_length_atIndex_(self, data: bytes, length: int, index: int) -> None:  # noqa: N802
        self.buffers[index] = _Buffer(data, length)

    def dispatchThreads_threadsPerThreadgroup_(self, grid, group) -> None:  # noqa: N802
        entry = self.pipeline.function.library.entries[self.pipeline.function.name]
        views = []
        for index in range(len(self.buffers)):
            if index not in self.buffers:
                raise EmulationError(f"kernel {entry.name}: no buffer bound at index {index}")
            dtype = ELEMENT_DTYPES.get(entry.buffers[index].element, np.uint8) if index in entry.buffers else np.uint8
            views.append(self.buffers[index].storage.view(dtype))
        self.command_buffer.work.append((self.pipeline.function, views, grid, group))

    def endEncoding(self) -> None:  # noqa: N802
        pass


class _CommandBuffer:
    def __init__(self, owner: "EmulatedMetal"):
        self.owner = owner
        self.work: list = []
        self._error = None

    def computeCommandEncoder(self) -> _Encoder:  # noqa: N802
        return _Encoder(self)

    def commit(self) -> None:
        for function, views, grid, group in self.work:
            try:
                function.library.dispatch(function.name, views, grid, group, order=self.owner.order,
                                          seed=self.owner.seed, marker=self.owner.marker)
            except EmulationError as err:
                self._error = str(err)
                return
            self.owner.dispatches += 1

    def waitUntilCompleted(self) -> None:  # noqa: N802
        pass

    def error(self):
        return self._error


class _Queue:
    def __init__(self, owner: "EmulatedMetal"):
        self.owner = owner

    def commandBuffer(self) -> _CommandBuffer:  # noqa: N802
        return _CommandBuffer(self.owner)


class _Device:
    def __init__(self, owner: "EmulatedMetal"):
        self.owner = owner

    def name(self) -> str:
        return "CPU emulation of Metal (somatile.host.metal_emu)"

    def newLibraryWithSource_options_error_(self, source: str, options: _CompileOptions, error):  # noqa: N802
        if options is not None and options.fast_math:
            return None, "the stand-in refuses fast math: somatile's kernels must compile with fast math off"
        try:
            return _Library(compile_library(source, self.owner.build_dir)), None
        except EmulationError as err:
            return None, str(err)

    def newComputePipelineStateWithFunction_error_(self, function: _Function, error):  # noqa: N802
        return _Pipeline(function), None

    def newCommandQueue(self) -> _Queue:  # noqa: N802
        return _Queue(self.owner)

    def newBufferWithBytes_length_options_(self, data, length: int, options: int) -> _Buffer:  # noqa: N802
        return _Buffer(data, length)

    def newBufferWithLength_options_(self, length: int, options: int) -> _Buffer:  # noqa: N802
        return _Buffer(None, length)


class EmulatedMetal:
    """Stand-in for PyObjC's ``Metal`` module as somatile.host.metal_backend uses it; the compiled library is
    the CPU emulation of the same source. Fast math must be switched off (as the backend does)."""

    MTLResourceStorageModeShared = 0

    def __init__(self, order: str = "forward", seed: int = 0, marker: int = DEFAULT_MARKER,
                 build_dir: Path | None = None):
        self.order, self.seed, self.marker, self.build_dir = order, seed, marker, build_dir
        self.dispatches = 0
        self.MTLCompileOptions = _CompileOptions

    def MTLCreateSystemDefaultDevice(self) -> _Device:  # noqa: N802
        return _Device(self)

    @staticmethod
    def MTLSizeMake(width: int, height: int, depth: int) -> tuple[int, int, int]:  # noqa: N802
        return (width, height, depth)
