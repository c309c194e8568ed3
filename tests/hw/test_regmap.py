"""The register map, its exports and the golden tile model (no simulator needed)."""

import dataclasses
import json
import re
import shutil
import struct
import subprocess
from argparse import Namespace

import numpy as np
import pytest

import somatile.boards as boards
from somatile.hw import regmap, tile_model
from somatile.hw.regmap import ErrorCode, Opcode, TileParams
from somatile.model import hccs, soma
from somatile.sim import run_soma

# The default board's tile, made small for quick tests (test_soma's sim-command test sets the same, so that
# the two share their Verilator builds).
SMALL_BOARD = {"local_memory_bytes": 8192, "ring": 8, "sinks": 2, "head_dim": 16, "n_max": 32}
PARAMS = boards.load(boards.DEFAULT_BOARD, SMALL_BOARD).tile


def answer(model, frame):
    return regmap.unpack_response(model.command(frame))


def configured_model(rng, params=PARAMS, **options):
    model = tile_model.TileModel(params)
    configs = [run_soma.random_config(rng, params, **options) for _ in range(params.heads)]
    for h, cfg in enumerate(configs):
        assert answer(model, tile_model.configure_frame(h, tile_model.head_values(cfg))).error == 0
    return model, configs


@pytest.mark.parametrize("field, value, expected", [
    ("stream_width", 48, "one of (32, 64, 128)"), ("lanes", 3, "power of two"),
    ("head_dim", 24, "multiple of 16"), ("n_max", 8, "ring + sinks"), ("heads", 0, "1..255"),
    ("hccs_out", "int8", "'uint8' or 'int16'")])
def test_bad_params_name_the_field(field, value, expected):
    with pytest.raises(ValueError, match=re.escape(f"TileParams.{field}") + ".*" + re.escape(expected)):
        TileParams(**{field: value})


def test_lanes_wider_than_a_head_use_one_head_vector_per_cycle():
    params = TileParams(lanes=128, head_dim=64)
    assert (params.mac_lanes, params.word_bytes) == (64, 64)
    with pytest.raises(ValueError, match=r"TileParams.head_dim = 48: expected a multiple of the local-memory "
                                         r"word .* = 32 bytes"):
        TileParams(lanes=32, head_dim=48)


def test_state_that_does_not_fit_is_refused_with_the_numbers():
    params = TileParams(lanes=16, head_dim=128, ring=64, sinks=4, heads=2, n_max=256, local_memory_bytes=32768)
    with pytest.raises(ValueError, match=r"2 heads x \d+ state bytes .* > local_memory_bytes = 32768"):
        regmap.check_fits(params)
    with pytest.raises(ValueError, match="local_memory_bytes"):
        tile_model.TileModel(params)


def test_exports_agree_and_the_header_compiles(tmp_path):
    assert regmap.run(Namespace(out=str(tmp_path), board=None)) == 0
    data = json.loads((tmp_path / "somatile_regmap.json").read_text())
    header = (tmp_path / "somatile_regmap.h").read_text()
    assert data["api_level"] == regmap.API_LEVEL
    assert data["state_bytes"] == regmap.state_bytes(TileParams())
    assert data["params"] == dataclasses.asdict(boards.load(boards.DEFAULT_BOARD).tile)  # a board's tile
    for reg in data["registers"]:
        if not reg["name"].startswith("HEAD"):
            assert f"#define SOMATILE_REG_{reg['name']} 0x{reg['address']:03X}u" in header
    for name, code in data["opcodes"].items():
        assert f"#define SOMATILE_OP_{name} 0x{code:02X}u" in header
    assert [p["name"] for p in data["head_params"]] == [p.name for p in regmap.HEAD_PARAMS]
    if shutil.which("gcc"):
        source = tmp_path / "use.c"
        source.write_text('#include "somatile_regmap.h"\nint main(void) { return SOMATILE_REG_HEAD(1, '
                          'SOMATILE_HEAD_GAMMA_Q15) == 0; }\n')
        subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-I", str(tmp_path), "-fsyntax-only", str(source)],
                       check=True)


