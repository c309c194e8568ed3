"""``somatile sim soma``: a seeded decode sequence through the tile RTL in Verilator, checked bit-exact
against the integer Soma model; reports mismatches, cycles per token and state bytes.

    somatile sim soma --tokens 1000 [--heads 2] [--ring 16] [--board sim] [--profile paper|wide] [--waves]
    somatile sim soma --tokens 100000 --harness cpp [--chunk 5000] [--jobs 2] [--traffic full|random|mixed]

The second form is the long regression through the C++ stream harness (sim/regress.py): chunks of seeded
heads and tokens on the job layer, every response checked in bulk, the cycles of every DECODE frame against
the formula.

Exit code 0 only when every output element matches the model and the measured cycles equal the formula
(``expected_decode_cycles``: of a frame on its own in the first form, whose testbench waits for each
response; of every frame, on its own or behind another DECODE frame, in the second). The helpers
:func:`random_config` and :func:`sequence` are shared with the tests and the benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from somatile.hw.regmap import TileParams
from somatile.sim import regress, stream

TOPLEVEL = "somatile_tile"


def random_config(rng: np.random.Generator, params: TileParams, *, normaliser: str | None = None,
                  gating: str | None = None, include_self: bool | None = None, field_source: str | None = None):
    """A one-head integer SomaConfig for the tile's geometry and profile with random options and scales (every
    choice left at None is drawn), derived from a float config by ``soma_int.integer_config``. The wide
    profile draws among its three normalisers and keeps 8 more output bits (a finer output scale)."""
    from somatile.model import soma, soma_int

    wide = params.profile == "wide"
    gating = gating or str(rng.choice(soma.GATINGS))
    field_source = "values" if gating == "query" else (field_source or str(rng.choice(soma.FIELD_SOURCES)))
    base = soma.SomaConfig(
        n_heads=1, head_dim=params.head_dim, ring=params.ring, sinks=params.sinks, profile=params.profile,
        include_self=bool(rng.integers(2)) if include_self is None else include_self,
        field_source=field_source, gating=gating, alpha=float(rng.uniform(0.0, 0.6)),
        recency=float(rng.choice([0.0, 0.1, 0.3])), gamma=float(rng.uniform(0.8, 0.99)),
        normaliser=normaliser or str(rng.choice(soma.PROFILE_NORMALISERS[params.profile])),
        hccs_mode=str(rng.choice(soma.HCCS_MODES)), hccs_c=float(rng.uniform(2.0, 8.0)),
        logit_scale=float(rng.uniform(0.05, 0.2)))
    scale = float(rng.uniform(1 / 64, 1 / 16))
    out_scale = rng.uniform(1 / 512, 1 / 128) if wide else rng.uniform(1 / 64, 1 / 16)
    return soma_int.integer_config(base, q_scale=scale, k_scale=scale, v_scale=scale, out_scale=float(out_scale))


def sequence(rng: np.random.Generator, tokens: int, heads: int, head_dim: int):
    """Seeded int8 q, k, v (tokens, heads, head_dim): mostly moderate values, some at the int8 limits."""
    def draw():
        x = np.clip(np.rint(rng.normal(0, 40, (tokens, heads, head_dim))), -128, 127)
        extreme = rng.random(x.shape) < 0.02
        x[extreme] = rng.choice([-128, 127], int(extreme.sum()))
        return x.astype(np.int8)

    return draw(), draw(), draw()


def run_decode(params: TileParams, q, k, v, head_values, initial_states=None, *, measure=(), traffic="random",
               seed: int = 1, waves: bool = False):
    """Build the tile for ``params`` and run :mod:`somatile.sim.tb_soma` on the sequence; returns the
    runner's SimResult (outputs ``out``, ``cycles``, ``mismatches``). Raises SimulationFailure on a mismatch."""
    from somatile.hw.tile import Tile
    from somatile.sim import runner, tb_soma

    return runner.build_and_test(Tile, dataclasses.asdict(params), TOPLEVEL, "somatile.sim.tb_soma",
                                 inputs=tb_soma.job(params, q, k, v, head_values, initial_states,
                                                    measure=measure, traffic=traffic, seed=seed),
                                 waves=waves)


