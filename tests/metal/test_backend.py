"""The metal:// backend's dispatch plumbing: availability messages, URL options, the MLX body-only form of
each entry point, and the PyObjC path's compile options, exercised through the CPU stand-ins."""

import sys

import numpy as np
import pytest

import somatile.host
from somatile.host import metal_backend, metal_emu, metal_kernels


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the message given where Metal cannot exist")
@pytest.mark.parametrize("url", ["metal://", "metal://?api=pyobjc"])
def test_metal_is_reported_unavailable_off_macos(url):
    with pytest.raises(metal_backend.MetalUnavailable, match="needs macOS on Apple silicon.*metal://\\?emulate=1"):
        somatile.host.open(url)


def test_url_options_are_checked():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['fast'\]"):
        somatile.host.open("metal://?emulate=1&fast=1")
    with pytest.raises(ValueError, match="api: expected 'mlx' or 'pyobjc', got 'cuda'"):
        somatile.host.open("metal://?emulate=1&api=cuda")


def test_mlx_kernels_are_built_once_and_reused():
    runner = metal_backend.make_runner("mlx", emulate=True)
    x = np.arange(-64, 64, dtype=np.int8).reshape(2, 64)
    for _ in range(2):
        metal_backend.hccs(runner, x, 100, 1, 20)
    assert list(runner._kernels) == [("hccs", "hccs_uint8")] and runner.mx.dispatches == 2


@pytest.mark.parametrize("family", sorted(metal_kernels.FAMILIES))
def test_every_entry_point_has_an_mlx_form(family):
    """Buffers of every entry are inputs first, then outputs (MLX's order), and the body aliases each thread
    attribute parameter to MLX's name with the right width."""
    for entry in metal_emu.parse_entry_points(metal_kernels.library_source(family)):
        spec = metal_kernels.mlx_spec(family, entry.name)
        assert len(spec.input_names) + len(spec.output_names) == len(entry.buffers)
        for p in entry.params:
            if p.attribute == "thread_position_in_grid" and not p.element.endswith("3"):
                assert f"= thread_position_in_grid.x;" in spec.source


def test_pyobjc_path_switches_fast_math_off():
    metal = metal_emu.EmulatedMetal()
    device = metal.MTLCreateSystemDefaultDevice()
    library, error = device.newLibraryWithSource_options_error_(metal_kernels.library_source("hccs"),
                                                               metal.MTLCompileOptions.new(), None)
    assert library is None and "fast math" in error
    runner = metal_backend.PyObjCRunner(metal)
    x = np.zeros((3, 40), np.int8)
    assert metal_backend.hccs(runner, x, 100, 1, 20).shape == (3, 40)
    assert metal.dispatches == 1


def test_mlx_outputs_a_kernel_leaves_unwritten_keep_the_marker():
    """The MLX stand-in starts outputs as marker bytes (MLX leaves them uninitialised), so a kernel that
    skips an element cannot pass by reading zeros."""
    mx = metal_emu.EmulatedMLX()
    kernel = mx.fast.metal_kernel(name="half_copy", input_names=["a"], output_names=["b"],
                                  source="uint i = thread_position_in_grid.x; if (i % 2 == 0) b[i] = a[i];")
    (b,) = kernel(inputs=[np.arange(8, dtype=np.int32)], output_shapes=[(8,)], output_dtypes=[mx.int32],
                  grid=(8, 1, 1), threadgroup=(8, 1, 1))
    marker = np.frombuffer(bytes([metal_emu.DEFAULT_MARKER]) * 4, np.int32)[0]
    assert np.array_equal(b[::2], [0, 2, 4, 6]) and np.all(b[1::2] == marker)
