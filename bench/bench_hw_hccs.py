"""HCCS unit in simulation: simulated cycles and rows per second (cocotb + Verilator, Icarus when installed,
Amaranth's own simulator on a small case) and elements per cycle against the L-lane ideal.

Every run is also checked bit-exact against hccs_int; a mismatch fails the benchmark rather than reporting a
speed for wrong results. Builds are made before timing starts.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time

import numpy as np

from somatile.hw.hccs import HCCS, HCCSConfig, expected_cycles
from somatile.sim import runner
from somatile.sim.run_hccs import simulate
from somatile.sim.tb_hccs import golden, make_job, pack_beats, row_beats, unpack_rows

BOARD = {"lanes": 8, "heads": 2, "n_max": 256, "out_type": "uint8"}
SMALL = {"lanes": 4, "heads": 2, "n_max": 16, "out_type": "uint8"}
PARAMS = ([127, 120], [1, 2], [60, 40])  # legal for rows of up to 256 elements


def _rows(rows: int, cols: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.integers(-128, 128, (rows, cols)).astype(np.int8), rng.integers(0, 2, rows)


def _cocotb_rows(simulator: str, rows: int, cols: int) -> list[dict]:
    x, heads = _rows(rows, cols, 1)
    runner.build(HCCS, dataclasses.asdict(HCCSConfig(**BOARD)), "hccs", simulator=simulator)
    run = simulate(x, heads, *PARAMS, modes=["div", "clb"], outs=["uint8", "uint8"], unit=BOARD,
                   simulator=simulator)
    if not run.ok:
        raise AssertionError(f"{simulator}: {len(run.mismatches)} mismatching rows: {run.mismatches[:3]}")
    config = HCCSConfig(**BOARD)
    want = expected_cycles(config, rows, cols)
    per_cycle = rows * cols / run.cycles
    label = f"{simulator}, L={config.lanes}, {rows} rows x {cols}"
    return [
        {"name": f"cocotb+{label}: simulated cycles/s", "value": run.cycles / run.loop_seconds,
         "unit": "cycles/s", "notes": "streaming loop only (cycles between first input and last output beat)"},
        {"name": f"cocotb+{label}: rows/s, whole run", "value": rows / run.wall_seconds, "unit": "rows/s",
         "notes": f"{run.wall_seconds:.1f} s including simulator start-up, head configuration and (un)packing"},
        {"name": f"{label}: elements per cycle", "value": per_cycle, "unit": "elements/cycle",
         "baseline": float(config.lanes), "ratio": per_cycle / config.lanes, "target": ">= 0.95 of L",
         "met": per_cycle >= 0.95 * config.lanes,
         "notes": f"measured {run.cycles} cycles, expected_cycles {want}"},
    ]


def _short_rows() -> dict:
    rows, cols = 1000, 40
    x, heads = _rows(rows, cols, 2)
    config = HCCSConfig(**BOARD)
    run = simulate(x, heads, *PARAMS, modes=["div", "div"], outs=["uint8", "uint8"], unit=BOARD)
    if not run.ok:
        raise AssertionError(f"short rows: {len(run.mismatches)} mismatching rows")
    want = expected_cycles(config, rows, cols)
    per_cycle = rows * cols / run.cycles
    return {"name": f"L=8, {rows} rows x {cols} (5 beats, div): elements per cycle", "value": per_cycle,
            "unit": "elements/cycle", "baseline": rows * cols / want, "ratio": run.cycles / want,
            "target": "cycles within 5 % of expected_cycles", "met": abs(run.cycles - want) <= 0.05 * want,
            "ratio_note": "measured / expected cycles",
            "notes": "rows shorter than the div reciprocal (13 cycles) run at one row per reciprocal"}


def _amaranth_sim(rows: int = 100, cols: int = 16) -> dict:
    """The same unit in amaranth.sim (pure Python), driven like the cocotb testbench."""
    from amaranth.sim import Simulator

    config = HCCSConfig(**SMALL)
    x, heads = _rows(rows, cols, 3)
    job = make_job(x, heads, *PARAMS, modes=["div", "clb"], outs=["uint8", "uint8"], lanes=config.lanes,
                   head_bits=config.head_bits, out_bits=config.out_bits)
    words = pack_beats(row_beats(job))
    dut = HCCS(config=config)
    layout_offsets = dict(zip(("B", "S", "dmax", "mode", "out"), job["cfg_offsets"]))
    cfg_words = [h + sum(int(job[k][h]) << (config.head_bits + int(off)) for k, off in layout_offsets.items())
                 for h in range(2)]
    out_words, count = [], {"cycles": 0}

    async def testbench(ctx):
        for word in cfg_words:
            ctx.set(dut.cfg.payload.as_value(), word)
            ctx.set(dut.cfg.valid, 1)
            await ctx.tick()
        ctx.set(dut.cfg.valid, 0)
        ctx.set(dut.o.ready, 1)
        sent = 0
        while len(out_words) < len(words):
            if sent < len(words):
                ctx.set(dut.i.payload.as_value(), words[sent])
                ctx.set(dut.i.valid, 1)
                if ctx.get(dut.i.ready):
                    sent += 1
            else:
                ctx.set(dut.i.valid, 0)
            if ctx.get(dut.o.valid):
                out_words.append(ctx.get(dut.o.payload.as_value()))
            await ctx.tick()
            count["cycles"] += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    started = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - started
    got, framing = unpack_rows(job, out_words)
    if framing or not np.array_equal(got, golden(job)):
        raise AssertionError("amaranth.sim: output differs from hccs_int")
    return {"name": f"amaranth.sim, L={config.lanes}, {rows} rows x {cols}: simulated cycles/s",
            "value": count["cycles"] / wall, "unit": "cycles/s",
            "notes": "pure-Python simulator, no build; includes configuration cycles"}


def run() -> list[dict]:
    load_before = os.getloadavg()[0]
    results = _cocotb_rows("verilator", 1000, 256)
    results.append(_short_rows())
    if shutil.which("iverilog"):
        results += _cocotb_rows("icarus", 200, 256)
    else:
        results[0]["notes"] += "; Icarus not measured: iverilog is not installed (Debian: apt-get install iverilog)"
    results.append(_amaranth_sim())
    # Simulation speed is CPU-bound Python: on a shared machine it scales with the free share of a core.
    results[0]["notes"] += f"; 1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    return results


if __name__ == "__main__":
    for row in run():
        print(row)
