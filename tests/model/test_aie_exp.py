"""aie4ml's exact-exp Softmax (model/aie_exp.py): numba against the numpy spec over random and adversarial rows,
a row worked by hand, the polynomial's error, and the constants and KQ rule of aie4ml itself."""

import math

import numpy as np
import pytest

from somatile.model import aie_exp
from somatile.model.aie_exp import aie_exp_softmax, exp_kq_from_scale, exp_term_spec, predict_aie

OUTS = ("uint8", "int16")


def both(x, kq, out):
    fast = aie_exp_softmax(x, kq, out=out, impl="numba")
    spec = aie_exp_softmax(x, kq, out=out, impl="numpy")
    assert fast.dtype == spec.dtype == np.dtype(out) and fast.shape == x.shape
    assert np.array_equal(fast, spec), f"numba != numpy spec (out={out}, kq={kq})"
    return spec


@pytest.mark.parametrize("out", OUTS)
def test_numba_equals_the_spec_on_random_rows_of_every_length_and_step(out):
    rng = np.random.default_rng(29)
    for _ in range(60):
        n = int(rng.integers(1, 300))
        heads = int(rng.integers(1, 4))
        x = rng.integers(-128, 128, (heads, int(rng.integers(1, 20)), n), dtype=np.int8)
        both(x, rng.integers(aie_exp.KQ_MIN, aie_exp.KQ_MAX + 1, heads), out)


