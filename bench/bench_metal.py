"""Speed of the Metal CPU emulator (somatile.host.metal_emu) on this machine.

The emulator exists to prove the Metal kernels bit-exact on Linux, not to be fast; these rows say how much
test data a run can afford (emulated GPU threads per second) and are no statement about GPU speed, which
needs a Mac (docs/metal.md). Each kernel is compiled (or loaded from build/metal/) before timing.
"""

from __future__ import annotations

import time

import numpy as np


def _timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run() -> list[dict]:
    from somatile.host import metal_backend, metal_emu, metal_kernels
    from somatile.model import hccs, soma

    rng = np.random.default_rng(0)
    rows = []

    library = metal_emu.compile_library(metal_kernels.library_source("hccs"))
    x = rng.integers(-128, 128, (1024, 4096)).astype(np.int8)
    out = np.zeros(x.shape, np.uint8)
    threads = metal_backend.row_threads(x.shape[1])
    inputs = [x, np.ones(1, np.uint8), np.array([x.shape[1], x.shape[0], 0, 0], np.int32),
              np.array([[7, 1, 6]], np.int32), out]
    seconds = _timed(lambda: library.dispatch("hccs_uint8", inputs, (threads, x.shape[0]), (threads, 1)), 2)
    exact = bool(np.array_equal(out, hccs.hccs_int(x, 7, 1, 6)))
    rows.append({"name": "emulated GPU threads/s, HCCS uint8 div kernel, 1024 x 4096 int8",
                 "value": threads * x.shape[0] / seconds, "unit": "threads/s",
                 "notes": f"{threads} threads per row, {seconds:.2f} s per dispatch, bit-exact with the model: "
                          f"{exact}"})
    rows.append({"name": "emulated HCCS elements/s (same run)", "value": x.size / seconds, "unit": "elements/s"})

    cfg = soma.SomaConfig.preset("default", integer=True, profile="paper", n_heads=8, n_kv_heads=2, head_dim=64)
    q = rng.integers(-128, 128, (16, 8, 64)).astype(np.int8)
    k = rng.integers(-128, 128, (16, 2, 64)).astype(np.int8)
    runner = metal_backend.make_runner("pyobjc", emulate=True)
    metal_backend.soma_prefill(runner, cfg, q[:1], k[:1], k[:1])  # compile outside the timing
    seconds = _timed(lambda: metal_backend.soma_prefill(runner, cfg, q, k, k), 2)
    rows.append({"name": "emulated Soma decode step (8 heads / 2 KV heads, D 64, 4 sinks + 252 ring)",
                 "value": seconds / q.shape[0] * 1e3, "unit": "ms/token", "lower_is_better": True,
                 "notes": "PyObjC dispatch path over the CPU stand-in, one dispatch per token"})
    return rows
