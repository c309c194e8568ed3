"""``somatile sim soma``: a seeded decode sequence through the tile RTL in Verilator, checked bit-exact
against the integer Soma model; reports mismatches, cycles per token and state bytes.

    somatile sim soma --tokens 1000 [--heads 2] [--ring 16] [--board sim] [--profile paper|wide] [--waves]

Exit code 0 only when every output element matches the model and the measured cycles per token equal
``expected_decode_cycles``. The helpers :func:`random_config` and :func:`sequence` are shared with the tests
and the benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from somatile.hw.regmap import TileParams

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

    return runner.build_and_test(Tile, dataclasses.asdict(params), "somatile_tile", "somatile.sim.tb_soma",
                                 inputs=tb_soma.job(params, q, k, v, head_values, initial_states,
                                                    measure=measure, traffic=traffic, seed=seed),
                                 waves=waves)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=200, help="decode steps (default 200)")
    parser.add_argument("--heads", type=int, default=None, help="heads of the tile (default: the board's)")
    parser.add_argument("--ring", type=int, default=None, help="ring slots per head (default: the board's)")
    parser.add_argument("--board", default="sim", help="board whose tile parameters to use (default: sim)")
    parser.add_argument("--profile", choices=("paper", "wide"), default=None,
                        help="integer profile of the tile (docs/numerics.md; default: the board's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sequence and the head options")
    parser.add_argument("--waves", action="store_true", help="write a waveform file and print its path")


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
        params = dataclasses.replace(TileParams.from_board(boards.load(args.board)), **overrides)
        regmap.check_fits(params)
    except ValueError as exc:
        raise SystemExit(f"somatile sim soma: {exc}") from None
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
    print(f"cycles per token (all heads, at token {measure[0]}): measured {measured}, expected {expected}")
    print(f"state bytes per head {regmap.state_bytes(params)}, per tile {params.heads * regmap.state_bytes(params)} "
          f"of {params.local_memory_bytes}")
    print(f"simulation wall time {elapsed:.1f} s (build included)")
    if result.waves:
        print(f"waves: {result.waves}")
    return 0 if measured == expected else 1
