"""`somatile device ...`: talk to a device through `somatile.host.open(url)`.

    somatile device info   --url URL
    somatile device hccs   --url URL --vectors F.npz [--head H] [--out OUT.npz]
    somatile device decode --url URL --tokens N [--seed S]
    somatile device agree  --url URL --url URL ... [--tokens N] [--seed S]

``hccs`` reads int8 rows ``x`` from the npz (and compares with ``expected`` when the file has it); ``decode``
streams N seeded random tokens and checks every output against the model's integer decode; ``agree`` runs
the same tensors through several devices and reports whether all bytes agree. Exit code 1 on any mismatch;
2 with a one-line message on bad input or a device error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


from somatile.model.files import MAX_NPZ_ARRAY_BYTES, read_npz  # noqa: F401  (re-exported for callers)


# A small tile of the default board whose Verilator build takes seconds, shared with tests/hw/test_tile.py.
DEMO_QUERY = "board=sim&local_memory_bytes=8192&ring=8&sinks=2&head_dim=16&n_max=32"
DEMO_WIDE_QUERY = DEMO_QUERY.replace("board=sim&", "board=sim_wide&")
"""The demo's small tile in the wide profile (boards/sim_wide.yaml)."""


def demo(tokens: int = 64, seed: int = 1) -> int:
    """The `make demo` step: the demo tensors through emu:// and sim:// (RTL behind the firmware), compared
    bit for bit; prints the outcome and returns the exit code."""
    return run(argparse.Namespace(action="agree", urls=[f"emu://?{DEMO_QUERY}", f"sim://?{DEMO_QUERY}"],
                                  tokens=tokens, seed=seed))


def demo_wide(tokens: int = 32, seed: int = 1) -> int:
    """The `make demo` step of the wide profile: the demo tensors through emu://, sim:// (the wide tile RTL
    behind the firmware) and metal://?emulate=1 (the Metal kernels on the CPU emulator), compared bit for bit
    with the wide spec."""
    return run(argparse.Namespace(action="agree", urls=[f"emu://?{DEMO_WIDE_QUERY}", f"sim://?{DEMO_WIDE_QUERY}",
                                                        f"metal://?emulate=1&{DEMO_WIDE_QUERY}"],
                                  tokens=tokens, seed=seed))


DEMO_NORMALISER = {"paper": "hccs_int", "wide": "pwl2_int"}
"""The near-field normaliser of the demo config in each profile: HCCS, and the wide profile's exp-free pwl2."""


def demo_config(info):
    """The integer Soma config the CLI and the demo use for a device: its geometry and profile, the profile's
    exp-free near field (`DEMO_NORMALISER`), a small far-field weight, scales that keep random int8 q.k and
    P.V inside the output type."""
    from somatile.model import soma

    return soma.SomaConfig(n_heads=info.heads, head_dim=info.head_dim, ring=info.ring, sinks=info.sinks,
                           integer=True, profile=info.profile, normaliser=DEMO_NORMALISER[info.profile], alpha=0.1,
                           alpha_mult=5, alpha_shift=3, score_shift=9 if info.profile == "paper" else 5, out_shift=8)


def demo_tensors(info, tokens: int, seed: int):
    """Seeded q, k, v of shape (tokens, heads, head_dim) and HCCS rows for one head (rows of ring + sinks) of
    the profile's logits (int8, or int16 in the wide profile)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.integers(-128, 128, (tokens, info.heads, info.head_dim)).astype(np.int8) for _ in range(3))
    logit = np.iinfo(np.int16 if info.profile == "wide" else np.int8)
    x = rng.integers(logit.min, logit.max + 1, (4 * tokens, info.ring + info.sinks)).astype(logit.dtype)
    return q, k, v, x


def reference_rows(cfg, x):
    """What the device's HCCS command must answer for rows ``x`` with head 0 of ``cfg`` (the numpy spec)."""
    from somatile.model import hccs, wide

    B, S, dmax = cfg.hccs_B[0], cfg.hccs_S[0], cfg.hccs_dmax[0]
    if cfg.profile == "wide":
        return wide.wide_softmax(x, cfg.normaliser.removesuffix("_int"), B, S, dmax, impl="numpy")
    return hccs.hccs_int(x, B, S, dmax, mode=cfg.hccs_mode)


def stream_through(url: str, tokens: int = 64, seed: int = 1) -> dict:
    """`stream_device` on the device at ``url`` (opened and closed here)."""
    import somatile.host

    with somatile.host.open(url) as dev:
        return stream_device(dev, tokens, seed)


def stream_device(dev, tokens: int = 64, seed: int = 1) -> dict:
    """Configure ``dev`` with `demo_config`, reset it, decode ``tokens`` seeded tokens and run one HCCS batch;
    returns the outputs, the final state and the timings. A device without decode (``info.decodes`` false: the
    HCCS-only SoC) runs the HCCS batch only; its ``decode`` and ``state`` are None."""
    info = dev.info()
    dev.configure(demo_config(info))
    dev.reset()
    q, k, v, x = demo_tensors(info, tokens, seed)
    out, state, decode_s = None, None, 0.0
    if info.decodes:
        start = time.perf_counter()
        out = dev.decode(q, k, v)
        decode_s = time.perf_counter() - start
        state = dev.read_state()
    start = time.perf_counter()
    probs = dev.hccs(x, head=0)
    hccs_s = time.perf_counter() - start
    return {"url": info.backend, "info": info, "decode": out, "state": state, "hccs": probs,
            "decode_s": decode_s, "hccs_s": hccs_s, "inputs": (q, k, v, x)}


