"""boards/netlist.py: cells of one tile driven by another's in a synthesised (flattened) netlist."""

import json

import pytest

from somatile.boards.netlist import cross_tile_inputs


def _cell(inputs, outputs):
    """A Yosys JSON cell with these input and output nets (lists of net numbers)."""
    connections = {f"I{i}": [n] for i, n in enumerate(inputs)} | {f"O{i}": [n] for i, n in enumerate(outputs)}
    directions = {f"I{i}": "input" for i in range(len(inputs))} | {f"O{i}": "output" for i in range(len(outputs))}
    return {"type": "LUT4", "connections": connections, "port_directions": directions}


def _netlist(cells):
    return {"modules": {"top": {"cells": cells}}}


def test_counts_only_connections_between_tiles(tmp_path):
    cells = {
        "unit.tile0.a_TRELLIS_FF_Q": _cell(["0"], [2]),   # "0": a constant bit, driven by no cell
        "unit.tile0.b_LUT4_Z": _cell([2], [3]),           # same tile: not counted
        "unit.tile1.c_LUT4_Z": _cell([2, 3, 4], [5]),     # two inputs from tile0's cells
        "unit.tile1.d_TRELLIS_FF_Q": _cell([5], [6]),     # same tile
        "unit.fabric_LUT4_Z": _cell([6], [4]),            # outside the tiles: neither counted nor counting
        "unit.tile10.e_LUT4_Z": _cell([6], [7]),          # tile10 is not tile1
    }
    found = cross_tile_inputs(_netlist(cells), "top")
    assert sorted(found) == [("unit.tile0.a_TRELLIS_FF_Q", "unit.tile1.c_LUT4_Z"),
                             ("unit.tile0.b_LUT4_Z", "unit.tile1.c_LUT4_Z"),
                             ("unit.tile1.d_TRELLIS_FF_Q", "unit.tile10.e_LUT4_Z")]
    path = tmp_path / "n.json"
    path.write_text(json.dumps(_netlist(cells)))
    assert len(cross_tile_inputs(path, "top")) == 3


def test_missing_module_is_a_clear_error():
    with pytest.raises(ValueError, match="no module 'other'"):
        cross_tile_inputs(_netlist({}), "other")