def harness_build(params: TileParams) -> stream.StreamBuild:
    """The tile ``Tile(**params)`` (a TileParams) in the stream harness, its ``error`` output reported."""
    from somatile.hw.tile import Tile

    return stream.build(Tile, dataclasses.asdict(params), TOPLEVEL, input=stream.axis_stream("s_axis"),
                        output=stream.axis_stream("m_axis"), report=("error",))


@dataclasses.dataclass(frozen=True)
class DecodeStimulus:
    """The frames of a decode chunk in stream order, what answers them, and which frames are which."""
    frames: list[bytes]
    responses: list[bytes]
    decode_frames: np.ndarray
    """Index in ``frames`` of each token's DECODE frame."""
    cycle_reads: np.ndarray
    """Index in ``frames`` of each REG_READ of CYCLES_LAST."""
    behind: np.ndarray
    """Per token: its DECODE frame follows another DECODE frame (``expected_decode_cycles``'s ``behind``)."""
    expected_cycles: np.ndarray
    """Per REG_READ of CYCLES_LAST: ``expected_decode_cycles`` of the token before it (at full rate)."""
    least_cycles: np.ndarray
    """Per REG_READ of CYCLES_LAST, the least it may read under idles and backpressure: a frame on its own
    ``expected_decode_cycles``; behind a DECODE frame its response's cycles (``decode_frame_phases``
    "respond"), since the response may have waited behind the previous one while its heads computed."""
    frame_cycles: np.ndarray
    """Per token, its DECODE frame's cycles at the ports at full rate (see :func:`port_frame_cycles`)."""
    frame_least: np.ndarray
    """Per token, the least its DECODE frame's cycles at the ports may be (as ``least_cycles``)."""


def decode_stimulus(params, configs, q, k, v, *, measure_every: int, reference: str = "spec") -> DecodeStimulus:
    """CONFIGURE_HEAD of every head, then per token one DECODE frame of all heads (q, k, v int8 (T, H, D)), a
    REG_READ of CYCLES_LAST after every ``measure_every``-th token and after the last. ``reference``: "spec"
    answers each DECODE with the integer model's outputs (sim/tb_soma.py ``reference``, every token at once);
    "emu" with the golden tile model (hw/tile_model.py, frame by frame). A CYCLES_LAST read is answered with
    ``expected_decode_cycles`` of the token before it (the model has no clock): ``behind`` when that token's
    frame follows another DECODE frame, so that the tile took it in while the previous token computed."""
    from somatile.hw import regmap, tile_model
    from somatile.hw.regmap import ErrorCode, Opcode
    from somatile.hw.tile import decode_frame_phases, expected_decode_cycles
    from somatile.sim import tb_soma

    values = [tile_model.head_values(c) for c in configs]
    cycles = {b: expected_decode_cycles(params, configs, behind=b) for b in (False, True)}
    tokens, heads = q.shape[:2]
    cycles_read = tile_model.reg_read_frame("CYCLES_LAST")
    frames = [tile_model.configure_frame(h, values[h]) for h in range(heads)]
    decode_frames, cycle_reads, behind = [], [], []
    for t in range(tokens):
        behind.append(t > 0 and decode_frames[-1] == len(frames) - 1)
        decode_frames.append(len(frames))
        frames.append(tile_model.decode_frame(0, q[t], k[t], v[t]))
        if (t + 1) % measure_every == 0 or t == tokens - 1:
            cycle_reads.append(len(frames))
            frames.append(cycles_read)
    read_behind = np.asarray([behind[decode_frames.index(i - 1)] for i in cycle_reads], bool)
    read_cycles = [cycles[b] for b in read_behind]
    read_responses = {i: regmap.pack_response(Opcode.REG_READ, 0, ErrorCode.OK, b"", c)
                      for i, c in zip(cycle_reads, read_cycles)}
    if reference == "emu":
        model = tile_model.TileModel(params)
        responses = [model.command(frame) for frame in frames]
        responses = [read_responses.get(i, r) for i, r in enumerate(responses)]
    elif reference == "spec":
        states = np.zeros((heads, regmap.state_bytes(params)), np.uint8)
        out = tb_soma.reference(params, q, k, v, values, states).reshape(tokens, -1)
        responses = [regmap.pack_response(Opcode.CONFIGURE_HEAD, h, ErrorCode.OK) for h in range(heads)]
        for t in range(tokens):
            responses.append(regmap.pack_response(Opcode.DECODE, 0, ErrorCode.OK, out[t].tobytes()))
            if len(responses) in read_responses:
                responses.append(read_responses[len(responses)])
    else:
        raise ValueError(f"reference: expected 'spec' or 'emu', got {reference!r}")
    behind = np.asarray(behind, bool)
    respond = decode_frame_phases(params, configs)["respond"]
    frame_cycles = np.where(behind, cycles[True], cycles[False] + FRAME_SLICE_CYCLES)
    frame_least = np.where(behind, respond, cycles[False] + FRAME_SLICE_CYCLES)
    return DecodeStimulus(frames, responses, np.asarray(decode_frames), np.asarray(cycle_reads), behind,
                          np.asarray(read_cycles, np.int64), np.where(read_behind, respond, cycles[False]),
                          frame_cycles, frame_least)


