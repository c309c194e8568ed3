"""``somatile sim UNIT ...``: run an RTL unit in simulation on vectors and check it bit-exact.

Each unit has its own module with ``add_arguments(parser)`` and ``run(args) -> int``. The unit modules import
only numpy and the model at import time (Amaranth, cocotb and Verilator load when a simulation starts), so
all of them are imported to build the parser; a unit whose module is missing from this checkout still
appears and says so when it is chosen.
"""

from __future__ import annotations

import argparse
import importlib

UNITS: dict[str, tuple[str, str]] = {
    "hccs": ("somatile.sim.run_hccs", "the HCCS normaliser on a .npz of int8 logits"),
    "soma": ("somatile.sim.run_soma", "a Soma decode sequence through the tile"),
}


def _module(unit: str):
    name, _ = UNITS[unit]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="unit", metavar="UNIT", required=True)
    for unit, (module_name, help_line) in UNITS.items():
        module = _module(unit)
        if module is None:
            help_line = f"{help_line} (not available: {module_name} is missing)"
        unit_parser = sub.add_parser(unit, help=help_line, description=help_line)
        if module is not None:
            module.add_arguments(unit_parser)


def run(args: argparse.Namespace) -> int:
    module = _module(args.unit)
    if module is None:
        raise SystemExit(f"somatile sim {args.unit}: not available in this checkout "
                         f"({UNITS[args.unit][0]} is missing)")
    return int(module.run(args) or 0)
