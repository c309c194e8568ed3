"""The `somatile` command line.

Each subcommand lives beside the code it drives (the Glasgow rule: one vertical slice per function) and is
imported only when it is used, so `somatile compare` never pays for Amaranth or Verilator. A subcommand
module provides ``add_arguments(parser)`` and ``run(args) -> int`` (the process exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). The only place a subcommand is registered.
COMMANDS: dict[str, tuple[str, str]] = {
    "compare": ("somatile.model.compare", "fixed-point HCCS against float softmax on the host"),
    "calibrate": ("somatile.model.calibrate", "calibrate per-head HCCS parameters on logits"),
    "capture": ("somatile.eval.onnx_capture", "attention logits, mask and values of an ONNX model, per layer"),
    "eval": ("somatile.eval.cli", "measure HCCS and Soma on real models (MiniLM, SmolLM2, your ONNX model)"),
    "sim": ("somatile.sim.cli", "run an RTL unit in Verilator on vectors and check it bit-exact"),
    "regmap": ("somatile.hw.regmap", "export the register map of a board's tile as C header and JSON"),
    "build": ("somatile.boards.build", "generate RTL for a board, synthesise and place-and-route"),
    "device": ("somatile.host.device_cli", "talk to a device (emu://, sim://, tcp://, serial://, metal://)"),
    "demo": ("somatile.eval.demo", "the main job on the embedded default (what `make demo` runs)"),
}


def _load(name: str):
    module_name, _ = COMMANDS[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("somatile"):
            raise SystemExit(f"somatile {name}: not available in this checkout ({exc.name} missing)") from exc
        raise SystemExit(
            f"somatile {name}: needs the Python package '{exc.name}'; install it with "
            f"`pip install -e '.[hdl,dev]'` (or `make test`, which sets up .venv)"
        ) from exc


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="somatile", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Only the chosen subcommand's module is imported; the others appear with their help line.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (_, help_line) in COMMANDS.items():
        p = sub.add_parser(name, help=help_line, description=help_line)
        if name == chosen:
            _load(name).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    return int(_load(args.command).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
