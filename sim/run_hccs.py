"""Run the HCCS unit in RTL simulation on int8 logits and check it against the model: library and CLI.

``somatile sim hccs --vectors FILE.npz [--lanes L] [--mode div|clb] [--out uint8|int16] [--waves]``
``somatile sim hccs --profile wide --vectors FILE.npz [--normaliser exp|hccs|pwl2] [--lanes L]``: the wide
profile's unit (hw/wide.py) on int16 logits, checked against ``somatile.model.wide.wide_softmax``.
``somatile sim hccs --random ROWS [--cols N] [--heads H] [--chunk C] [--jobs J | --cluster ADDRESS] [--seed S]
[--harness cocotb|cpp] [--traffic full|random|mixed]``
FILE holds ``x`` int8 (H, R, N), ``B``, ``S``, ``dmax`` integers (H,) and optionally ``mask`` bool (H, R, N)
(True = the element takes part). Row r of head h enters the unit as head h, heads one after another, back
to back. The command prints the rows that differ from ``hccs_int`` and the measured against the expected
cycle count, and exits 1 on any mismatch or framing error (2 on a bad file).

``--random`` is the long regression: ROWS seeded rows (:func:`regression_rows`: uniform, peaked, constant,
extreme and padded rows) in chunks of C, each chunk one simulation, run through the job layer
(``somatile.eval.jobs``: in process, ``--jobs`` processes, or a Dask scheduler); every chunk checks its
rows against the model and its cycles against ``expected_cycles``. The summary is the same however the
chunks ran. ``--harness cpp`` runs the chunks through the C++ stream harness of sim/stream.py
(:func:`harness_build`, :func:`simulate_harness`: no Python per cycle, docs/regress.md) instead of cocotb, and
``--traffic`` gives them idles and backpressure (``somatile.sim.regress.chunk_traffic``).

:func:`simulate` is the one code path behind the command, the tests, the benchmark and :func:`demo`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from somatile.sim import regress, stream

TOPLEVEL = "hccs"
TEST_MODULE = "somatile.sim.tb_hccs"
WIDE_TOPLEVEL = "wide_normaliser"
WIDE_TEST_MODULE = "somatile.sim.tb_wide"


@dataclasses.dataclass(frozen=True)
class HCCSRun:
    """Outcome of one simulation: outputs, model outputs, mismatch lines and cycle counts. ``wall_seconds``
    covers the whole run (simulator start-up included), ``loop_seconds`` only the cycles of streaming."""
    out: np.ndarray
    expected: np.ndarray
    mismatches: list[str]
    framing_errors: list[str]
    status: dict[str, int]
    cycles: int
    wall_seconds: float
    loop_seconds: float
    waves: Path | None
    cpu_seconds: float | None = None
    """CPU time of the streaming loop (the C++ stream harness reports it; on a loaded machine it is less than
    ``loop_seconds``)."""

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.framing_errors


def check_rows(config, x: np.ndarray, heads: np.ndarray) -> None:
    """ValueError unless rows ``x`` (R, N) with head ids ``heads`` fit the row unit's ``config``."""
    if np.asarray(heads).max(initial=0) >= config.heads:
        raise ValueError(f"heads: rows name head {int(np.max(heads))} but the unit has {config.heads} heads")
    if x.shape[-1] > config.n_max:
        raise ValueError(f"x: rows of {x.shape[-1]} elements exceed the unit's n_max = {config.n_max}")