def adversarial_rows(n=64):
    """Rows at the edges: flat, one spike over the floor, the full int8 span, every distance once, distances
    on both sides of the octave where the term vanishes."""
    rows = [np.full(n, v) for v in (-128, 0, 127)]
    spike = np.full(n, -128)
    spike[n // 2] = 127
    rows += [spike, np.where(np.arange(n) % 2, 127, -128), np.linspace(127, -128, n).round()]
    rows += [127 - (np.arange(n) * 255 // (n - 1)), np.r_[127, np.full(n - 1, 126)]]
    for kq in (1, 37, 64, 128):
        d = 4096 // kq  # z = d * kq reaches the 16th octave here
        rows.append(np.clip(127 - np.r_[0, d - 1, d, d + 1, np.arange(n - 4)], -128, 127))
    return np.stack(rows).astype(np.int8)


@pytest.mark.parametrize("kq", [1, 2, 23, 37, 64, 127, 128])
@pytest.mark.parametrize("out", OUTS)
def test_numba_equals_the_spec_on_adversarial_rows(out, kq):
    x = adversarial_rows()
    y = both(x, kq, out)
    flat = both(np.full((1, 64), 5, np.int8), kq, out)
    if out == "uint8":  # a flat row: every term 16384, inv = floor(255 * 2^15 / (64 * 16384))
        assert np.all(flat == (16384 * ((255 << 15) // (64 * 16384))) >> 15)
        assert np.all(y.sum(axis=-1, dtype=np.int64) <= 255)
    both(x[:, :1], kq, out)  # one-element rows


def test_a_row_worked_by_hand():
    # x = [0, -1], KQ = 64: z = [0, 64]; for z = 64 (f = 64): (64 * 2811) >> 8 = 702, 702 - 11004 = -10302,
    # (-10302 * 64) >> 8 = floor(-2575.5) = -2576, e = 16384 - 2576 = 13808. Sum 30192,
    # inv = floor(8355840 / 30192) = 276; (16384 * 276) >> 15 = 138, (13808 * 276) >> 15 = 116.
    assert exp_term_spec(np.array([0, 64])).tolist() == [16384, 13808]
    assert both(np.array([[0, -1]], np.int8), 64, "uint8").tolist() == [[138, 116]]
    # int16 output: inv = floor(32767 / 30192) = 1, so the output is the Q14 terms themselves.
    assert both(np.array([[0, -1]], np.int8), 64, "int16").tolist() == [[16384, 13808]]


def test_the_term_halves_per_octave_falls_monotonically_and_vanishes_at_the_16th():
    z = np.arange(0, aie_exp.MAX_DIST * aie_exp.KQ_MAX + 1)
    e = exp_term_spec(z)
    assert e[0] == aie_exp.EXP_C0 == 16384 and np.all(np.diff(e) <= 0)
    octaves = np.arange(16)
    assert np.array_equal(e[octaves * 256], 16384 >> octaves)
    assert np.all(e[16 * 256:] == 0) and e.max() <= 16384
    f = np.arange(256)
    error = np.abs(exp_term_spec(f) - 2.0 ** (-f / 256) * 16384)
    assert error.max() < 33  # the second-order fit: under 0.2 % of full scale over the fractional octave


def test_kq_follows_the_scale_and_names_the_first_bad_head():
    assert exp_kq_from_scale([0.1]).tolist() == [round(0.1 * math.log2(math.e) * 256)] == [37]
    kq = np.arange(aie_exp.KQ_MIN, aie_exp.KQ_MAX + 1)
    assert np.array_equal(exp_kq_from_scale(aie_exp.scale_from_exp_kq(kq)), kq)
    with pytest.raises(ValueError, match=r"head 2 scale 0\.5 gives KQ = 185, outside 1\.\.128"):
        exp_kq_from_scale([0.1, 0.9, 0.5], heads=[True, False, True])
    with pytest.raises(ValueError, match="head 0 scale 0.001 gives KQ = 0"):
        exp_kq_from_scale([0.001])
    with pytest.raises(ValueError, match="kq: head 1 KQ = 129 is outside 1..128"):
        aie_exp_softmax(np.zeros((2, 1, 8), np.int8), [5, 129])


def test_constants_and_the_kq_rule_are_aie4mls():
    pytest.importorskip("aie4ml", reason="the aie extra (pip install 'somatile[aie]') is not installed")
    from importlib.resources import files

    from aie4ml.op_impls.families.softmax import softmax as aie4ml_softmax

    template = (files("aie4ml") / "templates/firmware/variants/softmax/parameters.h.jinja").read_text()
    for name, value in (("EXP_A2", aie_exp.EXP_A2), ("EXP_B1", aie_exp.EXP_B1), ("EXP_C0", aie_exp.EXP_C0)):
        assert f"static constexpr int16_t {name} = {value};" in template
    assert f"static constexpr int     EXP_ZF = {aie_exp.EXP_ZF};" in template
    assert "ROUNDING   = aie::rounding_mode::floor;" in template and "saturation_mode::saturate;" in template
    assert aie4ml_softmax.EXP_ZF == aie_exp.EXP_ZF and aie4ml_softmax.EXP_KQ_MAX == aie_exp.KQ_MAX
    scales = np.geomspace(0.0015, 0.34, 2000)
    theirs = [aie4ml_softmax._exp_kq(s) for s in scales]
    assert np.array_equal(exp_kq_from_scale(scales), theirs)


# A scalar stand-in for the parts of the AIE API (aie_api/aie.hpp) and ADF (adf.h) that aie4ml's Softmax kernels
# use, written from the AIE API's documented semantics: to_vector<T>(shift) under rounding_mode::floor is an
# arithmetic right shift, saturation_mode::saturate clamps to T; vector add/sub wrap; clb counts leading zeros
# (the kernels' 31 - clb(sum) is floor(log2 sum)). shuffle_down fills with zeros, which the kernels' segmented
# reductions never read. With it, the kernel source of a generated project compiles on the host with g++.
AIE_API_SHIM = r"""
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
using int8 = int8_t; using uint8 = uint8_t; using int16 = int16_t; using int32 = int32_t;
struct acc32 {}; struct acc48 {}; struct acc64 {};
inline int clb(int32_t v) { return v == 0 ? 32 : __builtin_clz(static_cast<uint32_t>(v)); }
namespace aie {
constexpr unsigned vector_decl_align = 64;
enum class rounding_mode { floor, ceil, conv_even };
enum class saturation_mode { none, saturate, symmetric };
inline void set_rounding(rounding_mode) {}
inline void set_saturation(saturation_mode) {}
template <typename T> struct is_tag : std::false_type {};
template <> struct is_tag<acc32> : std::true_type {};
template <> struct is_tag<acc48> : std::true_type {};
template <> struct is_tag<acc64> : std::true_type {};
template <typename T, unsigned N> struct vector {
    T v[N];
    T get(unsigned i) const { return v[i]; }
    T& operator[](unsigned i) { return v[i]; }
    template <unsigned M> vector<T, M> extract(unsigned idx) const {
        vector<T, M> r; for (unsigned i = 0; i < M; ++i) r.v[i] = v[idx * M + i]; return r; }
    template <typename U> vector<U, N * sizeof(T) / sizeof(U)> cast_to() const {
        vector<U, N * sizeof(T) / sizeof(U)> r; std::memcpy(r.v, v, sizeof v); return r; }
};
template <unsigned N> struct mask { bool b[N]; };
template <typename Tag, unsigned N> struct accum {
    int64_t v[N] = {};
    accum() = default;
    template <typename T> explicit accum(const vector<T, N>& x) { from_vector(x); }
    template <typename Tag2> accum(const accum<Tag2, N>& o) { for (unsigned i = 0; i < N; ++i) v[i] = o.v[i]; }
    template <typename T> void from_vector(const vector<T, N>& x, int shift = 0) {
        for (unsigned i = 0; i < N; ++i) v[i] = static_cast<int64_t>(x.v[i]) * (int64_t(1) << shift); }
    template <typename T> vector<T, N> to_vector(int shift = 0) const {
        vector<T, N> r;
        for (unsigned i = 0; i < N; ++i) {
            int64_t s = v[i] >> shift;
            s = s < std::numeric_limits<T>::min() ? std::numeric_limits<T>::min() : s;
            r.v[i] = static_cast<T>(s > std::numeric_limits<T>::max() ? std::numeric_limits<T>::max() : s);
        }
        return r;
    }
};
template <typename T, unsigned N> vector<T, N> broadcast(T x) { vector<T, N> r; for (auto& e : r.v) e = x; return r; }
template <typename T, unsigned N> auto zeros() {
    if constexpr (is_tag<T>::value) return accum<T, N>(); else return broadcast<T, N>(T(0)); }
template <typename Tag, typename T, unsigned N> accum<Tag, N> from_vector(const vector<T, N>& x) {
    accum<Tag, N> a; a.from_vector(x); return a; }
#define SHIM_LANES(expr) vector<T, N> r; for (unsigned i = 0; i < N; ++i) r.v[i] = static_cast<T>(expr); return r;
template <typename T, unsigned N> vector<T, N> max(const vector<T, N>& a, const vector<T, N>& b) {
    SHIM_LANES(a.v[i] > b.v[i] ? a.v[i] : b.v[i]) }
template <typename T, unsigned N> vector<T, N> min(const vector<T, N>& a, const vector<T, N>& b) {
    SHIM_LANES(a.v[i] < b.v[i] ? a.v[i] : b.v[i]) }
template <typename T, unsigned N> vector<T, N> min(const vector<T, N>& a, std::type_identity_t<T> b) {
    SHIM_LANES(a.v[i] < b ? a.v[i] : b) }
template <typename T, unsigned N> vector<T, N> sub(const vector<T, N>& a, const vector<T, N>& b) { SHIM_LANES(a.v[i] - b.v[i]) }
template <typename T, unsigned N> vector<T, N> add(const vector<T, N>& a, const vector<T, N>& b) { SHIM_LANES(a.v[i] + b.v[i]) }
template <typename T, unsigned N> vector<T, N> bit_and(const vector<T, N>& a, const vector<T, N>& b) { SHIM_LANES(a.v[i] & b.v[i]) }
template <typename T, unsigned N> vector<T, N> downshift(const vector<T, N>& a, unsigned s) { SHIM_LANES(a.v[i] >> s) }
template <typename T, unsigned N> vector<T, N> shuffle_down(const vector<T, N>& a, unsigned n) {
    SHIM_LANES(i + n < N ? a.v[i + n] : 0) }
template <typename T, unsigned N> vector<T, N> select(const vector<T, N>& a, const vector<T, N>& b, const mask<N>& m) {
    SHIM_LANES(m.b[i] ? b.v[i] : a.v[i]) }
template <typename T, unsigned N> vector<T, N> transpose(const vector<T, N>& a, unsigned rows, unsigned cols) {
    SHIM_LANES(a.v[(i % rows) * cols + i / rows]) }
template <typename T, unsigned N> mask<N> ge(const vector<T, N>& a, const vector<T, N>& b) {
    mask<N> m; for (unsigned i = 0; i < N; ++i) m.b[i] = a.v[i] >= b.v[i]; return m; }
template <typename Tag, unsigned N> accum<Tag, N> add(const accum<Tag, N>& a, const accum<Tag, N>& b) {
    accum<Tag, N> r; for (unsigned i = 0; i < N; ++i) r.v[i] = a.v[i] + b.v[i]; return r; }
template <typename A, typename B, unsigned N> accum<acc64, N> mul(const vector<A, N>& a, const vector<B, N>& b) {
    accum<acc64, N> r; for (unsigned i = 0; i < N; ++i) r.v[i] = int64_t(a.v[i]) * int64_t(b.v[i]); return r; }
template <typename Tag, typename A, typename B, unsigned N>
accum<Tag, N> mac(const accum<Tag, N>& acc, const vector<A, N>& a, const vector<B, N>& b) {
    accum<Tag, N> r; for (unsigned i = 0; i < N; ++i) r.v[i] = acc.v[i] + int64_t(a.v[i]) * int64_t(b.v[i]); return r; }
template <typename T, unsigned N> T reduce_max(const vector<T, N>& a) {
    T m = a.v[0]; for (unsigned i = 1; i < N; ++i) m = a.v[i] > m ? a.v[i] : m; return m; }
template <typename T, unsigned N> T reduce_add(const vector<T, N>& a) {
    int64_t s = 0; for (unsigned i = 0; i < N; ++i) s += a.v[i]; return static_cast<T>(s); }
template <unsigned N> vector<int16, N> unpack(const vector<int8, N>& a) {
    vector<int16, N> r; for (unsigned i = 0; i < N; ++i) r.v[i] = a.v[i]; return r; }
template <unsigned N> vector<float, N> to_float(const vector<int32, N>& a, int shift) {
    vector<float, N> r; for (unsigned i = 0; i < N; ++i) r.v[i] = std::ldexp(float(a.v[i]), -shift); return r; }
template <unsigned N> vector<float, N> inv(const vector<float, N>& a) {
    vector<float, N> r; for (unsigned i = 0; i < N; ++i) r.v[i] = 1.0f / a.v[i]; return r; }
template <typename T, unsigned N> vector<T, N> to_fixed(const vector<float, N>& a, int shift) {
    vector<T, N> r; for (unsigned i = 0; i < N; ++i) r.v[i] = static_cast<T>(std::floor(std::ldexp(a.v[i], shift))); return r; }
template <typename T, unsigned N> vector<T, N> concat(const vector<T, N>& a) { return a; }
template <typename T, unsigned N, typename... Rest>
vector<T, N * (1 + sizeof...(Rest))> concat(const vector<T, N>& a, const Rest&... rest) {
    vector<T, N * (1 + sizeof...(Rest))> r; auto tail = concat(rest...);
    std::memcpy(r.v, a.v, sizeof a.v); std::memcpy(r.v + N, tail.v, sizeof tail.v); return r; }
template <unsigned N, typename T> struct reader {
    const T* p;
    vector<T, N> operator*() const { vector<T, N> r; std::memcpy(r.v, p, sizeof r.v); return r; }
    reader& operator++() { p += N; return *this; }
    reader operator++(int) { reader old = *this; p += N; return old; }
};
template <unsigned N, typename T> struct slot {
    T* p;
    slot& operator=(const vector<T, N>& v) { std::memcpy(p, v.v, sizeof v.v); return *this; }
};
template <unsigned N, typename T> struct writer {
    T* p;
    slot<N, T> operator*() const { return {p}; }
    writer& operator++() { p += N; return *this; }
    writer operator++(int) { writer old = *this; p += N; return old; }
};
template <unsigned N, typename T> reader<N, T> cbegin_vector(const T* p) { return {p}; }
template <unsigned N, typename T> writer<N, T> begin_vector(T* p) { return {p}; }
}  // namespace aie
"""
ADF_SHIM = r"""
#pragma once
namespace adf {
template <typename T> struct input_buffer { T* p; T* data() { return p; } };
template <typename T> struct output_buffer { T* p; T* data() { return p; } };
}
#define REGISTER_FUNCTION(f)
"""
# Runs head <which>'s kernel of the generated project on <calls> buffers of ROWS x COLS int8, in the kernel's
# own layout, as the ADF graph instantiates it (src/kernels/softmax/softmax_graph.h).
DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "parameters.h"
#include "softmax.cpp"
template <typename Cfg> int run(FILE* in, FILE* out, int calls) {
    using out_t = typename Cfg::output_t;
    static int8_t x[Cfg::ROWS * Cfg::COLS];
    static out_t y[Cfg::ROWS * Cfg::COLS];
    for (int c = 0; c < calls; ++c) {
        if (fread(x, 1, sizeof x, in) != sizeof x) return 1;
        adf::input_buffer<int8_t> ib{x};
        adf::output_buffer<out_t> ob{y};
        if constexpr (Cfg::APPROX_EXP) {
            if constexpr (Cfg::LAYOUT_TILED) { softmax_exp_i8_tiled<Cfg> k; k.run(ib, ob); }
            else { softmax_exp_i8<Cfg> k; k.run(ib, ob); }
        } else if constexpr (Cfg::LAYOUT_TILED) {
            softmax_i8_tiled<Cfg> k(Cfg::B[0], Cfg::S[0], Cfg::Dmax[0]); k.run(ib, ob);
        } else {
            softmax_i8<Cfg> k(Cfg::B[0], Cfg::S[0], Cfg::Dmax[0]); k.run(ib, ob);
        }
        fwrite(y, sizeof(out_t), Cfg::ROWS * Cfg::COLS, out);
    }
    return 0;
}
int main(int argc, char** argv) {
    FILE* in = fopen(argv[3], "rb");
    FILE* out = fopen(argv[4], "wb");
    const int calls = atoi(argv[2]);
    switch (atoi(argv[1])) {
CASES
    }
    return 2;
}
"""


def kernel_layout(x, cfg):
    """(calls, ROWS, COLS) row-major -> the buffer a kernel reads: rows as they are (linear), or bands of
    MICROTILE_OUTER rows cut into MICROTILE_OUTER x MICROTILE_INNER blocks, each block row-major (tiled)."""
    if not cfg["tiled"]:
        return x
    calls, rows, cols = x.shape
    mo, mi = cfg["mt_outer"], cfg["mt_inner"]
    return x.reshape(calls, rows // mo, mo, cols // mi, mi).transpose(0, 1, 3, 2, 4).reshape(x.shape)


def from_kernel_layout(y, cfg):
    if not cfg["tiled"]:
        return y
    calls, rows, cols = y.shape
    mo, mi = cfg["mt_outer"], cfg["mt_inner"]
    return y.reshape(calls, rows // mo, cols // mi, mo, mi).transpose(0, 1, 3, 2, 4).reshape(y.shape)


def structs_of(project):
    """Per head: the name of its parameters.h struct and the values the host run needs."""
    import re

    text = (project / "src" / "parameters.h").read_text()
    order = re.search(r"top_graph<([^>]*)> dut;", (project / "app.cpp").read_text()).group(1).replace(" ", "")
    names = order.split(",")
    heads = {}
    for slot, head in re.findall(r"softmax_hccs_graph<Cfg(\d+)>\s+softmax_h(\d+)_aie;",
                                 (project / "src" / "top_graph.h").read_text()):
        name = names[int(slot) - 1]
        body = re.search(rf"^struct {name} \{{\n(.*?)^\}};", text, re.M | re.S).group(1)

        def value(key):
            return re.search(rf"\b{key} = (-?\w+)[;,}}]", body).group(1)

        heads[int(head)] = {"struct": name, "rows": int(value("ROWS")), "cols": int(value("COLS")),
                            "tiled": value("LAYOUT_TILED") == "true", "mt_outer": int(value("MICROTILE_OUTER")),
                            "mt_inner": int(value("MICROTILE_INNER")), "exp": value("APPROX_EXP") == "true",
                            "kq": int(value("EXP_KQ")), "clb": value("USE_CLB") == "true"}
    return heads


@pytest.mark.parametrize("board, rows, mode", [("vck190", 16, "div"), ("vek280", 16, "clb"), ("vek280", 6, "div"),
                                               ("vck190", 8, "clb")])
def test_the_generated_kernel_source_computes_what_the_model_says(tmp_path, board, rows, mode):
    """aie4ml's softmax.cpp and parameters.h of a generated project, compiled on the host against the AIE API
    stand-in above (for the board's AI Engine generation), on random and adversarial rows, against
    hccs_int on calibrated heads and aie_exp_softmax on fallback heads."""
    import shutil
    import subprocess

    import yaml

    from somatile import boards
    from somatile.boards import aie
    from somatile.model.hccs import hccs_int

    pytest.importorskip("aie4ml", reason="the aie extra (pip install 'somatile[aie]') is not installed")
    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to compile the generated kernel source on the host"
    params_path = tmp_path / "params.yaml"
    kq_edges = [aie_exp.KQ_MIN, 23, aie_exp.KQ_MAX]
    params_path.write_text(yaml.safe_dump({
        "format": "somatile-hccs-params", "version": 1, "cols": 64, "mode": mode, "out": "uint8",
        "B": [255, 511, 64] + [255] * 3, "S": [6, 1, 0] + [6] * 3, "dmax": [40, 127, 0] + [40] * 3,
        "fallback": [False, False, False, True, True, True],
        "scale": [0.1, 0.1, 0.1] + [float(s) for s in aie_exp.scale_from_exp_kq(kq_edges)],
        "fallback_exp": "aie4ml"}))
    cfg = boards.load(board)
    project = tmp_path / "project"
    aie.generate(cfg, project, params_path, rows)
    params = aie.load_params(params_path)
    heads = structs_of(project)
    shim = tmp_path / "shim"
    (shim / "aie_api").mkdir(parents=True)
    (shim / "aie_api" / "aie.hpp").write_text(AIE_API_SHIM)
    (shim / "adf.h").write_text(ADF_SHIM)
    cases = "\n".join(f"    case {h}: return run<{c['struct']}>(in, out, calls);" for h, c in heads.items())
    (tmp_path / "driver.cpp").write_text(DRIVER.replace("CASES", cases))
    arch = {"AIE": 10, "AIE-ML": 20}[cfg.aie["generation"]]
    binary = tmp_path / "kernels"
    subprocess.run([compiler, "-std=c++20", "-O1", f"-D__AIE_ARCH__={arch}", f"-I{shim}", f"-I{project / 'src'}",
                    f"-I{project / 'src' / 'kernels' / 'softmax'}", str(tmp_path / "driver.cpp"), "-o", str(binary)],
                   check=True, capture_output=True, text=True)
    rng = np.random.default_rng(rows)
    for h, c in heads.items():
        assert c["rows"] * c["cols"] > 0 and c["cols"] == params.cols
        assert c["exp"] == params.fallback[h] and (c["kq"] == kq_edges[h - 3] if c["exp"] else c["clb"] == (mode == "clb"))
        special = adversarial_rows(params.cols)
        x = np.concatenate([special, rng.integers(-128, 128, (4 * c["rows"], params.cols), dtype=np.int8)])
        x = x[: len(x) // c["rows"] * c["rows"]].reshape(-1, c["rows"], params.cols)
        (tmp_path / "x.bin").write_bytes(np.ascontiguousarray(kernel_layout(x, c)).tobytes())
        subprocess.run([str(binary), str(h), str(len(x)), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")],
                       check=True)
        y = from_kernel_layout(np.fromfile(tmp_path / "y.bin", np.uint8).reshape(x.shape), c)
        flat = x.reshape(-1, params.cols)
        if c["exp"]:
            want = aie_exp_softmax(flat, c["kq"])
        else:
            want = hccs_int(flat, params.B[h], params.S[h], params.dmax[h], mode=mode)
        assert np.array_equal(y.reshape(-1, params.cols), want), f"head {h} ({c['struct']}, tiled={c['tiled']})"


def hybrid_params(**over):
    from somatile.model.params import HccsParams

    base = dict(B=np.array([255, 200, 255]), S=np.array([6, 2, 6]), dmax=np.array([40, 90, 40]),
                fallback=np.array([False, True, True]), scale=np.array([0.1, 0.05, 0.2]), cols=64,
                fallback_exp="aie4ml")
    return HccsParams(**(base | over))


def test_params_with_aie4mls_exp_run_it_on_fallback_heads_and_round_trip(tmp_path, rng):
    from somatile.model import intexp
    from somatile.model.hccs import hccs_int
    from somatile.model.params import HccsParams

    p = hybrid_params()
    x = rng.integers(-128, 128, (3, 50, 64), dtype=np.int8)
    y = p.apply_int(x)
    assert np.array_equal(y[0], hccs_int(x[0], 255, 6, 40))
    for h in (1, 2):
        assert np.array_equal(y[h], aie_exp_softmax(x[h], exp_kq_from_scale(p.scale[h])))
    assert np.array_equal(p.apply_int(x, impl="numpy"), y)
    assert np.array_equal(predict_aie(p, x), y)
    somatile = hybrid_params(fallback_exp="somatile").apply_int(x)
    assert np.array_equal(somatile[1], intexp.intexp_softmax(x[1], intexp.exp_mult_from_scale(0.05)))
    assert not np.array_equal(somatile[1:], y[1:])  # the two integer exps differ
    p.to_yaml(tmp_path / "p.yaml")
    assert "fallback_exp: aie4ml" in (tmp_path / "p.yaml").read_text()
    q = HccsParams.from_yaml(tmp_path / "p.yaml")
    assert q.fallback_exp == "aie4ml" and np.array_equal(q.apply_int(x), y)
    assert HccsParams.from_dict({k: v for k, v in p.to_dict().items() if k != "fallback_exp"}).fallback_exp == \
        "somatile"
    with pytest.raises(ValueError, match="params: key 'fallback_exp': 'somatile'"):
        predict_aie(hybrid_params(fallback_exp="somatile"), x)
    mask = np.ones(x.shape, bool)
    mask[0, :, 60:] = False  # a mask on a calibrated head is HCCS's business
    assert np.array_equal(p.apply_int(x, mask)[1:], y[1:])
    mask[2, 3, 0] = False
    with pytest.raises(ValueError, match="mask: fallback_exp 'aie4ml': the exact-exp kernel has no mask"):
        p.apply_int(x, mask)


@pytest.mark.parametrize("over, message", [
    ({"fallback_exp": "intexp"}, r"fallback_exp: expected one of \['somatile', 'aie4ml'\], got 'intexp'"),
    ({"fallback_exp": 1}, "key 'fallback_exp': expected a string, got 1"),
    ({"scale": [0.1, 0.05, 0.5]}, "scale: head 2 scale 0.5 gives KQ = 185, outside 1..128"),
    ({"profile": "wide", "B": [4096] * 3, "S": [256] * 3, "dmax": [4096] * 3},
     "fallback_exp: 'aie4ml' needs profile 'paper'"),
])
def test_the_fallback_exp_key_is_validated_naming_the_file_and_key(tmp_path, over, message):
    import yaml

    from somatile.model.params import HccsParams

    d = hybrid_params().to_dict() | over
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(ValueError, match=message) as info:
        HccsParams.from_yaml(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
    # A fallback scale aie4ml's exp cannot take is fine for somatile's exp on a calibrated head.
    if "scale" in over:
        assert hybrid_params(fallback=np.array([False, True, False]), scale=np.array(over["scale"])).heads == 3