def test_state_bytes_round_trip_the_model_arrays(rng):
    cfg = run_soma.random_config(rng, PARAMS, gating="query")
    state = soma.SomaState.empty(cfg)
    q, k, v = run_soma.sequence(rng, 30, 1, PARAMS.head_dim)
    soma.prefill(cfg, q, k, v, state=state)
    data = tile_model.arrays_to_state(PARAMS, state.to_arrays())
    assert len(data) == regmap.state_bytes(PARAMS)
    back = tile_model.state_to_arrays(PARAMS, bytes(data))
    for name, array in state.to_arrays().items():
        assert np.array_equal(back[name], array), name


def test_decode_frames_match_the_soma_model(rng):
    model, configs = configured_model(rng)
    q, k, v = run_soma.sequence(rng, 60, PARAMS.heads, PARAMS.head_dim)
    for t in range(q.shape[0]):
        out = answer(model, tile_model.decode_frame(0, q[t], k[t], v[t]))
        assert out.error == 0
        got = np.frombuffer(out.payload, np.int8).reshape(PARAMS.heads, PARAMS.head_dim)
        if t == 0:
            states = [soma.SomaState.empty(c) for c in configs]
        for h, cfg in enumerate(configs):
            want, _ = soma.decode_step(cfg, states[h], q[t, h][None], k[t, h][None], v[t, h][None])
            assert np.array_equal(got[h], want[0]), (t, h)
    assert answer(model, tile_model.reg_read_frame("TOKENS")).result == 60 * PARAMS.heads


def test_hccs_frames_match_hccs_int(rng):
    model, configs = configured_model(rng, normaliser="hccs_int")
    n = 20
    values = regmap.head_fields(tile_model.head_values(configs[1]))
    B, S, dmax = 40, 1, 12  # floor mass 28: >= 256 over the 10 decode slots and the 20-element rows
    block = tile_model.head_values(configs[1])
    for name, value in (("hccs_B", B), ("hccs_S", S), ("hccs_dmax", dmax)):
        block[regmap.HEAD_INDEX[name]] = value
    assert answer(model, tile_model.configure_frame(1, block)).error == 0
    x = rng.integers(-128, 128, (3, n), dtype=np.int8)
    out = answer(model, tile_model.hccs_frame(1, x))
    got = np.frombuffer(out.payload, np.uint8).reshape(3, regmap.padded(n))
    assert np.array_equal(got[:, :n], hccs.hccs_int(x, B, S, dmax, mode=values["hccs_mode"]))
    assert not got[:, n:].any()


