"""Decode tile: cycles per token against the ideal, tokens per second at the board clock, and simulation speed.

The ideal per token is the larger of the MAC bound ``2 * (ring + sinks) * head_dim * heads / lanes`` (scores
and the weighted sum, ``lanes`` int8 MACs per cycle) and the stream bound (command and response bytes of one
DECODE frame over the stream width). Cycles per token are measured in Verilator for the ``sim`` board and the
VCK190's 64-lane tile (all heads of the tile in one DECODE frame, the frames streamed back to back, no idle
input, no backpressure; heads of random configurations, both normalisers) and, for every board whose tile
fits, given by ``expected_decode_cycles(behind=True)`` (the formula the measurement is checked against in
tests/sim/test_regress.py and here), with its parts
(``decode_frame_phases``, one head's ``decode_phases``) in the notes: where a token's cycles go beside the
MAC bound. The throughput targets are cycles per token within ``CYCLES_TARGET`` times the ideal. The MAC bound
counts scores and weighted sum on one array of ``lanes`` MACs; the tile has one for each (ScoreStage's and
WeightedStage's multipliers), and with a head's scores beside the previous head's weighted sum
(``soma.overlapped_cycles``) a token can take fewer cycles than this bound.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from somatile import boards
from somatile.hw import regmap, tile_model
from somatile.hw.regmap import TileParams
from somatile.hw.soma import decode_phases
from somatile.hw.tile import decode_frame_phases, expected_decode_cycles
from somatile.sim import run_soma

BOARDS = ("sim", "ulx3s_85f", "icebreaker", "vck190", "vek280")
MEASURED_TOKENS = 300
CYCLES_TARGET = {"sim": 1.10, "ulx3s_85f": 1.10, "vck190": 1.5, "vek280": 1.5}
"""Cycles per token over the ideal that the tile is to reach (the tile-throughput issue): the sim and ULX3S
parameters, and the Versal boards' 64-lane tile, whose fixed per-token work weighs most."""


def target(name: str, ratio: float) -> dict:
    """The row's ``target`` and ``met`` for a board with a cycles target (none for the others)."""
    if name not in CYCLES_TARGET:
        return {}
    return {"target": f"<= {CYCLES_TARGET[name]:.2f}x", "met": ratio <= CYCLES_TARGET[name]}


def phases_note(params: TileParams, configs, behind: bool = False) -> str:
    """Where a DECODE frame's cycles go (``behind`` another DECODE frame or on its own): intake, execute, each
    distinct head step by phase, response; and one head's MAC bound (scores and weighted sum,
    ``slots * head_dim / lanes`` cycles each)."""
    frame = decode_frame_phases(params, configs, behind=behind)
    steps = {(c.normaliser, c.hccs_mode) for c in configs}
    heads = "; ".join(f"a {n}/{m} head {step_text(decode_phases(params, n, m))}" for n, m in sorted(steps))
    mac_head = params.slots * params.head_dim / params.lanes
    return (f"intake {frame['intake']}, execute {frame['execute']}, heads {frame['heads']} (each head's LOAD beside "
            f"the previous one's normaliser, its scores beside that one's weighted sum: soma.overlapped_cycles), "
            f"response {frame['respond']}; {heads}; "
            f"MAC bound per head {2 * mac_head:.0f} ({mac_head:.0f} scores + {mac_head:.0f} weighted)")


def step_text(phases: dict[str, int]) -> str:
    """One head's step: its total, then each phase's cycles."""
    return f"{sum(phases.values())} (" + ", ".join(f"{k} {v}" for k, v in phases.items()) + ")"


def ideal_cycles(params: TileParams) -> tuple[float, float]:
    """(MAC bound, stream bound) in cycles per token for all heads of one tile."""
    mac = 2 * params.slots * params.head_dim * params.heads / params.lanes
    frame_bytes = 2 * regmap.HEADER_BYTES + 4 * params.head_dim * params.heads
    return mac, frame_bytes / params.stream_bytes


