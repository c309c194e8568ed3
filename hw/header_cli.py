"""The command line of a module that generates a C header (``python -m MODULE --c-header FILE``): the SoC's
memory map (hw/soc_map.py) and the Versal block design's address map (boards/vivado.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def header_main(argv: list[str] | None, prog: str, description: str, header: str, text: Callable[[], str]) -> int:
    """Parse ``--c-header FILE`` and write ``text()`` there (folders made as needed); ``header`` names the
    file in the help."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    parser.add_argument("--c-header", metavar="FILE", required=True, help=f"write {header} to FILE")
    args = parser.parse_args(argv)
    path = Path(args.c_header)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text())
    return 0
