"""What the long RTL regressions share: ``somatile sim hccs --random ROWS --harness cpp`` (sim/run_hccs.py) and
``somatile sim soma --tokens N --harness cpp`` (sim/run_soma.py) run their chunks through the C++ stream
harness (sim/stream.py) on the job layer; ``make regress`` runs both (docs/regress.md says what each checks).

Here: the harness and traffic options of those commands, the traffic of a chunk (``full``: input valid and
output ready whenever the unit can move, cycles checked exactly; ``random``: seeded idle input cycles and
output backpressure, :data:`RANDOM_TRAFFIC`, cycles at least the formula's; ``mixed``: even chunks full, odd
chunks random, so one regression checks the cycle formulas and the handshakes), and the summary lines.
"""

from __future__ import annotations

import argparse

RANDOM_TRAFFIC = (0.2, 0.3)
"""(idle, backpressure) probabilities of a chunk under random traffic."""
TRAFFICS = ("full", "random", "mixed")
HARNESSES = ("cocotb", "cpp")
"""The test benches of ``somatile sim hccs --random`` and ``somatile sim soma``: cocotb, or the C++ stream harness."""
SHOWN = 10


def add_harness_arguments(parser: argparse.ArgumentParser, applies: str, cocotb_bench: str) -> None:
    """``--harness`` and ``--traffic`` of a ``somatile sim`` unit command (``applies``: the option they go
    with, e.g. "--random", or "" for the whole command; ``cocotb_bench``: the unit's cocotb test bench)."""
    when = f"{applies}: " if applies else ""
    parser.add_argument("--harness", choices=HARNESSES, default="cocotb",
                        help=f"{when}cocotb ({cocotb_bench}, Python every cycle) or cpp (the C++ stream harness of "
                             f"sim/stream.py, long runs in chunks: sim/regress.py; default cocotb)")
    parser.add_argument("--traffic", choices=TRAFFICS, default="full",
                        help=f"{when or '--harness cpp: '}no idles or backpressure (cycles checked exactly), random "
                             f"ones, or mixed (odd chunks random; default full)")


def chunk_traffic(traffic: str, index: int) -> tuple[float, float]:
    """(idle, backpressure) of chunk ``index`` under ``traffic`` (see the module docstring)."""
    if traffic not in TRAFFICS:
        raise ValueError(f"--traffic: expected one of {TRAFFICS}, got {traffic!r}")
    if traffic == "random" or (traffic == "mixed" and index % 2):
        return RANDOM_TRAFFIC
    return 0.0, 0.0


def cycles_line(chunks: list[dict]) -> str:
    """The cycle check of a regression's chunks: exact where they ran at full rate, at least that otherwise."""
    full = [c for c in chunks if c["full_rate"]]
    busy = [c for c in chunks if not c["full_rate"]]
    parts = []
    if full:
        parts.append(f"{len(full)} full-rate chunks measured {sum(c['cycles'] for c in full)}, expected "
                     f"{sum(c['expected_cycles'] for c in full)} "
                     f"({'exact' if all(c['cycles_ok'] for c in full) else 'DIFFERENT'})")
    if busy:
        parts.append(f"{len(busy)} chunks under idles/backpressure measured {sum(c['cycles'] for c in busy)} "
                     f"against at least {sum(c['expected_cycles'] for c in busy)} "
                     f"({'ok' if all(c['cycles_ok'] for c in busy) else 'FEWER'})")
    return "cycles: " + "; ".join(parts)


def speed_line(chunks: list[dict], wall_seconds: float, jobs: int, items: int, unit: str) -> str:
    """Simulated cycles per second (each chunk's ``sim_cycles``, first input beat to last output beat): in the
    simulators' cycle loops (wall clock, and CPU time where the harness measured it: on a machine shared with
    other work the two differ), and over the whole regression's wall time (stimulus, model and comparison
    included, ``jobs`` processes)."""
    cycles = sum(c["sim_cycles"] for c in chunks)
    loop = sum(c["loop_seconds"] for c in chunks)
    cpu = [c["cpu_seconds"] for c in chunks]
    on_cpu = (f", {cycles / max(sum(cpu), 1e-9):,.0f} per CPU second of them" if None not in cpu else "")
    return (f"speed: {cycles / max(loop, 1e-9):,.0f} simulated cycles/s per simulator ({loop:.1f} s in the cycle "
            f"loops{on_cpu}); {cycles / max(wall_seconds, 1e-9):,.0f} cycles/s and "
            f"{items / max(wall_seconds, 1e-9):,.0f} {unit}/s over the regression's {wall_seconds:.1f} s wall time "
            f"with {jobs} job(s)")
