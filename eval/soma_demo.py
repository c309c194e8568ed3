"""A short tour of Soma for `make demo`: memory against a full KV cache, O(1) integer decode, bit-exactness.

Usage: ``python -m somatile.eval.soma_demo [--heads 9] [--kv-heads 3] [--head-dim 64] [--layers 30]``
(the defaults are SmolLM2-135M's attention shape). Also usable as a ``somatile`` subcommand module
(``add_arguments(parser)`` / ``run(args) -> int``). Prints plain text; takes a few seconds plus numba's
first compilation when its cache is cold.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heads", type=int, default=9, help="query heads (default 9, SmolLM2-135M)")
    parser.add_argument("--kv-heads", type=int, default=3, help="KV heads (default 3)")
    parser.add_argument("--head-dim", type=int, default=64, help="head dimension (default 64)")
    parser.add_argument("--layers", type=int, default=30, help="layers for the per-model memory (default 30)")
    parser.add_argument("--steps", type=int, default=200, help="timed decode steps per position (default 200)")


def interleaved_step_us(cfg, states, tokens, *, impl: str = "numba") -> list[float]:
    """Median decode-step time (microseconds) per state, the states stepped in turn on each (q, k, v) token
    so that load from other jobs on the machine falls on all of them alike. The states advance in place."""
    from somatile.model.soma import decode_step
    times = [[] for _ in states]
    for q, k, v in tokens:
        for state, record in zip(states, times):
            t0 = time.perf_counter()
            decode_step(cfg, state, q, k, v, impl=impl)
            record.append(time.perf_counter() - t0)
    return [statistics.median(record) * 1e6 for record in times]


def run(args: argparse.Namespace) -> int:
    from somatile.model.soma import SomaConfig, SomaState, prefill, state_bytes

    shape = dict(n_heads=args.heads, n_kv_heads=args.kv_heads, head_dim=args.head_dim)
    cfg = SomaConfig.preset("default", integer=True, **shape)
    print(f"Soma, preset 'default' ({cfg.sinks} sinks + {cfg.ring} ring slots), {args.heads} heads / "
          f"{args.kv_heads} KV heads x {args.head_dim}, {args.layers} layers, integer path (int8 K/V, int16 field)")
    for n in (2048, 8192, 65536):
        s = state_bytes(cfg, n, n_layers=args.layers)
        print(f"  {n:>6} tokens: state {s.soma_model / 1024:9.1f} KiB vs full KV cache "
              f"{s.full_kv_model / 2 ** 20:8.1f} MiB  ({s.ratio:6.0f}x)")

    rng = np.random.default_rng(0)

    def tokens(count):
        return [tuple(rng.integers(-128, 128, (h, args.head_dim), dtype=np.int8)
                      for h in (args.heads, args.kv_heads, args.kv_heads)) for _ in range(count)]

    warm = [np.stack(x) for x in zip(*tokens(cfg.slots + 44))]
    _, early = prefill(cfg, *(x[:128] for x in warm))
    # Position 65,536: a full ring of real tokens with the counters of that position (65,536 real steps
    # would only cost time: the state has the same shape at every position).
    _, full = prefill(cfg, *warm)
    late_arrays = full.to_arrays()
    late_arrays.update(step=np.array(65536, np.int32), write_pos=np.array((65536 - cfg.sinks) % cfg.ring, np.int32))
    late = SomaState.from_arrays(cfg, late_arrays)
    timed = tokens(args.steps)
    interleaved_step_us(cfg, [early.copy()], timed[:3])
    t_early, t_late = interleaved_step_us(cfg, [early, late], timed)
    print(f"  integer decode step (numba): {t_early:.0f} us at position 128, {t_late:.0f} us at 65,536 "
          f"(ratio {t_late / t_early:.2f}; the work per token does not depend on the position)")

    a, _ = prefill(cfg, *warm, impl="numpy")
    b, _ = prefill(cfg, *warm, impl="numba")
    print(f"  numba fast path == numpy spec on {len(a)} tokens (ring wrapped): {np.array_equal(a, b)}")
    seed = SomaConfig.preset("seed", **shape)
    out, _ = prefill(seed, *(rng.standard_normal(x.shape) for x in warm))
    print(f"  preset 'seed' (seed 000 literally): output at t=0 is all zeros: {not out[0].any()}")
    return 0 if np.array_equal(a, b) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m somatile.eval.soma_demo", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
