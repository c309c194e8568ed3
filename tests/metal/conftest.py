"""Fixtures of the Metal tests: the kernel libraries compiled once per session for the CPU emulator, and
the two dispatch paths (MLX, PyObjC) over the emulator's stand-ins.

The first session in a fresh checkout compiles every kernel source with g++ (a few seconds each, two at a
time); later sessions load the cached libraries from build/metal/.
"""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from somatile.host import metal_backend, metal_emu, metal_kernels

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def libraries():
    """family -> EmulatedLibrary of the complete source (the PyObjC form), compiled in parallel."""
    sources = {family: metal_kernels.library_source(family) for family in metal_kernels.FAMILIES}
    sources["barrier_probe"] = (HERE / "barrier_probe.metal").read_text()
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = dict(zip(sources, pool.map(metal_emu.compile_library, sources.values())))
    return built


@pytest.fixture(params=["mlx", "pyobjc"])
def runner(request):
    """A dispatch path of the metal:// backend over the CPU stand-in, threads in a seeded random order."""
    return metal_backend.make_runner(request.param, emulate=True, order="random", seed=7)
