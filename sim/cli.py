"""``somatile sim UNIT ...``: run an RTL unit in simulation on vectors and check it bit-exact.

Each unit has its own module with ``add_arguments(parser)`` and ``run(args) -> int``; only the chosen one is
imported, so a unit whose module is missing from this checkout gives a one-line message instead of breaking
the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

UNITS: dict[str, tuple[str, str]] = {
    "hccs": ("somatile.sim.run_hccs", "the HCCS normaliser on a .npz of int8 logits"),
    "soma": ("somatile.sim.run_soma", "a Soma decode sequence through the tile"),
}


def _chosen_unit(argv: list[str]) -> str | None:
    words = [a for a in argv if not a.startswith("-")]
    if "sim" in words:
        following = words[words.index("sim") + 1:]
        return following[0] if following else None
    return None


def _module(unit: str):
    name, _ = UNITS[unit]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise SystemExit(f"somatile sim {unit}: not available in this checkout ({name} is missing)") from None
        raise


def add_arguments(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> None:
    sub = parser.add_subparsers(dest="unit", metavar="UNIT", required=True)
    chosen = _chosen_unit(sys.argv[1:] if argv is None else argv)
    for unit, (_, help_line) in UNITS.items():
        unit_parser = sub.add_parser(unit, help=help_line, description=help_line)
        if unit == chosen:
            _module(unit).add_arguments(unit_parser)


def run(args: argparse.Namespace) -> int:
    return int(_module(args.unit).run(args) or 0)