def agree(urls: list[str], tokens: int = 64, seed: int = 1) -> dict:
    """Stream the same tensors through every device in ``urls`` (all with the same tile geometry) and compare
    decode outputs, final states and HCCS probabilities exactly with the model (so with each other); a device
    without decode is compared on HCCS only and named in ``skipped``. The demo step:
    ``agree(["emu://?" + DEMO_QUERY, "sim://?" + DEMO_QUERY])``. Returns {"agree": bool, "runs": [...],
    "mismatches": [...], "skipped": [...]}."""
    from somatile.model import soma

    runs = [stream_through(url, tokens, seed) for url in urls]
    geometry = {(r["info"].heads, r["info"].head_dim, r["info"].ring, r["info"].sinks, r["info"].profile) for r in runs}
    if len(geometry) > 1:
        raise ValueError(f"agree: the devices {urls} differ in (heads, head_dim, ring, sinks, profile): "
                         f"{sorted(geometry)}; give them the same board and overrides")
    q, k, v, x = runs[0]["inputs"]
    cfg = demo_config(runs[0]["info"])
    if any(run["decode"] is not None for run in runs):
        ref_out, ref_state = soma.prefill(cfg, q, k, v)
    ref_probs = reference_rows(cfg, x)
    mismatches, skipped = [], []
    for run in runs:
        if not np.array_equal(run["hccs"], ref_probs):
            mismatches.append(f"{run['url']}: HCCS differs from the model's {cfg.normaliser} ({cfg.profile} profile)")
        if run["decode"] is None:
            skipped.append(f"{run['url']}: decode and state skipped: the device runs only "
                           f"{', '.join(run['info'].commands)} (no decode unit)")
            continue
        if not np.array_equal(run["decode"], ref_out):
            mismatches.append(f"{run['url']}: decode differs from the model in "
                              f"{int(np.sum(run['decode'] != ref_out))} of {ref_out.size} values")
        for name, value in ref_state.to_arrays().items():
            if not np.array_equal(run["state"][name], value):
                mismatches.append(f"{run['url']}: state {name} differs from the model")
    return {"agree": not mismatches, "runs": runs, "mismatches": mismatches, "skipped": skipped}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("info", help="print the device's board, API level and capacity")
    p.add_argument("--url", default="emu://")
    p = sub.add_parser("hccs", help="run integer HCCS on int8 rows from an npz file")
    p.add_argument("--url", default="emu://")
    p.add_argument("--vectors", required=True, help="npz with int8 'x' (rows, n); optional 'expected'")
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--params", help="HCCS parameter YAML (somatile calibrate) to configure first")
    p.add_argument("--out", help="write the probabilities to this npz ('probs')")
    p = sub.add_parser("decode", help="stream seeded random tokens and check them against the model")
    p.add_argument("--url", default="emu://")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("agree", help="the same tensors through several devices, compared exactly")
    p.add_argument("--url", action="append", required=True, dest="urls")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    """The action's exit code; bad input, a device error or an unreachable device print one line and give 2."""
    from somatile.host.device import DeviceError, DeviceTimeout, ProtocolError

    try:
        return _run(args)
    except (ValueError, TypeError, OSError, DeviceError, DeviceTimeout, ProtocolError) as exc:
        print(f"somatile device {args.action}: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import somatile.host

    if args.action == "info":
        with somatile.host.open(args.url) as dev:
            print(json.dumps(dev.info().as_dict(), indent=2))
        return 0
    if args.action == "hccs":
        data = read_npz(args.vectors, "--vectors")
        if "x" not in data:
            raise ValueError(f"--vectors {args.vectors}: no array 'x' (int8 rows); it has {sorted(data)}")
        with somatile.host.open(args.url) as dev:
            if args.params:
                dev.configure(args.params)
            start = time.perf_counter()
            probs = dev.hccs(data["x"], head=args.head)
            seconds = time.perf_counter() - start
        print(f"{args.url}: {probs.shape[0] if probs.ndim > 1 else 1} rows in {seconds:.3f} s "
              f"({data['x'].nbytes / seconds / 1e6:.3f} MB/s in)")
        if args.out:
            np.savez(args.out, probs=probs)
        if "expected" in data:
            bad = int(np.sum(probs != data["expected"]))
            print(f"mismatches against 'expected': {bad}")
            return 1 if bad else 0
        return 0
    if args.action == "decode":
        with somatile.host.open(args.url) as dev:
            info = dev.info()
        if not info.decodes:
            raise ValueError(f"{args.url}: the device runs only {', '.join(info.commands)}: no decode "
                             f"(an HCCS-only SoC, docs/firmware.md); try `somatile device hccs`")
        result = agree([args.url], args.tokens, args.seed)
        run_ = result["runs"][0]
        print(f"{args.url}: {args.tokens} tokens x {run_['info'].heads} heads in {run_['decode_s']:.3f} s "
              f"({args.tokens / run_['decode_s']:.1f} tokens/s); state {run_['info'].extra['state_bytes']} "
              f"bytes per head; mismatches against the model: {len(result['mismatches'])}")
        for line in result["mismatches"]:
            print(f"  {line}")
        return 0 if result["agree"] else 1
    result = agree(args.urls, args.tokens, args.seed)
    for run_ in result["runs"]:
        decoded = f"decode {args.tokens} tokens in {run_['decode_s']:.3f} s, " if run_["decode"] is not None else ""
        print(f"{run_['url']}: {decoded}HCCS {run_['hccs'].shape[0]} rows in {run_['hccs_s']:.3f} s")
    for line in result["skipped"]:
        print(f"SKIPPED {line}")
    for line in result["mismatches"]:
        print(f"MISMATCH {line}")
    print("all devices agree bit for bit with each other and the model" if result["agree"] else "DISAGREE")
    return 0 if result["agree"] else 1
