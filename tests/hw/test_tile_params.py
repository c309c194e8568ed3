"""Each tile parameter is declared once (hw/tile_params.py): the board schema, BoardConfig, TileParams, the INFO
registers, the wire protocol's HELLO and DeviceInfo carry exactly the declared parameters, with the declared
default and rule."""

import dataclasses
import typing

import pytest

import somatile.boards as boards
import somatile.host
from somatile.boards import config as board_config
from somatile.host import protocol
from somatile.host.device import DeviceInfo
from somatile.hw import regmap
from somatile.hw.tile_params import (HCCS_LANES, HCCS_OUT_TYPES, TILE_PARAMS, TileParam, TileParamError,
                                     TileParams)
from somatile.model import hccs as model_hccs
from somatile.model.files import load_yaml

PARAMS = list(TILE_PARAMS.values())
BOARD_ONLY = {"description", "kind", "clock_mhz"}  # board keys that are not tile parameters


def outside(param: TileParam) -> list:
    """Values just outside the declared legal values."""
    if param.choices:
        return ["x" + str(param.choices[0])] if param.type is str else [max(param.choices) + 1]
    values = [param.lo - 1, param.hi + 1]
    if param.power_of_two:
        values.append(3 * param.lo)
    if param.multiple_of > 1:
        values.append(param.lo + 1)
    return values


def test_the_board_schema_is_the_declaration():
    assert set(boards.SCHEMA) - BOARD_ONLY == set(TILE_PARAMS)
    assert board_config.TILE_KEYS == tuple(TILE_PARAMS)
    for name, param in TILE_PARAMS.items():
        entry = boards.SCHEMA[name]
        assert (entry.type, entry.doc, entry.check) == (param.type, param.doc, param.problem), name


def test_board_config_holds_one_tile_params_and_reads_its_fields():
    cfg = boards.load("ulx3s_85f")
    assert isinstance(cfg.tile, TileParams) and TileParams.from_board(cfg) is cfg.tile
    assert not set(TILE_PARAMS) & {f.name for f in dataclasses.fields(boards.BoardConfig)}
    assert {name: getattr(cfg, name) for name in TILE_PARAMS} == dataclasses.asdict(cfg.tile) == cfg.array_kwargs()
    assert cfg.parameters().keys() - BOARD_ONLY - {"name", "fpga", "aie", "soc"} == set(TILE_PARAMS)


def test_tile_params_fields_and_defaults_are_the_declaration():
    fields = dataclasses.fields(TileParams)
    assert [(f.name, f.type, f.default) for f in fields] == [(p.name, p.type, p.default) for p in PARAMS]


def test_the_defaults_are_the_tile_of_the_base_board():
    """base.yaml states the shared defaults of the boards; a board that changes no tile key (sim) has the
    declared tile, so `TileParams()` and `somatile regmap` without --board describe a real board."""
    base = load_yaml((board_config.BOARDS_DIR / "base.yaml").read_text())
    assert {name: base[name] for name in TILE_PARAMS if name in base} == {p.name: p.default for p in PARAMS}
    assert boards.load(boards.DEFAULT_BOARD).tile == TileParams()


@pytest.mark.parametrize("param", PARAMS, ids=[p.name for p in PARAMS])
def test_one_rule_refuses_a_value_on_every_path(param):
    for value in outside(param):
        with pytest.raises(TileParamError) as exc:
            TileParams(**{param.name: value})
        assert (exc.value.name, exc.value.expected) == (param.name, param.expected(python=True))
        with pytest.raises(boards.BoardError, match=f"key '{param.name}': got {value!r}, expected") as exc:
            boards.load(boards.DEFAULT_BOARD, {param.name: value})
        assert param.expected() in str(exc.value)
    for value in param.choices or (param.lo, param.hi):
        assert param.allows(value) and boards.SCHEMA[param.name].check(value) is None


def test_rules_between_parameters_name_the_parameter_on_both_paths():
    with pytest.raises(TileParamError, match=r"TileParams.n_max = 8: expected >= ring \+ sinks = 68"):
        TileParams(n_max=8)
    with pytest.raises(boards.BoardError, match=r"key 'n_max': got 8, expected >= ring \+ sinks = 68"):
        boards.load(boards.DEFAULT_BOARD, {"n_max": 8})


def test_info_registers_are_the_declared_parameters_then_the_derived_ones():
    reported = tuple(p.name for p in PARAMS if p.info)
    assert regmap.INFO_FIELDS == (*reported, "tile_index", "state_bytes", "staging_bytes", "commands")
    assert protocol.TILE_INFO_REGISTERS == tuple(f for f in regmap.INFO_FIELDS if f != "tile_index")
    tile = boards.load("ulx3s_85f").tile
    values = dict(zip(regmap.INFO_FIELDS, regmap.info_values(tile)))
    for name in reported:
        expected = getattr(tile, name)
        choices = TILE_PARAMS[name].choices if TILE_PARAMS[name].type is str else ()
        assert values[name] == (choices.index(expected) if choices else expected), name
        assert TILE_PARAMS[name].value_of(values[name]) == expected, name
    assert values["hccs_out"] == HCCS_OUT_TYPES.index(tile.hccs_out)  # its code in somatile.model.hccs too
    assert values["commands"] == sum(1 << int(op) for op in regmap.Opcode)  # the RTL tile runs every command


def test_device_info_reports_each_parameter_where_the_declaration_says():
    hints = typing.get_type_hints(DeviceInfo)
    as_fields = {p.name for p in PARAMS if p.device in ("field", "total")}
    assert set(hints) & set(TILE_PARAMS) == as_fields
    assert all(hints[name] is TILE_PARAMS[name].type for name in as_fields)
    cfg = boards.load(boards.DEFAULT_BOARD, {"n_tiles": 2})
    with somatile.host.open(f"emu://?board={cfg.name}&n_tiles=2") as dev:
        info = dev.info()
    for p in PARAMS:
        value = getattr(cfg.tile, p.name)
        if p.device == "field":
            assert getattr(info, p.name) == value, p.name
        elif p.device == "total":
            assert getattr(info, p.name) == value * cfg.n_tiles, p.name
        elif p.device == "extra":
            assert info.extra[p.name] == value, p.name
        else:
            assert p.name not in info.extra, p.name


def test_the_value_sets_are_declared_once():
    from somatile.hw import hccs as hw_hccs

    assert {t: i for i, t in enumerate(HCCS_OUT_TYPES)} == model_hccs.OUT_CODES
    assert TILE_PARAMS["hccs_lanes"].choices is HCCS_LANES and TILE_PARAMS["hccs_out"].choices is HCCS_OUT_TYPES
    assert hw_hccs.HCCS_LANES is HCCS_LANES and hw_hccs.HCCS_OUT_TYPES is HCCS_OUT_TYPES
    assert regmap.TILE_PROFILES is TILE_PARAMS["profile"].choices
    assert set(regmap.RTL_PROFILES) <= set(regmap.TILE_PROFILES)