def port_frame_cycles(stimulus: DecodeStimulus, in_cycles, out_cycles, first_beats, response_ends) -> np.ndarray:
    """Each DECODE frame's cycles at the stream ports, as CYCLES_LAST counts them inside: to its response's
    last beat taken, from its first header beat taken (a frame on its own: CYCLES_LAST + FRAME_SLICE_CYCLES,
    since the output register slice presents the last beat a cycle after CYCLES_LAST stops) or, behind a
    DECODE frame, from the previous response's last beat (CYCLES_LAST: the slice delays both ends)."""
    decode = stimulus.decode_frames
    end = out_cycles[response_ends[decode]]
    previous_end = out_cycles[response_ends[np.maximum(decode - 1, 0)]]
    return np.where(stimulus.behind, end - previous_end, end - in_cycles[first_beats[decode]] + 1)


def frame_beats(sim: stream.StreamBuild, frames: list[bytes], beat_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """AXI4-Stream records of byte frames (``tlast`` on each frame's last beat) and each frame's first beat."""
    data = np.frombuffer(b"".join(frames), np.uint8).reshape(-1, beat_bytes)
    lengths = np.array([len(f) for f in frames]) // beat_bytes
    ends = np.cumsum(lengths)
    last = np.zeros(len(data), np.uint8)
    last[ends - 1] = 1
    ports = dict(zip(sim.input.data, (data, last)))
    return sim.records(sim.input, ports), ends - lengths


def compare_responses(stimulus: DecodeStimulus, data: np.ndarray, last: np.ndarray, *, exact_cycles: bool,
                      beat_bytes: int) -> tuple[int, list[str], bool]:
    """The responses that differ from the expected ones (their count, and up to ``regress.SHOWN`` lines naming
    the frame and, for a DECODE, its token) and whether every CYCLES_LAST word is right: equal to
    the expected one (``stimulus.expected_cycles``) when ``exact_cycles``, else at least ``least_cycles`` (the
    word then takes no part in the byte comparison)."""
    from somatile.hw import regmap

    want = np.frombuffer(b"".join(stimulus.responses), np.uint8)
    lengths = np.array([len(r) for r in stimulus.responses])
    starts = np.cumsum(lengths) - lengths
    want_last = np.zeros(len(want) // beat_bytes, np.uint8)
    want_last[(starts + lengths) // beat_bytes - 1] = 1
    got = data.reshape(-1)
    if len(got) != len(want):
        return 1, [f"expected {len(want)} response bytes ({len(want_last)} beats), got {len(got)}"], False
    result_at = starts[stimulus.cycle_reads][:, None] + 8 + np.arange(4)
    words = np.ascontiguousarray(got[result_at]).view("<u4").ravel()
    differs = got != want
    if exact_cycles:
        cycles_ok = bool(np.all(words == stimulus.expected_cycles))
    else:
        cycles_ok = bool(np.all(words >= stimulus.least_cycles))
        differs[result_at.ravel()] = False
    lines = []
    bad_frames = np.unique(np.searchsorted(starts, np.flatnonzero(differs), side="right") - 1)
    bad_frames = np.union1d(bad_frames, np.searchsorted(starts // beat_bytes,
                                                        np.flatnonzero(last != want_last), side="right") - 1)
    token_of = {int(f): t for t, f in enumerate(stimulus.decode_frames)}
    for f in bad_frames[:regress.SHOWN]:
        a, n = int(starts[f]), int(lengths[f])
        at = np.flatnonzero(got[a:a + n] != want[a:a + n])
        what = f"token {token_of[f]} " if f in token_of else ""
        where = (f"first at byte {int(at[0])} (payload byte {int(at[0]) - regmap.HEADER_BYTES}): RTL "
                 f"{int(got[a + at[0]])} expected {int(want[a + at[0]])}" if len(at) else "tlast misplaced")
        lines.append(f"{what}(frame {f}, opcode {stimulus.frames[f][1]}): {len(at)} byte(s) differ, {where}")
    return len(bad_frames), lines, cycles_ok


FRAME_SLICE_CYCLES = 1
"""Cycles a DECODE frame takes at the stream ports beyond CYCLES_LAST: the response's output register slice."""


@dataclasses.dataclass(frozen=True)
class StreamedDecode:
    """A decode stimulus streamed through the tile's stream harness, its responses checked."""
    stimulus: DecodeStimulus
    run: stream.StreamRun
    mismatches: int
    first: list[str]
    cycles_ok: bool
    """Every CYCLES_LAST word and every DECODE frame's port cycles as expected (exact at full rate)."""
    frame_cycles: np.ndarray
    """Per token, its DECODE frame's cycles at the ports (:func:`port_frame_cycles`; 0 after a timeout)."""


def stream_decode(params: TileParams, configs, q, k, v, sim: stream.StreamBuild, *, measure_every: int,
                  reference: str = "spec", idle: float = 0.0, stall: float = 0.0, seed: int = 1) -> StreamedDecode:
    """:func:`decode_stimulus` streamed through ``sim`` (every frame back to back, as the host may send them:
    the tile takes the next DECODE frame in while the current one computes), with ``idle`` input and ``stall``
    output probabilities; every response compared (:func:`compare_responses`) and each DECODE frame's cycles
    at the ports against the formula: equal at full rate, else at least ``frame_least``."""
    stimulus = decode_stimulus(params, configs, q, k, v, measure_every=measure_every, reference=reference)
    beats, first_beats = frame_beats(sim, stimulus.frames, params.stream_bytes)
    expected_beats = sum(len(r) for r in stimulus.responses) // params.stream_bytes
    run = stream.run(sim, beats, expected_beats, idle=idle, stall=stall, seed=seed)
    got = sim.fields(sim.output, run.out)
    full_rate = idle == stall == 0
    mismatches, first, cycles_ok = compare_responses(stimulus, got["m_axis_tdata"], got["m_axis_tlast"][:, 0],
                                                     exact_cycles=full_rate, beat_bytes=params.stream_bytes)
    response_ends = np.cumsum([len(r) for r in stimulus.responses]) // params.stream_bytes - 1
    if len(run.out_cycles) == expected_beats:
        frame_cycles = port_frame_cycles(stimulus, run.in_cycles, run.out_cycles, first_beats, response_ends)
    else:
        frame_cycles = np.zeros(len(stimulus.decode_frames), np.int64)
    frame_ok = (np.all(frame_cycles == stimulus.frame_cycles) if full_rate
                else np.all(frame_cycles >= stimulus.frame_least))
    return StreamedDecode(stimulus, run, mismatches, first, bool(cycles_ok and frame_ok), frame_cycles)


def decode_job(job: dict) -> dict:
    """One chunk of a decode regression (a job of somatile.eval.jobs): heads' options, scales and the token
    sequence drawn from the chunk's seed (:func:`random_config`, :func:`sequence`), streamed through the
    tile in the stream harness ``job["build"]`` from a fresh state (:func:`stream_decode`)."""
    started = time.perf_counter()
    params = TileParams(**job["params"])
    rng = np.random.default_rng(job["seed"])
    configs = [random_config(rng, params) for _ in range(params.heads)]
    q, k, v = sequence(rng, job["tokens"], params.heads, params.head_dim)
    done = stream_decode(params, configs, q, k, v, job["build"], measure_every=job["measure_every"],
                         reference=job["reference"], idle=job["idle"], stall=job["backpressure"],
                         seed=job["seed"][-1])
    run = done.run
    full_rate = job["idle"] == job["backpressure"] == 0
    return {"tokens": job["tokens"], "mismatches": done.mismatches, "first": done.first,
            "cycles": int(done.frame_cycles.sum()), "cycles_ok": done.cycles_ok, "full_rate": full_rate,
            # at full rate the exact count, else the least (the check is frame by frame)
            "expected_cycles": int((done.stimulus.frame_cycles if full_rate else done.stimulus.frame_least).sum()),
            "sim_cycles": run.cycles, "error": run.report["error"], "timeout": run.timeout,
            "seconds": time.perf_counter() - started, "loop_seconds": run.seconds,
            "cpu_seconds": run.cpu_seconds}


def decode_regression(tokens: int, params, *, chunk: int = 5000, seed: int = 0, n_jobs: int | None = 1,
                      cluster: str | None = None, traffic: str = "full", measure_every: int = 1000,
                      reference: str = "spec") -> dict:
    """``tokens`` decode tokens through the tile of ``params`` in chunks of ``chunk`` (each its own seeded
    heads and sequence from a fresh state) on the job layer; the tile is built here once. Returns the totals
    and the per-chunk results in chunk order."""
    from somatile.eval import jobs as joblayer

    if tokens < 1 or chunk < 1 or measure_every < 1:
        raise ValueError(f"--tokens {tokens} --chunk {chunk}: expected positive token and chunk counts")
    build = harness_build(params)
    starts = range(0, tokens, chunk)
    work = [{"params": dataclasses.asdict(params), "tokens": min(chunk, tokens - a), "seed": [seed, i],
             "measure_every": measure_every, "reference": reference, "build": build,
             **dict(zip(("idle", "backpressure"), regress.chunk_traffic(traffic, i)))} for i, a in enumerate(starts)]
    started = time.perf_counter()
    results = joblayer.run(decode_job, work, n_jobs=n_jobs, cluster=cluster,
                           labels=[f"tokens {a}..{a + w['tokens'] - 1}" for a, w in zip(starts, work)],
                           desc="decode regression")
    wall = time.perf_counter() - started
    first = [f"tokens {a}..: {line}" for a, r in zip(starts, results) for line in r["first"]][:regress.SHOWN]
    return {"tokens": sum(r["tokens"] for r in results), "mismatches": sum(r["mismatches"] for r in results),
            "first": first, "chunks": results, "cycles_ok": all(r["cycles_ok"] for r in results),
            "error_ok": not any(r["error"] or r["timeout"] for r in results), "wall_seconds": wall}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=200, help="decode steps (default 200)")
    parser.add_argument("--heads", type=int, default=None, help="heads of the tile (default: the board's)")
    parser.add_argument("--ring", type=int, default=None, help="ring slots per head (default: the board's)")
    parser.add_argument("--board", default="sim", help="board whose tile parameters to use (default: sim)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", dest="overrides",
                        help="override one board parameter, validated like the YAML (repeatable; as in "
                             "`somatile build`)")
    parser.add_argument("--profile", choices=("paper", "wide"), default=None,
                        help="integer profile of the tile (docs/numerics.md; default: the board's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sequence and the head options")
    parser.add_argument("--waves", action="store_true", help="write a waveform file and print its path")
    regress.add_harness_arguments(parser, "", "sim/tb_soma.py")
    parser.add_argument("--chunk", type=int, default=5000,
                        help="--harness cpp: tokens per simulation, each chunk its own heads and sequence from a "
                             "fresh state (default 5000)")
    parser.add_argument("--jobs", type=int, default=1, help="--harness cpp: chunks run in this many processes")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="--harness cpp: run the chunks on a Dask distributed scheduler, e.g. tcp://HOST:8786")
    parser.add_argument("--reference", choices=("spec", "emu"), default="spec",
                        help="--harness cpp: expected DECODE outputs from the integer model (spec, in bulk) or the "
                             "golden tile model (emu, frame by frame; default spec)")


def run_regression(args: argparse.Namespace, params: TileParams) -> int:
    """``--harness cpp``: the decode regression of sim/regress.py; exit code 0 only with no mismatch, every
    cycle count as expected and the tile's error output low."""
    try:
        result = decode_regression(args.tokens, params, chunk=args.chunk, seed=args.seed, n_jobs=args.jobs,
                                   cluster=args.cluster, traffic=args.traffic, reference=args.reference)
    except ValueError as exc:
        raise SystemExit(f"somatile sim soma: {exc}") from None
    for line in result["first"]:
        print("MISMATCH " + line)
    print(f"tile: {params}")
    print(f"tokens: {result['tokens']} x heads {params.heads} in {len(result['chunks'])} chunks (cpp harness, "
          f"{args.traffic} traffic, reference {args.reference}), mismatching responses: {result['mismatches']}, "
          f"error output: {'low' if result['error_ok'] else 'HIGH or timed out'}")
    print(regress.cycles_line(result["chunks"]) + " (DECODE frames at the ports: a frame behind another DECODE "
          "from the previous response's end, expected_decode_cycles(behind=True); else expected_decode_cycles + 1)")
    print(regress.speed_line(result["chunks"], result["wall_seconds"], args.jobs, result["tokens"], "tokens"))
    return 0 if result["mismatches"] == 0 and result["cycles_ok"] and result["error_ok"] else 1


def run(args: argparse.Namespace) -> int:
    from somatile import boards
    from somatile.hw import regmap, tile_model
    from somatile.hw.tile import expected_decode_cycles
    from somatile.sim.runner import SimulationFailure

    if args.tokens < 1:
        raise SystemExit(f"somatile sim soma: --tokens must be >= 1, got {args.tokens}")
    overrides = {k: v for k, v in (("heads", args.heads), ("ring", args.ring), ("profile", args.profile))
                 if v is not None}
    try:
        board = boards.load(args.board, boards.parse_assignments(args.overrides))
        params = dataclasses.replace(TileParams.from_board(board), **overrides)
        regmap.check_fits(params)
    except ValueError as exc:
        raise SystemExit(f"somatile sim soma: {exc}") from None
    if args.harness == "cpp":
        return run_regression(args, params)
    rng = np.random.default_rng(args.seed)
    configs = [random_config(rng, params) for _ in range(params.heads)]
    q, k, v = sequence(rng, args.tokens, params.heads, params.head_dim)
    measure = [min(args.tokens - 1, 128)]
    print(f"tile: {params}")
    for h, cfg in enumerate(configs):
        print(f"head {h}: normaliser {cfg.normaliser}/{cfg.hccs_mode}, include_self {cfg.include_self}, "
              f"field {cfg.field_source}, gating {cfg.gating}")
    start = time.time()
    try:
        result = run_decode(params, q, k, v, [tile_model.head_values(c) for c in configs], measure=measure,
                            seed=args.seed, waves=args.waves)
    except SimulationFailure as exc:
        print(f"FAILED: {exc}")
        return 1
    elapsed = time.time() - start
    measured = int(result.outputs["cycles"][0])
    expected = expected_decode_cycles(params, configs)
    print(f"tokens {args.tokens} x heads {params.heads}: mismatches {int(result.outputs['mismatches'])}")
    # The cocotb testbench sends a frame once the previous response is in: each DECODE frame is on its own.
    print(f"cycles of a DECODE frame on its own (all heads, at token {measure[0]}): measured {measured}, expected "
          f"{expected}; back to back the tile takes {expected_decode_cycles(params, configs, behind=True)} a token "
          f"(--harness cpp streams the frames and checks that)")
    print(f"state bytes per head {regmap.state_bytes(params)}, per tile {params.heads * regmap.state_bytes(params)} "
          f"of {params.local_memory_bytes}")
    print(f"simulation wall time {elapsed:.1f} s (build included)")
    if result.waves:
        print(f"waves: {result.waves}")
    return 0 if measured == expected else 1
