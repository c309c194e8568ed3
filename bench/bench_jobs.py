"""The job layer (somatile.eval.jobs, issue 27): wall time of a small but real `somatile eval` run serially
(``--jobs 1``) and in two processes (``--jobs 2``), side by side in the same run, and the speed-up.

Four evaluations: two small subsets of what `make eval` runs, MiniLM (its six layer calibrations, then 64
sentences x 11 variants in chunks of 16 sentences) and SmolLM2 (window x variant jobs on the first 6,000
characters), whose serial parts (process start, reading the weights, calibration: about 6 s of SmolLM2's 20)
bound their speed-up, and two whose serial part is a small share of the run, as in `make eval`: its first
command as it stands (MiniLM on its full protocol, about 80 s serially) and SmolLM2 on make eval's protocol
over the first 10,000 characters with four variants. Each command runs as `make eval` runs it (a fresh
`somatile` process with one BLAS thread, so the process pool's start-up and the model loads are inside the
timing), and the two runs must give the same numbers. The target is issue 27's: at least 1.6x on a 2-core
machine. The load average before and after each pair is in the row's notes: other work on the machine takes
cores from the parallel run, so the ratio is only meaningful read with it. The notes also give the CPU seconds
of both runs (this process's children and the pool's workers): twice the serial CPU time over the parallel one
bounds the speed-up two otherwise idle cores would give.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.6
EVALS = [  # (model, what the options select, options)
    ("minilm", "subset", ["--sentences", "64", "--calibration-sentences", "16", "--chunk", "16"]),
    ("smollm2", "subset", ["--chars", "6000", "--window", "128", "--long-window", "0", "--calibration-tokens", "96",
                           "--only", "default", "int_hccs"]),
    ("minilm", "as `make eval` runs it", []),
    # make eval's SmolLM2 protocol (512-token windows, 2,048-token long windows, 512 calibration tokens) on a
    # quarter of its text and four of its variants: the same serial part as make eval's and jobs (short and long
    # windows) of the same sizes, in a small fraction of its time.
    ("smollm2", "`make eval`'s protocol on 10,000 characters", ["--chars", "10000", "--only", "default", "hccs",
                                                               "int_hccs", "wide_exp"]),
]


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _numbers(value):
    """``value`` without the wall-clock fields (``seconds``: each window's own timing)."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items() if k != "seconds"}
    return [_numbers(v) for v in value] if isinstance(value, list) else value


def _cpu_seconds() -> float:
    """User + system seconds of this process's finished children (and theirs: the pool's workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(model: str, options: list[str], jobs: int, out: Path) -> tuple[float, float, dict]:
    cpu = _cpu_seconds()
    command = [str(Path(sys.executable).parent / "somatile"), "eval", model, *options, "--jobs", str(jobs),
               "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)  # one BLAS thread: somatile eval sets it (eval/jobs.py)
    seconds = time.perf_counter() - started
    results = json.loads((out / "results.json").read_text())
    return seconds, _cpu_seconds() - cpu, _numbers(results["variants"])


def _row(model: str, what: str, options: list[str], tmp: Path) -> dict:
    before = _uptime()
    serial, serial_cpu, numbers = _timed(model, options, 1, tmp / f"{model}-{len(options)}-serial")
    parallel, parallel_cpu, same = _timed(model, options, 2, tmp / f"{model}-{len(options)}-jobs2")
    after = _uptime()
    assert same == numbers, f"somatile eval {model}: --jobs 2 gave other numbers than --jobs 1"
    ratio = serial / parallel
    return {"name": f"somatile eval {model} ({what}): wall time with --jobs 2 (--jobs 1 as baseline)",
            "value": parallel, "unit": "s", "baseline": serial, "ratio": ratio,
            "ratio_note": "baseline / value (the speed-up)", "lower_is_better": True,
            "target": f">= {TARGET}x on 2 cores", "met": ratio >= TARGET,
            "notes": f"`somatile eval {model} {' '.join(options)}`, same numbers both ways; "
                     f"CPU time {serial_cpu:.1f} s serial, {parallel_cpu:.1f} s with --jobs 2 (workers forked from "
                     f"the process that loaded the models, somatile.eval.jobs.start_method; with two idle cores "
                     f"the speed-up could reach "
                     f"{2 * serial_cpu / parallel_cpu:.2f}x); {os.cpu_count()} cores; before: {before}; after: {after}"}


# Untimed first: numba compiles a kernel on its first use after its source changed and caches it on disk, so
# without a warm-up the first (serial) run alone would pay those compiles (seconds per kernel) and inflate the
# speed-up. Quick runs of every model and variant timed below load or compile each kernel once.
WARM_UP = [("minilm", ["--quick"]),
           ("smollm2", ["--quick", "--only", "default", "hccs", "int_hccs", "wide_exp"])]


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench_jobs") as tmp:
        for model, options in WARM_UP:
            _timed(model, options, 1, Path(tmp) / f"warm-up-{model}")
        return [_row(model, what, options, Path(tmp)) for model, what, options in EVALS]


if __name__ == "__main__":
    for row in run():
        print(json.dumps(row, indent=2))
