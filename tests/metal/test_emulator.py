"""The CPU emulation of Metal itself: barriers, simd reductions, thread orders, marker bytes, signatures."""

import numpy as np
import pytest

from somatile.host import metal_emu

ORDERS = tuple(metal_emu.THREAD_ORDERS)


def mirror(library, entry, order, threads=64, groups=3, seed=0):
    x = np.arange(threads * groups, dtype=np.int32) * 7 - 100
    out = np.zeros_like(x)
    library.dispatch(entry, [x, out], (threads * groups,), (threads,), order=order, seed=seed)
    return x, out


@pytest.mark.parametrize("order", ORDERS)
def test_mirror_with_barrier_is_exact_in_every_order(libraries, order):
    x, out = mirror(libraries["barrier_probe"], "mirror_ok", order)
    assert np.array_equal(out, x.reshape(3, 64)[:, ::-1].reshape(-1))


@pytest.mark.parametrize("order", ORDERS)
def test_missing_barrier_is_caught_in_every_order(libraries, order):
    x, out = mirror(libraries["barrier_probe"], "mirror_missing_barrier", order, seed=3)
    expected = x.reshape(3, 64)[:, ::-1].reshape(-1)
    assert not np.array_equal(out, expected)
    # Forward order: the first half of each threadgroup reads mirrors that have not stored yet (marker bytes).
    if order == "forward":
        marker_word = np.frombuffer(bytes([metal_emu.DEFAULT_MARKER]) * 4, np.int32)[0]
        assert np.all(out.reshape(3, 64)[:, :32] == marker_word)


def test_marker_byte_is_configurable(libraries):
    x = np.arange(64, dtype=np.int32)
    out = np.zeros_like(x)
    libraries["barrier_probe"].dispatch("mirror_missing_barrier", [x, out], (64,), (64,), marker=0)
    assert np.all(out[:32] == 0) and np.array_equal(out[32:], x[31::-1])


def test_barrier_reached_by_some_threads_is_an_error_not_a_hang(libraries):
    x = np.arange(64, dtype=np.int32)
    with pytest.raises(metal_emu.EmulationError, match="deadlock.*32 at threadgroup_barrier, 32 returned"):
        libraries["barrier_probe"].dispatch("barrier_in_branch", [x, np.zeros_like(x)], (64,), (64,))


@pytest.mark.parametrize("order", ORDERS)
def test_simd_reductions_fold_each_simdgroup(libraries, rng, order):
    x = rng.integers(-1000, 1000, 96).astype(np.int32)
    y = rng.standard_normal(96).astype(np.float32)
    out, out_float = np.zeros(9, np.int32), np.zeros(3, np.float32)
    libraries["barrier_probe"].dispatch("simd_reductions", [x, y, out, out_float], (96,), (96,), order=order,
                                        seed=11)
    groups = x.reshape(3, 32)
    assert np.array_equal(out.reshape(3, 3), np.stack([groups.sum(1), groups.max(1), groups.min(1)], axis=1))
    # Float sums fold in lane order here; a GPU may associate differently: 1e-5 relative covers 32 terms.
    np.testing.assert_allclose(out_float, y.reshape(3, 32).sum(1, dtype=np.float64), rtol=1e-5, atol=1e-5)


def test_partial_threadgroups_at_the_grid_edge(libraries):
    x = np.arange(100, dtype=np.int32)
    out = np.full(100, -1, np.int32)
    libraries["barrier_probe"].dispatch("barrier_in_branch", [x, out], (100,), (1,))
    assert np.array_equal(out, x)


def test_a_write_outside_a_buffer_is_reported(libraries):
    out = np.zeros(16, np.int32)
    with pytest.raises(metal_emu.EmulationError, match=r"wrote outside buffer 0 \(out, 64 bytes\)"):
        libraries["barrier_probe"].dispatch("write_past_end", [out], (16,), (16,))
    inside = np.zeros(17, np.int32)
    libraries["barrier_probe"].dispatch("write_past_end", [inside], (16,), (16,))
    assert np.array_equal(inside, np.concatenate([[0], np.arange(16)]))


def test_buffer_checks_name_the_buffer(libraries):
    lib = libraries["barrier_probe"]
    x = np.arange(64, dtype=np.int32)
    with pytest.raises(metal_emu.EmulationError, match=r"buffer 1 \(out\) is int\*, expected dtype int32"):
        lib.dispatch("mirror_ok", [x, np.zeros(64, np.int16)], (64,), (64,))
    with pytest.raises(metal_emu.EmulationError, match="expects buffers at indices"):
        lib.dispatch("mirror_ok", [x], (64,), (64,))
    with pytest.raises(metal_emu.EmulationError, match="no kernel named"):
        lib.dispatch("nope", [x, x], (64,), (64,))
    with pytest.raises(metal_emu.EmulationError, match="threadgroup size must be 1..1024"):
        lib.dispatch("mirror_ok", [x, np.zeros_like(x)], (2048,), (2048,))


def test_signature_parsing():
    source = """
    kernel void f(const device char* x [[buffer(0)]], constant int& n [[buffer(1)]],
                  device short* y [[buffer(2)]], uint3 g [[threadgroup_position_in_grid]], // comment (
                  ushort lane [[thread_index_in_simdgroup]]) {}
    """
    (entry,) = metal_emu.parse_entry_points(source)
    assert [(p.name, p.attribute, p.index, p.element) for p in entry.params] == [
        ("x", "buffer", 0, "char"), ("n", "buffer", 1, "int"), ("y", "buffer", 2, "short"),
        ("g", "threadgroup_position_in_grid", None, "uint3"), ("lane", "thread_index_in_simdgroup", None, "ushort")]
    assert entry.params[1].is_reference
    with pytest.raises(metal_emu.EmulationError, match=r"\[\[texture\]\], which the emulator does not provide"):
        metal_emu.parse_entry_points("kernel void g(texture2d<float> t [[texture(0)]]) {}")


def test_compile_error_names_the_source(tmp_path):
    with pytest.raises(metal_emu.EmulationError, match=r"g\+\+ could not compile the Metal source .*kernels.cpp"):
        metal_emu.compile_library("kernel void broken(device int* x [[buffer(0)]]) { x[0] = undeclared; }",
                                  tmp_path)