def run_rows(unit_class, config, toplevel: str, test_module: str, testcase: str, job: dict, expected: np.ndarray,
             waves: bool, simulator: str | None) -> HCCSRun:
    """Run a rows job through ``unit_class(**config)`` in the cocotb test ``testcase`` and compare its rows with
    ``expected`` (the model's): the shared end of :func:`simulate` and :func:`simulate_wide`."""
    from somatile.sim import runner
    from somatile.sim.tb_hccs import mismatches

    started = time.perf_counter()
    result = runner.build_and_test(unit_class, dataclasses.asdict(config), toplevel, test_module, testcase,
                                   inputs=job, waves=waves, simulator=simulator)
    wall = time.perf_counter() - started
    out = result.outputs["out"]
    status = dict(zip(("overflow", "framing", "bad_head"), result.outputs["status"].tolist()))
    return HCCSRun(out, expected, mismatches(job, out, expected), list(result.outputs["framing_errors"]),
                   status, int(result.outputs["cycles"]), wall, float(result.outputs["loop_seconds"]), result.waves)


def simulate(x: np.ndarray, heads: np.ndarray, B, S, dmax, *, modes, outs, mask=None, unit: dict,
             idle: float = 0.0, backpressure: float = 0.0, seed: int = 0, strict: bool = False,
             waves: bool = False, allow_zero_floor: bool = False, simulator: str | None = None) -> HCCSRun:
    """Run rows ``x`` int8 (R, N) with head ids ``heads`` (R,) through ``HCCS(**unit)``.

    B, S, dmax, modes, outs: per head (the unit's ``heads`` entries). ``strict`` makes the cocotb test itself
    fail on the first mismatch (a :class:`somatile.sim.runner.SimulationFailure`); otherwise the mismatches
    come back in :attr:`HCCSRun.mismatches`. ``cycles`` counts from the first input beat accepted to the last
    output beat taken; with ``idle = backpressure = 0`` it is comparable to ``expected_cycles``.
    """
    from somatile.hw.hccs import HCCS, HCCSConfig
    from somatile.sim.tb_hccs import golden, make_job

    config = HCCSConfig(**unit)
    check_rows(config, x, heads)
    job = make_job(x, heads, B, S, dmax, modes=modes, outs=outs, mask=mask, lanes=config.lanes,
                   head_bits=config.head_bits, out_bits=config.out_bits, idle=idle, backpressure=backpressure,
                   seed=seed, strict=strict, allow_zero_floor=allow_zero_floor)
    return run_rows(HCCS, config, TOPLEVEL, TEST_MODULE, "hccs_rows", job, golden(job), waves, simulator)


def simulate_wide(x: np.ndarray, heads: np.ndarray, normalisers, B, S, dmax, *, mask=None, unit: dict,
                  idle: float = 0.0, backpressure: float = 0.0, seed: int = 0, strict: bool = False,
                  waves: bool = False, simulator: str | None = None) -> HCCSRun:
    """:func:`simulate` for the wide profile's unit (hw/wide.py ``WideNormaliser(**unit)``): rows ``x`` int16
    (R, N), per head a normaliser ("exp", "hccs", "pwl2") and B, S, dmax (``somatile.model.wide``)."""
    from somatile.hw.wide import WideConfig, WideNormaliser
    from somatile.model import wide
    from somatile.sim.tb_wide import golden, make_job

    config = WideConfig(**unit)
    check_rows(config, x, heads)
    for h, name in enumerate(normalisers):
        wide.check_params(name, B[h], S[h], dmax[h], 1)
    job = make_job(x, heads, normalisers, B, S, dmax, mask=mask, lanes=config.lanes, head_bits=config.head_bits,
                   idle=idle, backpressure=backpressure, seed=seed, strict=strict)
    return run_rows(WideNormaliser, config, WIDE_TOPLEVEL, WIDE_TEST_MODULE, "wide_rows", job, golden(job), waves,
                    simulator)


def harness_build(unit: dict) -> stream.StreamBuild:
    """The HCCS unit ``HCCS(**unit)`` in the stream harness (``cfg`` as the setup stream, ``status`` reported)."""
    from somatile.hw.hccs import HCCS

    return stream.build(HCCS, unit, TOPLEVEL, input=stream.amaranth_stream("i"),
                        output=stream.amaranth_stream("o"), setup=stream.amaranth_stream("cfg"), report=("status",))