FAULTS = {
    "bad magic": (regmap.pack_command(Opcode.INFO, magic=0x5A), ErrorCode.BAD_MAGIC),
    "unknown opcode": (regmap.pack_command(0x7E), ErrorCode.UNKNOWN_OPCODE),
    "head out of range": (regmap.pack_command(Opcode.READ_STATE, head=2), ErrorCode.BAD_HEAD),
    "head + count out of range": (regmap.pack_command(Opcode.RESET_STATE, head=1, count=2), ErrorCode.BAD_HEAD),
    "register off the map": (regmap.pack_command(Opcode.REG_READ, arg0=0x0FC), ErrorCode.BAD_REGISTER),
    "read-only register": (regmap.pack_command(Opcode.REG_WRITE, arg0=0x000, arg1=1), ErrorCode.BAD_REGISTER),
    "hccs row too long": (regmap.pack_command(Opcode.HCCS, arg0=1, arg1=33, payload=bytes(48)),
                          ErrorCode.BAD_ARGUMENT),
    "length field": (regmap.pack_command(Opcode.DECODE, count=1, payload=bytes(48), length=32),
                     ErrorCode.BAD_LENGTH),
    "payload cut short": (regmap.pack_command(Opcode.DECODE, count=1, payload=bytes(48))[:-16],
                          ErrorCode.BAD_LENGTH),
    "payload too long": (regmap.pack_command(Opcode.DECODE, count=1, payload=bytes(48)) + bytes(16),
                         ErrorCode.BAD_LENGTH),
    "header cut short": (regmap.pack_command(Opcode.INFO)[:8], ErrorCode.BAD_LENGTH),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_sets_the_error_and_the_tile_keeps_working(rng, fault):
    model, _ = configured_model(np.random.default_rng(5))
    reference, _ = configured_model(np.random.default_rng(5))
    q, k, v = run_soma.sequence(rng, 2, PARAMS.heads, PARAMS.head_dim)
    frame, code = FAULTS[fault]
    response = answer(model, frame)
    assert response.error == code and response.payload == b""
    assert answer(model, tile_model.reg_read_frame("ERROR_CODE")).result == code
    assert answer(model, tile_model.reg_read_frame("STATUS")).result == 1
    # The state is untouched: the next decode equals that of a tile that never saw the fault.
    for t in range(2):
        assert model.command(tile_model.decode_frame(0, q[t], k[t], v[t])) == \
            reference.command(tile_model.decode_frame(0, q[t], k[t], v[t]))
    assert answer(model, regmap.pack_command(Opcode.CLEAR_ERROR)).error == 0
    assert answer(model, tile_model.reg_read_frame("STATUS")).result == 0


def test_load_state_with_bad_counters_leaves_the_head_cleared(rng):
    model, configs = configured_model(rng)
    q, k, v = run_soma.sequence(rng, 5, PARAMS.heads, PARAMS.head_dim)
    for t in range(5):
        model.command(tile_model.decode_frame(0, q[t], k[t], v[t]))
    state = answer(model, regmap.pack_command(Opcode.READ_STATE, 0)).payload
    assert any(state)
    offset = dict((n, o) for n, o, _, _ in regmap.state_layout(PARAMS))["counters"]
    bad = bytearray(state)
    bad[offset + 4:offset + 8] = struct.pack("<I", PARAMS.ring + 1)  # fill > ring
    response = answer(model, regmap.pack_command(Opcode.LOAD_STATE, 0, payload=bytes(bad)))
    assert response.error == ErrorCode.BAD_ARGUMENT
    assert not any(answer(model, regmap.pack_command(Opcode.READ_STATE, 0)).payload)
    assert answer(model, regmap.pack_command(Opcode.LOAD_STATE, 0, payload=state)).error == 0
    assert answer(model, regmap.pack_command(Opcode.READ_STATE, 0)).payload == state


def test_unconfigured_heads_and_invalid_parameters_are_refused(rng):
    model = tile_model.TileModel(PARAMS)
    q, k, v = run_soma.sequence(rng, 1, 1, PARAMS.head_dim)
    assert answer(model, tile_model.decode_frame(0, q[0], k[0], v[0])).error == ErrorCode.NOT_CONFIGURED
    block = tile_model.head_values(run_soma.random_config(rng, PARAMS, normaliser="hccs_int"))
    bad = list(block)
    bad[regmap.HEAD_INDEX["hccs_S"]] = 127  # B - S*dmax < 0
    assert answer(model, tile_model.configure_frame(0, bad)).error == ErrorCode.BAD_ARGUMENT
    assert answer(model, tile_model.reg_read_frame("CONFIGURED")).result == 0
    gated_keys = list(block)
    gated_keys[regmap.HEAD_INDEX["gating"]] = 1
    gated_keys[regmap.HEAD_INDEX["field_source"]] = 0
    assert answer(model, tile_model.configure_frame(0, gated_keys)).error == ErrorCode.BAD_ARGUMENT
    assert answer(model, tile_model.configure_frame(0, block)).error == 0
    assert answer(model, tile_model.reg_read_frame("CONFIGURED")).result == 1


def test_regmap_command_names_an_unknown_board(tmp_path):
    with pytest.raises(SystemExit, match="somatile regmap: board 'no_such_board'"):
        regmap.run(Namespace(out=str(tmp_path), board="no_such_board"))
