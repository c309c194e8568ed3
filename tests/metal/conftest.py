"""Fixtures of the Metal tests: the kernel libraries compiled once per session for the CPU emulator, and
the two dispatch paths (MLX, PyObjC) over the emulator's stand-ins.

The first session in a fresh checkout compiles every kernel source with g++ (a few seconds each, two at a
time); later sessions load the cached libraries from build/metal/.
"""

import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from somatile.host import metal_backend, metal_emu, metal_kernels

HERE = Path(__file__).resolve().parent


def mlx_sources():
    """The source the MLX stand-in compiles for every entry point (MLX writes one kernel per entry)."""
    mx = metal_emu.EmulatedMLX()
    seen = set()
    for family in metal_kernels.FAMILIES:
        for entry in metal_emu.parse_entry_points(metal_kernels.library_source(family)):
            # The soma family also carries the normalisers' entries; the backend dispatches those from their
            # own family.
            if entry.name in seen:
                continue
            seen.add(entry.name)
            spec = metal_kernels.mlx_spec(family, entry.name)
            kernel = mx.metal_kernel(spec.name, spec.input_names, spec.output_names, spec.source, spec.header)
            dtypes = {p.name: metal_emu.ELEMENT_DTYPES[p.element] for p in entry.buffers.values()}
            yield kernel.source_for([dtypes[n] for n in spec.input_names], [dtypes[n] for n in spec.output_names])


@pytest.fixture(scope="session")
def libraries():
    """family -> EmulatedLibrary of the complete source (the PyObjC form). The first use compiles these and
    every MLX form, two at a time, so that a fresh checkout does not compile them one by one."""
    sources = {family: metal_kernels.library_source(family) for family in metal_kernels.FAMILIES}
    sources["barrier_probe"] = (HERE / "barrier_probe.metal").read_text()
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = dict(zip(sources, pool.map(metal_emu.compile_library, sources.values())))
        list(pool.map(metal_emu.compile_library, mlx_sources()))
    return built


ON_APPLE_GPU = sys.platform == "darwin" and platform.machine() == "arm64"
EMULATOR_PLATFORM = sys.platform.startswith("linux")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        if item.get_closest_marker("metal") and not ON_APPLE_GPU:
            item.add_marker(pytest.mark.skip(reason="needs a real Apple GPU (macOS on Apple silicon); on this "
                                                    "platform the same kernels run on the CPU emulator"))
        elif not item.get_closest_marker("metal") and not EMULATOR_PLATFORM and item.path.name != "test_sources.py":
            item.add_marker(pytest.mark.skip(reason="runs on the CPU emulator, which needs Linux (ELF sections and "
                                                    "ucontext); the metal-marked tests cover this platform's GPU"))


@pytest.fixture(params=["mlx", "pyobjc", pytest.param("gpu-mlx", marks=pytest.mark.metal),
                        pytest.param("gpu-pyobjc", marks=pytest.mark.metal)])
def runner(request):
    """A dispatch path of the metal:// backend: over the CPU stand-ins (threads in a seeded random order;
    threadgroup memory starts as 0xA5 bytes, a negative int, for MLX and 0x5A, a positive one, for PyObjC, so
    that a read before the write cannot pass a max or a min by luck), or on the Apple GPU (the ``gpu-``
    parameters, marked ``metal``)."""
    if request.param.startswith("gpu-"):
        return metal_backend.make_runner(request.param.removeprefix("gpu-"))
    request.getfixturevalue("libraries")  # every build done up front, in parallel
    return metal_backend.make_runner(request.param, emulate=True, order="random", seed=7,
                                     marker=0xA5 if request.param == "mlx" else 0x5A)
