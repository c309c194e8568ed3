"""Long RTL regressions: simulated cycles per second of the C++ stream harness (sim/stream.py) against the cocotb
test benches, on the same unit and in the same run: the HCCS unit of the boards (8 lanes, 2 heads, rows of 256)
and the sim board's tile (decode tokens, every head in one DECODE frame).

The harness's rate is the whole chunk's (stimulus made with numpy, the simulator process, the bulk comparison
with the model) in one process; the rate of its cycle loop alone is in the notes. The cocotb rate of the HCCS
unit is its streaming loop's (tb_hccs.py's ``loop_seconds``), that of the tile the decode run's wall clock
(process start included, as bench_tile.py measures it). Both builds happen before the timing.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from somatile import boards
from somatile.hw import tile_model
from somatile.hw.regmap import TileParams
from somatile.hw.tile import expected_decode_cycles
from somatile.sim import regress, run_hccs, run_soma

TARGET = 300_000
"""Simulated cycles per second a long regression must reach (issue 25)."""
HARNESS_ROWS = 100_000
COCOTB_ROWS = 1_000
HARNESS_TOKENS = 1_000
COCOTB_TOKENS = 100
COLS = 256


def _row(unit: str, harness_rate: float, cocotb_rate: float, notes: str) -> dict:
    return {"name": f"{unit}: simulated cycles/s, C++ stream harness (cocotb as baseline)", "value": harness_rate,
            "unit": "cycles/s", "baseline": cocotb_rate, "ratio": harness_rate / cocotb_rate,
            "target": f">= {TARGET:,} cycles/s", "met": harness_rate >= TARGET, "notes": notes}


def hccs() -> dict:
    for harness in regress.HARNESSES:  # the builds, outside the timing
        run_hccs.regression(100, cols=COLS, harness=harness)
    fast = run_hccs.regression(HARNESS_ROWS, cols=COLS, chunk=HARNESS_ROWS, seed=1, harness="cpp")
    slow = run_hccs.regression(COCOTB_ROWS, cols=COLS, seed=2, harness="cocotb")
    assert fast["mismatches"] == slow["mismatches"] == 0 and fast["cycles_ok"] and slow["cycles_ok"]
    loop = fast["chunks"][0]["loop_seconds"]
    return _row("HCCS unit", fast["cycles"] / fast["wall_seconds"], slow["cycles"] / slow["chunks"][0]["loop_seconds"],
                f"{HARNESS_ROWS:,} rows x {COLS} in {fast['wall_seconds']:.1f} s ({fast['cycles']:,} cycles, "
                f"0 mismatches, cycle-exact), cycle loop alone {fast['cycles'] / loop:,.0f} cycles/s; cocotb: "
                f"{COCOTB_ROWS:,} rows, streaming loop only")


def tile() -> dict:
    params = TileParams.from_board(boards.load("sim"))
    job = {"params": dataclasses.asdict(params), "tokens": 2, "seed": [9, 0], "measure_every": 100,
           "reference": "spec", "build": run_soma.harness_build(params), "idle": 0.0, "backpressure": 0.0}
    run_soma.decode_job(job)
    started = time.perf_counter()
    fast = run_soma.decode_job({**job, "tokens": HARNESS_TOKENS, "seed": [9, 1]})
    wall = time.perf_counter() - started
    assert fast["mismatches"] == 0 and fast["cycles_ok"]

    rng = np.random.default_rng(9)
    configs = [run_soma.random_config(rng, params) for _ in range(params.heads)]
    q, k, v = run_soma.sequence(rng, COCOTB_TOKENS, params.heads, params.head_dim)
    values = [tile_model.head_values(c) for c in configs]
    run_soma.run_decode(params, q[:2], k[:2], v[:2], values, traffic="full")
    started = time.perf_counter()
    result = run_soma.run_decode(params, q, k, v, values, traffic="full")
    seconds = time.perf_counter() - started
    assert int(result.outputs["mismatches"]) == 0
    cocotb_cycles = COCOTB_TOKENS * (expected_decode_cycles(params, configs) + run_soma.FRAME_SLICE_CYCLES)
    return _row("tile (sim board), decode", fast["sim_cycles"] / wall, cocotb_cycles / seconds,
                f"{HARNESS_TOKENS:,} tokens x {params.heads} heads in {wall:.1f} s ({fast['sim_cycles']:,} cycles, "
                f"0 mismatches, cycle-exact), cycle loop alone {fast['sim_cycles'] / fast['loop_seconds']:,.0f} "
                f"cycles/s; cocotb: {COCOTB_TOKENS} tokens, DECODE cycles / wall clock")


def run() -> list[dict]:
    return [hccs(), tile()]
