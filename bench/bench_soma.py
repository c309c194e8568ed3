"""Soma benchmarks: O(1) integer decode (position 128 vs 65,536), numba vs the numpy spec, and a float
decode step against full causal attention over the same history at 4K, 16K and 64K tokens.

Configuration: SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head_dim 64) with the
``default`` preset (4 sinks + 252 ring slots). The state at position 65,536 is built through
``SomaState.from_arrays`` (random ring and sink contents, counters of that position): a step does the same
work from any state of the same shape, and building it by 65,536 real steps would only cost time.
Single-threaded numba (the kernels are not parallel) and single-threaded BLAS for the numpy baselines: on
this shared 2-core machine a threaded OpenBLAS turns a 30 us matrix-vector product into 20 ms whenever the
other core is busy. Times are medians over repeated steps.
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
import time

import numpy as np

from somatile.model.soma import SomaConfig, SomaState, prefill
from somatile.eval.soma_demo import interleaved_step_us

SHAPE = dict(n_heads=9, n_kv_heads=3, head_dim=64)


def _median_step_seconds(cfg, state, tokens, impl="numba") -> float:
    return interleaved_step_us(cfg, [state], tokens, impl=impl)[0] / 1e6


def _int_tokens(rng, cfg, n):
    return [(rng.integers(-128, 128, (cfg.n_heads, cfg.head_dim), dtype=np.int8),
             rng.integers(-128, 128, (cfg.n_kv_heads, cfg.head_dim), dtype=np.int8),
             rng.integers(-128, 128, (cfg.n_kv_heads, cfg.head_dim), dtype=np.int8)) for _ in range(n)]


def _state_at(cfg, rng, position: int, dtype=np.float32) -> SomaState:
    arrays = SomaState.empty(cfg, dtype).to_arrays()
    for name in SomaState.ARRAYS:
        a = arrays[name]
        arrays[name] = (rng.integers(-128, 128, a.shape).astype(a.dtype) if cfg.integer
                        else rng.standard_normal(a.shape).astype(a.dtype))
    arrays.update(write_pos=np.array((position - cfg.sinks) % cfg.ring, np.int32),
                  fill=np.array(min(cfg.ring, position - cfg.sinks), np.int32), step=np.array(position, np.int32))
    return SomaState.from_arrays(cfg, arrays, dtype)


def integer_rows(rng, profile: str = "paper", normaliser: str = "hccs_int") -> list[dict]:
    cfg = SomaConfig.preset("default", integer=True, profile=profile, normaliser=normaliser, **SHAPE)
    warm = _int_tokens(rng, cfg, 150)
    _, early = prefill(cfg, *(np.stack(x) for x in zip(*warm[:128])))
    late = _state_at(cfg, rng, 65536)
    tokens = _int_tokens(rng, cfg, 300)
    _median_step_seconds(cfg, early.copy(), tokens[:5])  # compile outside the timing
    t_early, t_late = (t / 1e6 for t in interleaved_step_us(cfg, [early, late], tokens))
    t_spec = _median_step_seconds(cfg, _state_at(cfg, rng, 65536), tokens[:60], impl="numpy")
    ratio = t_late / t_early
    label = "" if profile == "paper" else f", profile {profile} {normaliser}"
    speed = dict(target=">= 8x", met=t_spec / t_late >= 8.0) if profile == "wide" else {}
    return [
        dict(name=f"integer decode step at position 65,536 vs 128 (numba){label}", value=t_late * 1e6, unit="us",
             baseline=t_early * 1e6, ratio=ratio, target="<= 1.1", met=ratio <= 1.1, lower_is_better=True,
             notes=f"{cfg.n_heads} heads, {cfg.n_kv_heads} KV heads, head_dim {cfg.head_dim}, "
                   f"{cfg.sinks} sinks + {cfg.ring} ring, {normaliser}" + (" div" if profile == "paper" else "")),
        dict(name=f"integer decode step numba vs numpy spec{label}", value=t_late * 1e6, unit="us",
             baseline=t_spec * 1e6, ratio=t_spec / t_late, ratio_note="speed-up: numpy spec time / numba time",
             lower_is_better=True, **speed),
    ]


def integer_vs_float_row(rng) -> dict:
    """The integer decode step (paper profile, HCCS) against the numpy float32 Soma step of the same shape
    at position 65,536, the two stepped in turn token by token (target, issue 25: >= 6x)."""
    from somatile.model.soma import decode_step
    int_cfg = SomaConfig.preset("default", integer=True, profile="paper", normaliser="hccs_int", **SHAPE)
    float_cfg = SomaConfig.preset("default", **SHAPE)
    int_state, float_state = _state_at(int_cfg, rng, 65536), _state_at(float_cfg, rng, 65536)
    int_tokens = _int_tokens(rng, int_cfg, 200)
    float_tokens = [tuple(a.astype(np.float32) / 64 for a in tok) for tok in int_tokens]
    for tok_i, tok_f in zip(int_tokens[:5], float_tokens[:5]):  # compile outside the timing
        decode_step(int_cfg, int_state, *tok_i)
        decode_step(float_cfg, float_state, *tok_f)
    times = {"int": [], "float": []}
    for tok_i, tok_f in zip(int_tokens, float_tokens):
        for name, cfg, state, tok in (("int", int_cfg, int_state, tok_i), ("float", float_cfg, float_state, tok_f)):
            t0 = time.perf_counter()
            decode_step(cfg, state, *tok)
            times[name].append(time.perf_counter() - t0)
    t_int, t_float = (statistics.median(times[n]) * 1e6 for n in ("int", "float"))
    return dict(name="integer decode step (numba) vs numpy float32 Soma step, position 65,536", value=t_int,
                unit="us", baseline=t_float, ratio=t_float / t_int, ratio_note="speed-up: float time / integer time",
                target=">= 6x", met=t_float / t_int >= 6.0, lower_is_better=True,
                notes="paper profile, HCCS div; the two steps alternate token by token")


def full_attention_step(q, k_cache, v_cache):
    """One query (H, D) over a full float32 KV cache (Hkv, n, D): standard causal attention's last row,
    one BLAS matrix product per KV head (the fastest of matmul/einsum variants measured here)."""
    H, D = q.shape
    group = H // k_cache.shape[0]
    out = np.empty_like(q)
    for c in range(k_cache.shape[0]):
        qg = q[c * group:(c + 1) * group]
        logits = (k_cache[c] @ np.ascontiguousarray(qg.T)) / np.float32(np.sqrt(D))
        w = np.exp(logits - logits.max(axis=0))
        w /= w.sum(axis=0)
        out[c * group:(c + 1) * group] = w.T @ v_cache[c]
    return out


def float_rows(rng) -> list[dict]:
    cfg = SomaConfig.preset("default", **SHAPE)
    rows = []
    for n in (4096, 16384, 65536):
        k_cache = rng.standard_normal((cfg.n_kv_heads, n, cfg.head_dim)).astype(np.float32)
        v_cache = rng.standard_normal((cfg.n_kv_heads, n, cfg.head_dim)).astype(np.float32)
        tokens = [(rng.standard_normal((cfg.n_heads, cfg.head_dim)).astype(np.float32),
                   rng.standard_normal((cfg.n_kv_heads, cfg.head_dim)).astype(np.float32),
                   rng.standard_normal((cfg.n_kv_heads, cfg.head_dim)).astype(np.float32)) for _ in range(30)]
        t_soma = _median_step_seconds(cfg, _state_at(cfg, rng, n), tokens)
        times = []
        for q, _, _ in tokens[:10]:
            t0 = time.perf_counter()
            full_attention_step(q, k_cache, v_cache)
            times.append(time.perf_counter() - t0)
        t_full = statistics.median(times)
        rows.append(dict(name=f"float decode step, Soma vs full causal attention over {n} tokens",
                         value=t_soma * 1e6, unit="us", baseline=t_full * 1e6, ratio=t_full / t_soma,
                         ratio_note="speed-up: full attention time / Soma time", lower_is_better=True,
                         notes="numpy float32, one token, same q; full attention reads the whole KV history"))
    return rows


def _openblas_threads(count: int | None) -> int | None:
    """Set the thread count of numpy's bundled OpenBLAS (None: leave it); returns the previous count, or
    None where numpy carries no such library."""
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*"))
    if not libs:
        return None
    lib = ctypes.CDLL(libs[0])
    if not hasattr(lib, "scipy_openblas_set_num_threads64_"):
        return None
    previous = lib.scipy_openblas_get_num_threads64_()
    if count is not None:
        lib.scipy_openblas_set_num_threads64_(count)
    return previous


def run() -> list[dict]:
    rng = np.random.default_rng(2026)
    previous = _openblas_threads(1)
    try:
        return (integer_rows(rng) + [integer_vs_float_row(rng)] + integer_rows(rng, "wide", "exp_int")
                + integer_rows(rng, "wide", "pwl2_int") + float_rows(rng))
    finally:
        if previous is not None:
            _openblas_threads(previous)


if __name__ == "__main__":
    for row in run():
        print(row)
