"""`somatile demo`: the main job on the embedded default (what `make demo` runs)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="build/demo", help="output folder (default: build/demo)")


def run(args: argparse.Namespace) -> int:
    from somatile.host.cli import main

    return main(["compare", "--out", f"{args.out}/compare"])
