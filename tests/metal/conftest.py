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


@pytest.fixture(scope="session")
def libraries():
    """family -> EmulatedLibrary of the complete source (the PyObjC form), compiled in parallel."""
    if not EMULATOR_PLATFORM:
        pytest.skip("the CPU emulator needs Linux (ELF sections and ucontext)")
    sources = {family: metal_kernels.library_source(family) for family in metal_kernels.FAMILIES}
    sources["barrier_probe"] = (HERE / "barrier_probe.metal").read_text()
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = dict(zip(sources, pool.map(metal_emu.compile_library, sources.values())))
    return built


ON_APPLE_GPU = sys.platform == "darwin" and platform.machine() == "arm64"
EMULATOR_PLATFORM = sys.platform.startswith("linux")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("metal") and item.path.is_relative_to(HERE) and not ON_APPLE_GPU:
            item.add_marker(pytest.mark.skip(reason="needs a real Apple GPU (macOS on Apple silicon); on this "
                                                    "platform the same kernels run on the CPU emulator"))


@pytest.fixture(params=["mlx", "pyobjc", pytest.param("gpu-mlx", marks=pytest.mark.metal),
                        pytest.param("gpu-pyobjc", marks=pytest.mark.metal)])
def runner(request):
    """A dispatch path of the metal:// backend: over the CPU stand-ins (threads in a seeded random order;
    threadgroup memory starts as 0xA5 bytes, a negative int, for MLX and 0x5A, a positive one, for PyObjC, so
    that a read before the write cannot pass a max or a min by luck), or on the Apple GPU (the ``gpu-``
    parameters, marked ``metal``)."""
    if request.param.startswith("gpu-"):
        return metal_backend.make_runner(request.param.removeprefix("gpu-"))
    if not EMULATOR_PLATFORM:
        pytest.skip("the CPU emulator needs Linux (ELF sections and ucontext); the metal-marked tests cover this "
                    "platform's GPU")
    return metal_backend.make_runner(request.param, emulate=True, order="random", seed=7,
                                     marker=0xA5 if request.param == "mlx" else 0x5A)
