"""`somatile demo`: the main job on the embedded default, end to end (what `make demo` runs).

1. HCCS on real data: attention logits of all-MiniLM-L6-v2 on sentences of the committed Pride and Prejudice
   excerpt, calibrated per head (int8 B, S, Dmax) and compared with softmax by `somatile compare`; the
   parameters are written as YAML (what hardware and firmware load).
2. The HCCS RTL unit in Verilator on those calibrated int8 logits: mismatches against the golden model
   (expected: none) and measured against expected cycles.
3. Soma: state size against a full KV cache, O(1) integer decode, numba = numpy spec.
4. RTL for the default board (`somatile build --board sim --no-pnr`): where the Verilog, register map and
   manifest went.
5. The same tensors streamed through `emu://` (golden model) and `sim://` (the tile RTL behind the firmware),
   compared bit for bit.
6. The same for the wide integer profile (int16 logits, Q15 probabilities, int16 output; pwl2 near field)
   through `emu://`, `sim://` and `metal://?emulate=1` (the Metal kernels on the CPU emulator).

Every step prints what it did; the exit code is non-zero when any step fails (a mismatch included).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np

# Layer 1 of MiniLM has broad heads and one sharp one: a representative mix for a short demo.
DEMO_LAYER = 1
DEMO_SENTENCES = 48
# Rows per head sent through the RTL: 12 heads x 100 rows x 128 elements keeps the simulation to seconds.
RTL_ROWS_PER_HEAD = 100
COLS = 128


def _banner(n: int, title: str) -> None:
    print(f"\n=== {n}. {title}", flush=True)


def step_real_logits(out: Path) -> dict:
    """MiniLM logits of one layer -> `somatile compare` with calibration; returns the npz/yaml paths."""
    from somatile.host.cli import main
    from somatile.eval import text
    from somatile.eval.minilm import collect_minilm_logits, dump_minilm_logits
    from somatile.model.minilm import MiniLM

    model = MiniLM.load()
    pool = [s for s in text.sentences(text.load_text(), None) if len(model.encode(s)) <= COLS]
    sentences = pool[:DEMO_SENTENCES]
    layer_logits = collect_minilm_logits(model, sentences, COLS)
    logits_path = out / f"minilm_layer{DEMO_LAYER}_logits.npz"
    dump = dump_minilm_logits(logits_path, layer_logits, DEMO_LAYER)
    print(f"MiniLM layer {DEMO_LAYER} attention logits of {len(sentences)} sentences from {text.DEFAULT_TEXT.name}: "
          f"{tuple(dump['shape'])} -> {logits_path}")
    params_path = out / "hccs_params.yaml"
    # The RTL of step 2 implements the paper profile (int8 logits, uint8 out): calibrate for it.
    code = main(["compare", "--logits", str(logits_path), "--out", str(out / "compare"),
                 "--save-params", str(params_path), "--profile", "paper"])
    if code:
        raise RuntimeError(f"somatile compare exited with {code}")
    return {"logits": logits_path, "params": params_path}


def step_rtl_hccs(out: Path, logits_path: Path, params_path: Path) -> int:
    """The calibrated int8 logits through the HCCS unit in Verilator; returns the report's exit code."""
    from somatile.model import quant
    from somatile.model.params import HccsParams
    from somatile.sim.run_hccs import report, run_vectors

    params = HccsParams.from_yaml(params_path, profile="paper")
    with np.load(logits_path) as data:
        logits, mask = data["logits"][:, :RTL_ROWS_PER_HEAD], data["mask"][:, :RTL_ROWS_PER_HEAD]
    x = quant.quantize_logits(logits, params.scale, mask)
    vectors = {"x": x, "mask": mask, "B": np.asarray(params.B), "S": np.asarray(params.S),
               "dmax": np.asarray(params.dmax)}
    np.savez(out / "rtl_vectors.npz", **vectors)
    heads, rows, n = x.shape
    print(f"{heads} heads x {rows} rows x {n} calibrated int8 logits (mode {params.mode}) through the HCCS unit, "
          f"8 lanes; vectors in {out / 'rtl_vectors.npz'} (rerun: somatile sim hccs --vectors ...)")
    run, expected = run_vectors(vectors, lanes=8, mode=params.mode, out="uint8")
    return report(run, expected, heads * rows)


def step_soma() -> int:
    from somatile.eval import soma_demo

    parser = argparse.ArgumentParser()
    soma_demo.add_arguments(parser)
    return soma_demo.run(parser.parse_args([]))


def step_board(out: Path) -> int:
    from somatile.host.cli import main

    return main(["build", "--board", "sim", "--no-pnr", "--out", str(out / "boards")])


def step_stream() -> int:
    from somatile.host import device_cli

    return device_cli.demo()


def step_stream_wide() -> int:
    from somatile.host import device_cli

    return device_cli.demo_wide()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="build/demo", help="output folder (default: build/demo)")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    started = time.perf_counter()

    def attempt(n: int, title: str, fn, *a):
        _banner(n, title)
        try:
            result = fn(*a)
        except Exception:  # a failing step is reported and the demo goes on with the independent steps
            traceback.print_exc()
            failures.append(title)
            return None
        if isinstance(result, int) and result != 0:
            failures.append(title)
        return result

    real = attempt(1, "HCCS calibrated on MiniLM's own attention logits (somatile compare)", step_real_logits, out)
    if real is not None:
        attempt(2, "HCCS RTL unit in Verilator on the calibrated real logits", step_rtl_hccs, out,
                real["logits"], real["params"])
    else:
        failures.append("HCCS RTL unit (skipped: step 1 failed)")
    attempt(3, "Soma streaming attention: memory, O(1) decode, numba = spec", step_soma)
    attempt(4, "RTL for the default board", step_board, out)
    attempt(5, "Tensors streamed through emu:// and sim:// (tile RTL behind the firmware)", step_stream)
    attempt(6, "The wide integer profile through emu://, sim:// (its tile RTL) and metal://?emulate=1",
            step_stream_wide)

    print(f"\n=== demo finished in {time.perf_counter() - started:.0f} s; outputs under {out}/")
    if failures:
        print("FAILED steps: " + "; ".join(failures), file=sys.stderr)
        return 1
    print("all steps passed")
    return 0