def framing_errors(sent: dict[str, np.ndarray], got: dict[str, np.ndarray], beats_per_row: int) -> list[str]:
    """One line per output beat whose framing fields (mask, first, last, head) differ from its input beat's."""
    if len(got["first"]) != len(sent["first"]):
        return [f"expected {len(sent['first'])} output beats, got {len(got['first'])}"]
    lines = []
    for field in ("mask", "first", "last", "head"):
        want = stream.bits_value(sent[field]) if field == "mask" else np.asarray(sent[field]).astype(np.int64)
        wrong = np.flatnonzero(got[field] != want)
        lines += [f"beat {k} (row {k // beats_per_row}): {field} {got[field][k]} expected {want[k]}"
                  for k in wrong[:regress.SHOWN]]
    return lines


def simulate_harness(sim: stream.StreamBuild, x: np.ndarray, heads: np.ndarray, B, S, dmax, *, modes, outs, mask=None,
                  unit: dict, idle: float = 0.0, backpressure: float = 0.0, seed: int = 0,
                  allow_zero_floor: bool = False, expected: np.ndarray | None = None):
    """:func:`simulate` through the stream harness ``sim`` (from :func:`harness_build` of the same ``unit``);
    returns an :class:`HCCSRun`. ``expected`` (default: ``hccs_int`` of the rows) is what the
    outputs are compared with; its mismatch lines name the row index in ``x``."""
    from somatile.hw.hccs import HCCSConfig, in_beat_layout, out_beat_layout
    from somatile.sim import tb_hccs

    started = time.perf_counter()
    config = HCCSConfig(**unit)
    check_rows(config, x, heads)
    job = tb_hccs.make_job(x, heads, B, S, dmax, modes=modes, outs=outs, mask=mask, lanes=config.lanes,
                           head_bits=config.head_bits, out_bits=config.out_bits, strict=False,
                           allow_zero_floor=allow_zero_floor)
    sent = tb_hccs.row_beats(job)
    beats = sim.records(sim.input, {"i__payload": stream.pack(stream.payload_fields(in_beat_layout(config)), sent)})
    setup = sim.records(sim.setup, {"cfg__payload": np.array([tb_hccs.pack_cfg(job, h) for h in range(len(B))])})
    result = stream.run(sim, beats, len(beats), setup=setup, idle=idle, stall=backpressure, seed=seed)
    out_fields = stream.payload_fields(out_beat_layout(config))
    got = stream.unpack(out_fields, sim.fields(sim.output, result.out)["o__payload"])
    rows, n = x.shape
    beats_per_row = -(-n // config.lanes)
    framing = framing_errors(sent, got, beats_per_row)
    out = (np.zeros((rows, n), np.int32) if framing and len(got["data"]) != len(beats) else
           got["data"].reshape(rows, -1)[:, :n].astype(np.int32))
    expected = tb_hccs.golden(job) if expected is None else expected
    status = {name: (result.report["status"] >> bit) & 1
              for bit, name in enumerate(("overflow", "framing", "bad_head"))}
    return HCCSRun(out, expected, tb_hccs.mismatches(job, out, expected), framing, status, result.cycles,
                   time.perf_counter() - started, result.seconds, None, result.cpu_seconds)


def load_vectors(path: str | Path, profile: str = "paper") -> dict[str, np.ndarray]:
    """Read and check a vectors file; errors name the file, the key and what was expected."""
    path = Path(path)
    try:
        with np.load(path) as data:
            vectors = dict(data)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read as .npz ({exc})") from None
    for key in ("x", "B", "S", "dmax"):
        if key not in vectors:
            raise ValueError(f"{path}: key '{key}' is missing (expected x {'int16' if profile == 'wide' else 'int8'} "
                             f"(H, R, N), B, S, dmax (H,), optional mask bool (H, R, N))")
    x = vectors["x"]
    logit = np.dtype(np.int16 if profile == "wide" else np.int8)
    if x.dtype != logit or x.ndim != 3 or 0 in x.shape:
        raise ValueError(f"{path}: 'x' must be {logit} of shape (H, R, N) with no empty axis (profile {profile}), "
                         f"got {x.dtype} {x.shape}")
    for key in ("B", "S", "dmax"):
        value = vectors[key]
        if value.dtype.kind not in "iu" or value.shape != (x.shape[0],):
            raise ValueError(f"{path}: '{key}' must be integers of shape ({x.shape[0]},), got {value.dtype} "
                             f"{value.shape}")
    if "mask" in vectors:
        mask = vectors["mask"]
        if mask.dtype != np.bool_ or mask.shape != x.shape:
            raise ValueError(f"{path}: 'mask' must be bool of shape {x.shape}, got {mask.dtype} {mask.shape}")
    return vectors


def run_vectors(vectors: dict[str, np.ndarray], *, lanes: int, mode: str, out: str, waves: bool = False,
                allow_zero_floor: bool = False) -> tuple[HCCSRun, int]:
    """Simulate a checked vectors dict (see :func:`load_vectors`); return the run and the expected cycles."""
    from somatile.hw.hccs import HCCSConfig, expected_cycles
    from somatile.model.hccs import check_params

    x3 = vectors["x"]
    heads, rows, n = x3.shape
    check_params(vectors["B"], vectors["S"], vectors["dmax"], n, heads, allow_zero_floor=allow_zero_floor)
    unit = {"lanes": lanes, "heads": heads, "n_max": -(-n // lanes) * lanes, "out_type": out}
    mask = vectors.get("mask")
    run = simulate(x3.reshape(heads * rows, n), np.repeat(np.arange(heads), rows), vectors["B"], vectors["S"],
                   vectors["dmax"], modes=[mode] * heads, outs=[out] * heads,
                   mask=None if mask is None else mask.reshape(heads * rows, n), unit=unit, waves=waves,
                   allow_zero_floor=allow_zero_floor)
    return run, expected_cycles(HCCSConfig(**unit), heads * rows, n, mode=mode, out=out)


def run_wide_vectors(vectors: dict[str, np.ndarray], *, lanes: int, normaliser: str,
                     waves: bool = False) -> tuple[HCCSRun, int]:
    """Simulate a checked wide-profile vectors dict (x int16) through the wide unit with ``normaliser`` for
    every head; return the run and the expected cycles."""
    from somatile.hw.wide import WideConfig, expected_cycles

    x3 = vectors["x"]
    heads, rows, n = x3.shape
    unit = {"lanes": lanes, "heads": heads, "n_max": -(-n // lanes) * lanes}
    mask = vectors.get("mask")
    run = simulate_wide(x3.reshape(heads * rows, n), np.repeat(np.arange(heads), rows), [normaliser] * heads,
                        vectors["B"], vectors["S"], vectors["dmax"],
                        mask=None if mask is None else mask.reshape(heads * rows, n), unit=unit, waves=waves)
    return run, expected_cycles(WideConfig(**unit), heads * rows, n)


def report(run: HCCSRun, expected_cycles: int, rows: int, *, shown: int = 10, file=None) -> int:
    """Print mismatches and cycle counts (to ``file``, default stdout); return the process exit code (0 only
    when bit-exact)."""
    file = sys.stdout if file is None else file
    for line in run.mismatches[:shown] + run.framing_errors[:shown]:
        print("MISMATCH " + line, file=file)
    hidden = len(run.mismatches) + len(run.framing_errors) - 2 * shown
    if hidden > 0:
        print(f"... and {hidden} more", file=file)
    print(f"rows: {rows}, mismatching rows: {len(run.mismatches)}, framing errors: {len(run.framing_errors)}",
          file=file)
    print(f"cycles: measured {run.cycles}, expected {expected_cycles} "
          f"({run.cycles / expected_cycles:.3f}x), {run.wall_seconds:.1f} s wall", file=file)
    if run.waves:
        print(f"waves: {run.waves}", file=file)
    return 0 if run.ok else 1


def regression_rows(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` int8 rows of ``cols`` and their masks: a fifth each uniform, peaked (one large value over a
    low background), constant, at the int8 extremes, and uniform with a padded tail (the mask's False)."""
    kind = rng.integers(0, 5, rows)
    x = rng.integers(-128, 128, (rows, cols)).astype(np.int8)
    peaked = kind == 1
    x[peaked] = rng.integers(-128, -96, (int(peaked.sum()), cols)).astype(np.int8)
    x[peaked, rng.integers(0, cols, int(peaked.sum()))] = 127
    constant = kind == 2
    x[constant] = rng.integers(-128, 128, (int(constant.sum()), 1)).astype(np.int8)
    extreme = kind == 3
    x[extreme] = rng.choice(np.array([-128, 127], np.int8), (int(extreme.sum()), cols))
    mask = np.ones((rows, cols), bool)
    padded = np.flatnonzero(kind == 4)
    for r, keep in zip(padded, rng.integers(1, cols + 1, len(padded))):
        mask[r, keep:] = False
    return x, mask


def regression_unit(cols: int, heads: int, lanes: int, out: str) -> dict:
    """The HCCS unit of a ``--random`` regression: rows of ``cols`` fill ``n_max`` up to the lanes."""
    return {"lanes": lanes, "heads": heads, "n_max": -(-cols // lanes) * lanes, "out_type": out}


def regression_job(job: dict) -> dict:
    """One chunk of ``--random`` (a job of somatile.eval.jobs, in any process): its rows made from its seed,
    simulated (cocotb, or the C++ stream harness ``job["build"]``) under the chunk's idles and backpressure
    and checked; returns counts only (the rows are remade where needed from the seed). The cycles must equal
    ``expected_cycles`` in a chunk without idles and backpressure and may only exceed it otherwise."""
    from somatile.hw.hccs import HCCSConfig, expected_cycles

    rng = np.random.default_rng(job["seed"])
    heads, cols = job["heads"], job["cols"]
    x, mask = regression_rows(rng, job["rows"], cols)
    head_of_row = np.arange(job["rows"]) % heads
    unit = regression_unit(cols, heads, job["lanes"], job["out"])
    args = (x, head_of_row, job["B"], job["S"], job["dmax"])
    options = dict(modes=[job["mode"]] * heads, outs=[job["out"]] * heads, mask=mask, unit=unit, idle=job["idle"],
                   backpressure=job["backpressure"], seed=job["seed"][-1])
    if job["build"] is None:
        run = simulate(*args, **options)
    else:
        run = simulate_harness(job["build"], *args, **options)
    expected = expected_cycles(HCCSConfig(**unit), job["rows"], cols, mode=job["mode"], out=job["out"])
    full_rate = job["idle"] == job["backpressure"] == 0
    return {"rows": job["rows"], "mismatches": len(run.mismatches), "framing": len(run.framing_errors),
            "first": (run.mismatches + run.framing_errors)[:3], "cycles": run.cycles, "sim_cycles": run.cycles,
            "expected_cycles": expected,
            "cycles_ok": run.cycles == expected if full_rate else run.cycles >= expected, "full_rate": full_rate,
            "status": run.status, "seconds": run.wall_seconds, "loop_seconds": run.loop_seconds,
            "cpu_seconds": run.cpu_seconds}


def regression(rows: int, *, cols: int = 256, heads: int = 2, lanes: int = 8, mode: str = "div",
               out: str = "uint8", chunk: int = 20000, seed: int = 0, n_jobs: int | None = 1,
               cluster: str | None = None, harness: str = "cocotb", traffic: str = "full") -> dict:
    """``rows`` seeded rows through the HCCS unit in chunks (see the module docstring); returns the totals and
    the per-chunk results in chunk order. The per-head parameters are calibrated once on rows of another
    seed, so every chunk uses the same ones. ``harness``: "cocotb" (sim/tb_hccs.py) or "cpp" (the C++ stream
    harness of sim/stream.py, built here once for every chunk); ``traffic``: see
    :func:`somatile.sim.regress.chunk_traffic`."""
    from somatile.eval import jobs as joblayer
    from somatile.model import calibrate, hccs

    if rows < 1 or chunk < 1:
        raise ValueError(f"--random {rows} --chunk {chunk}: expected positive row and chunk counts")
    if harness not in regress.HARNESSES:
        raise ValueError(f"--harness: expected one of {regress.HARNESSES}, got {harness!r}")
    calib_x, calib_mask = regression_rows(np.random.default_rng([seed, 1 << 20]), 512, cols)
    logits = np.where(calib_mask, calib_x.astype(np.float32) / 16.0, -np.inf)
    params = calibrate.calibrate_params(np.repeat(logits[None], heads, 0), np.repeat(calib_mask[None], heads, 0),
                                        mode=mode)
    hccs.check_params(params.B, params.S, params.dmax, cols, heads)
    build = harness_build(regression_unit(cols, heads, lanes, out)) if harness == "cpp" else None
    starts = range(0, rows, chunk)
    work = [{"rows": min(chunk, rows - a), "cols": cols, "heads": heads, "lanes": lanes, "mode": mode, "out": out,
             "seed": [seed, i], "B": params.B.tolist(), "S": params.S.tolist(), "dmax": params.dmax.tolist(),
             "build": build, **dict(zip(("idle", "backpressure"), regress.chunk_traffic(traffic, i)))}
            for i, a in enumerate(starts)]
    started = time.perf_counter()
    results = joblayer.run(regression_job, work, n_jobs=n_jobs, cluster=cluster,
                           labels=[f"rows {a}..{a + w['rows'] - 1}" for a, w in zip(starts, work)],
                           desc="hccs regression")
    wall = time.perf_counter() - started
    total = {k: sum(r[k] for r in results) for k in ("rows", "mismatches", "framing", "cycles", "expected_cycles")}
    first = [f"rows {a}..: {line}" for a, r in zip(starts, results) for line in r["first"]][:10]
    return {**total, "chunks": results, "first": first, "cycles_ok": all(r["cycles_ok"] for r in results),
            "status_ok": not any(v for r in results for v in r["status"].values()), "wall_seconds": wall}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--vectors", metavar="FILE.npz",
                        help="x int8 (H, R, N); B, S, dmax (H,); optional mask bool (H, R, N)")
    source.add_argument("--random", type=int, metavar="ROWS",
                        help="the long regression: ROWS seeded rows in chunks, on the job layer")
    parser.add_argument("--cols", type=int, default=256, help="--random: elements per row (default 256)")
    parser.add_argument("--heads", type=int, default=2, help="--random: heads the rows cycle through (default 2)")
    parser.add_argument("--chunk", type=int, default=20000, help="--random: rows per simulation (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="--random: seed of the rows (default 0)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="--random: chunks run in this many processes (default 1; each is a simulator)")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="--random: run the chunks on a Dask distributed scheduler, e.g. tcp://HOST:8786")
    regress.add_harness_arguments(parser, "--random", "sim/tb_hccs.py")
    parser.add_argument("--profile", choices=("paper", "wide"), default="paper",
                        help="integer profile (docs/numerics.md): paper (the HCCS unit, int8 logits) or wide (the "
                             "wide unit of hw/wide.py, int16 logits, Q15 out; --vectors only)")
    parser.add_argument("--normaliser", choices=("exp", "hccs", "pwl2"), default="pwl2",
                        help="--profile wide: the normaliser of every head (default pwl2)")
    parser.add_argument("--lanes", type=int, default=None, choices=(1, 2, 4, 8, 16, 32),
                        help="lanes per beat (default 8 for paper, 4 for wide)")
    parser.add_argument("--mode", choices=("div", "clb"), default="div", help="normalisation (default div)")
    parser.add_argument("--out", choices=("uint8", "int16"), default="uint8", help="output type (default uint8)")
    parser.add_argument("--allow-zero-floor", action="store_true",
                        help="accept the seed's single-c form (B - S*dmax = 0), as hccs_int does")
    parser.add_argument("--waves", action="store_true", help="write a VCD of the run and print its path")


def run_regression(args: argparse.Namespace) -> int:
    try:
        result = regression(args.random, cols=args.cols, heads=args.heads, lanes=args.lanes, mode=args.mode,
                            out=args.out, chunk=args.chunk, seed=args.seed, n_jobs=args.jobs, cluster=args.cluster,
                            harness=args.harness, traffic=args.traffic)
    except ValueError as exc:
        print(f"somatile sim hccs: {exc}", file=sys.stderr)
        return 2
    for line in result["first"]:
        print("MISMATCH " + line)
    print(f"rows: {result['rows']} in {len(result['chunks'])} chunks ({args.harness} harness, {args.traffic} "
          f"traffic), mismatching rows: {result['mismatches']}, framing errors: {result['framing']}, "
          f"sticky status bits: {'none' if result['status_ok'] else 'SET'}")
    print(regress.cycles_line(result["chunks"]))
    print(regress.speed_line(result["chunks"], result["wall_seconds"], args.jobs, result["rows"], "rows"))
    ok = result["mismatches"] == result["framing"] == 0 and result["cycles_ok"] and result["status_ok"]
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    if args.lanes is None:
        args.lanes = 4 if args.profile == "wide" else 8
    if args.random is not None:
        if args.profile == "wide":
            print("somatile sim hccs: --random runs the paper profile's unit; give --vectors for --profile wide",
                  file=sys.stderr)
            return 2
        return run_regression(args)
    try:
        vectors = load_vectors(args.vectors, args.profile)
        if args.profile == "wide":
            sim, expected = run_wide_vectors(vectors, lanes=args.lanes, normaliser=args.normaliser, waves=args.waves)
        else:
            sim, expected = run_vectors(vectors, lanes=args.lanes, mode=args.mode, out=args.out, waves=args.waves,
                                        allow_zero_floor=args.allow_zero_floor)
    except ValueError as exc:
        print(f"somatile sim hccs: {exc}", file=sys.stderr)
        return 2
    heads, rows, _ = vectors["x"].shape
    return report(sim, expected, heads * rows)


def demo(rows: int = 500, cols: int = 256, heads: int = 2, lanes: int = 8, mode: str = "div", seed: int = 0,
         file=None) -> int:
    """Calibrate HCCS on seeded attention-like logits, run the quantised rows through the RTL unit in
    Verilator and print mismatches (expected: none) and cycles. Returns the exit code (0 when bit-exact).
    The defaults give the boards' default unit (8 lanes, 2 heads, n_max 256), the build the tests use."""
    from somatile.model import calibrate, quant, synth

    file = sys.stdout if file is None else file
    logits, mask, kinds = synth.synthetic_logits(heads=heads, rows=rows, cols=cols, peaked=heads // 2,
                                                 padding=True, seed=seed)
    params = calibrate.calibrate_params(logits, mask, mode=mode)
    x = quant.quantize_logits(logits, params.scale, mask)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calibrated_logits.npz"
        np.savez(path, x=x, mask=mask, B=params.B, S=params.S, dmax=params.dmax)
        print(f"HCCS unit in Verilator: {heads} heads ({', '.join(kinds)}), {rows} rows x {cols} calibrated int8 "
              f"logits, {lanes} lanes, {mode}", file=file)
        sim, expected = run_vectors(load_vectors(path), lanes=lanes, mode=mode, out="uint8")
    return report(sim, expected, heads * rows, file=file)