def run() -> list[dict]:
    rows = []
    for name in BOARDS:
        board = boards.load(name)
        try:
            params = TileParams.from_board(board)
            regmap.check_fits(params)
        except ValueError as exc:
            rows.append({"name": f"{name}: tile does not fit", "value": 0, "unit": "", "notes": str(exc)})
            continue
        mac, stream = ideal_cycles(params)
        ideal = max(mac, stream)
        hccs_heads = [SimpleNamespace(normaliser="hccs_int", hccs_mode="div", include_self=True)] * params.heads
        cycles = expected_decode_cycles(params, hccs_heads, behind=True)
        rows.append({"name": f"{name}: cycles/token (formula, HCCS div heads, back to back), {params.heads} heads",
                     "value": cycles, "unit": "cycles", "baseline": ideal, "ratio": cycles / ideal,
                     "lower_is_better": True, **target(name, cycles / ideal),
                     "notes": f"ideal = max(MAC bound {mac:.0f}, stream bound {stream:.0f}); ratio = cycles / ideal; "
                              f"a frame on its own: {expected_decode_cycles(params, hccs_heads)} cycles; "
                              f"{phases_note(params, hccs_heads, behind=True)}"})
        rows.append({"name": f"{name}: tokens/s at {board.clock_mhz:g} MHz", "value":
                     board.clock_mhz * 1e6 / cycles, "unit": "tokens/s", "baseline": board.clock_mhz * 1e6 / ideal,
                     "ratio": ideal / cycles, "notes": "baseline = the ideal's tokens/s"})
    rows += measured("sim") + measured("vck190")  # a ULX3S tile has the sim board's parameters
    return rows


def measured(name: str) -> list[dict]:
    """Stream MEASURED_TOKENS DECODE frames back to back through the board's tile in Verilator (the C++ stream
    harness, every frame sent as soon as the tile takes it) and measure cycles per token in the steady state:
    a frame taken in while the previous one computed, counted from the previous response's last beat to its
    own (CYCLES_LAST, read after the last token, and each frame's cycles at the ports)."""
    params = TileParams.from_board(boards.load(name))
    rng = np.random.default_rng(7)
    configs = [run_soma.random_config(rng, params) for _ in range(params.heads)]
    q, k, v = run_soma.sequence(rng, MEASURED_TOKENS, params.heads, params.head_dim)
    sim = run_soma.harness_build(params)  # built outside the timing
    start = time.perf_counter()
    done = run_soma.stream_decode(params, configs, q, k, v, sim, measure_every=MEASURED_TOKENS)
    seconds = time.perf_counter() - start
    behind = done.frame_cycles[done.stimulus.behind]
    cycles = int(behind.max())
    mac, stream = ideal_cycles(params)
    period = expected_decode_cycles(params, configs, behind=True)
    return [
        {"name": f"{name}: cycles/token measured in Verilator", "value": cycles, "unit": "cycles",
         "baseline": max(mac, stream), "ratio": cycles / max(mac, stream), "lower_is_better": True,
         **target(name, cycles / max(mac, stream)),
         "notes": f"{MEASURED_TOKENS} DECODE frames streamed back to back; the {len(behind)} behind another took "
                  f"{int(behind.min())} to {cycles} cycles each (expected_decode_cycles(behind=True) = {period}; "
                  f"a frame on its own: {expected_decode_cycles(params, configs)}); responses "
                  f"{'all equal to' if done.mismatches == 0 else f'{done.mismatches} differ from'} the model's, "
                  f"cycles {'as expected' if done.cycles_ok else 'NOT as expected'}; "
                  f"{phases_note(params, configs, behind=True)}"},
        {"name": f"{name}: simulated tokens/s (Verilator stream harness wall clock)",
         "value": MEASURED_TOKENS / seconds, "unit": "tokens/s",
         "notes": f"{MEASURED_TOKENS} tokens x {params.heads} heads in {seconds:.1f} s including the stimulus and the "
                  f"comparison; {done.run.cycles / seconds:.0f} simulated cycles/s"},
    ]
