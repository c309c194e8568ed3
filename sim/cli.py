"""``somatile sim UNIT ...``: run an RTL unit in simulation on vectors and check it bit-exact.

Each unit has its own module with ``add_arguments(parser)`` and ``run(args) -> int``. The unit modules import
only numpy and the model at import time (Amaranth, cocotb and Verilator load when a simulation starts), so
all of them are imported to build the parser.
"""

from __future__ import annotations

import argparse

from somatile.sim import run_hccs, run_soma

UNITS = {
    "hccs": (run_hccs, "the HCCS normaliser on a .npz of int8 logits"),
    "soma": (run_soma, "a Soma decode sequence through the tile"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="unit", metavar="UNIT", required=True)
    for unit, (module, help_line) in UNITS.items():
        module.add_arguments(sub.add_parser(unit, help=help_line, description=help_line))


def run(args: argparse.Namespace) -> int:
    return int(UNITS[args.unit][0].run(args) or 0)
