"""Checks on Yosys' synthesised netlist (the JSON that nextpnr reads).

Yosys flattens the array before it optimises, so two tiles' equal flip-flops may be shared (``opt_merge``):
a register of one tile then drives the other's logic across the die, a connection the RTL does not have and a
long route nextpnr cannot shorten. :func:`cross_tile_inputs` finds such connections; the array's build records
their number (0 when every tile drives only itself).
"""

from __future__ import annotations

import json
from pathlib import Path


def _tile_of(cell_name: str, prefix: str) -> str | None:
    """The tile a flattened cell belongs to (``tile0`` for ``unit.tile0.decode.x``: the first component of the
    hierarchical name that is ``prefix`` and a number), or None outside the tiles."""
    for part in cell_name.lstrip("\\").split("."):
        if part.startswith(prefix) and part[len(prefix):].isdigit():
            return part
    return None


def cross_tile_inputs(netlist: dict | str | Path, module: str, prefix: str = "tile") -> list[tuple[str, str]]:
    """(driver cell, driven cell) for every cell input of one tile whose net a cell of another tile drives,
    in Yosys' JSON netlist ``netlist`` (a dict or a path), module ``module``. Cells are assigned to tiles by
    their flattened names (:func:`_tile_of`)."""
    if not isinstance(netlist, dict):
        netlist = json.loads(Path(netlist).read_text())
    try:
        cells = netlist["modules"][module]["cells"]
    except KeyError as exc:
        raise ValueError(f"netlist: no module {module!r} with cells (key {exc})") from None
    driver: dict[int, str] = {}
    for name, cell in cells.items():
        for port, bits in cell.get("connections", {}).items():
            if cell.get("port_directions", {}).get(port) == "output":
                for bit in bits:
                    if isinstance(bit, int):
                        driver[bit] = name
    crossings = []
    for name, cell in cells.items():
        tile = _tile_of(name, prefix)
        if tile is None:
            continue
        for port, bits in cell.get("connections", {}).items():
            if cell.get("port_directions", {}).get(port) != "input":
                continue
            for bit in bits:
                source = driver.get(bit) if isinstance(bit, int) else None
                other = source and _tile_of(source, prefix)
                if other and other != tile:
                    crossings.append((source, name))
    return crossings
