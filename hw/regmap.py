"""The tile's register map and command layer: the one source for the RTL, the golden tile model, the
firmware header and the host driver.

Everything here is derived from a :class:`TileParams` (the elaboration parameters of one tile, declared in
``hw/tile_params.py``) and from the integer model's constants; nothing is declared twice. ``somatile regmap
--out DIR [--board NAME]`` writes the C header (``somatile_regmap.h``) and JSON (``somatile_regmap.json``)
that the firmware and host use, for the tile of a board (default ``sim``).

Command layer (on the tile's AXI4-Stream ports)
-----------------------------------------------
A *frame* is a byte string packed little-endian into stream beats (byte 0 in bits 7:0 of the first beat);
``tlast`` marks the last beat. Every frame is a 16-byte header followed by a payload whose length is a
multiple of :data:`FRAME_GRANULE` (16 bytes), so a frame is a whole number of beats at every stream width
(32, 64 or 128 bits) and the payload starts on a beat boundary.

Command header (host -> tile)::

    byte 0      FRAME_MAGIC (0xA5)
    byte 1      opcode (:class:`Opcode`)
    byte 2      head: the first head the command addresses (local to the tile)
    byte 3      count: number of heads (DECODE, RESET_STATE); 0 elsewhere
    bytes 4-7   payload length in bytes (u32)
    bytes 8-11  arg0 (u32): register address (REG_READ/REG_WRITE), rows (HCCS)
    bytes 12-15 arg1 (u32): register value (REG_WRITE), row length n (HCCS)

Response header (tile -> host), exactly one response frame per command frame::

    byte 0      FRAME_MAGIC
    byte 1      opcode of the command (echoed; 0 if the command header itself was malformed)
    byte 2      head (echoed)
    byte 3      error code (:class:`ErrorCode`; 0 = OK)
    bytes 4-7   payload length in bytes (u32; 0 on error)
    bytes 8-11  result (u32): the register value for REG_READ, else 0
    bytes 12-15 0

A command with an error (bad magic, unknown opcode, a length that differs from what the opcode and
arguments require, a head outside the tile, a bad register address or argument) is *drained*: the tile
consumes every beat up to ``tlast``, returns a response with the error code and no payload, latches the
code in ``ERROR_CODE``/``STATUS`` (sticky until CLEAR_ERROR) and then accepts the next frame as usual.
The state of the heads is unchanged by a faulting command.

Payloads, by opcode (``D`` = head_dim, ``n_pad`` = n rounded up to 16). A tile built for the wide profile
(``TileParams.profile``) carries int16 where the table says int8 for a normaliser logit and an output, and Q15
uint16 probabilities: its DECODE answer is D int16 per head and its HCCS rows are ``padded(2 n)`` bytes of int16
logits in and uint16 probabilities out, normalised by the head's ``normaliser`` (hccs_int, pwl2_int or
exp_int, docs/numerics.md "Wide normalisers"):

============== ============================================ ==============================================
opcode         command payload                               response payload
============== ============================================ ==============================================
INFO           none                                          the INFO registers, u32 each, padded to 16
REG_READ       none (arg0 = address)                         none (value in the header's result word)
REG_WRITE      none (arg0 = address, arg1 = value)           none
CONFIGURE_HEAD the head's parameter registers, u32 each,     none
               in HEAD_REGISTERS order, padded to 16
LOAD_STATE     the head's state bytes (:func:`state_layout`) none
READ_STATE     none                                          the head's state bytes
DECODE         for each of ``count`` heads: q, k, v int8     for each head: out int8 (D bytes)
               (3 x D bytes)
HCCS           arg0 rows x n_pad int8 logits (arg1 = n;      rows x n_pad uint8 probabilities (padding 0)
               padding bytes ignored), head's HCCS params
RESET_STATE    none                                          none (state of ``count`` heads cleared)
CLEAR_ERROR    none                                          none
============== ============================================ ==============================================
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import struct
from pathlib import Path

import numpy as np

# TILE_PROFILES is re-exported: the host's tile driver checks a configuration's profile beside the command layer.
from somatile.hw.tile_params import FRAME_GRANULE, RTL_PROFILES, TILE_PARAMS, TILE_PROFILES, TileParams  # noqa: F401

API_LEVEL = 3
FRAME_MAGIC = 0xA5
HEADER_BYTES = 16
REGISTER_BYTES = 4
ID_VALUE = 0x534F4D54  # "SOMT"


class Opcode(enum.IntEnum):
    INFO = 0x01
    REG_READ = 0x02
    REG_WRITE = 0x03
    CONFIGURE_HEAD = 0x04
    LOAD_STATE = 0x05
    READ_STATE = 0x06
    DECODE = 0x07
    HCCS = 0x08
    RESET_STATE = 0x09
    CLEAR_ERROR = 0x0A


class ErrorCode(enum.IntEnum):
    OK = 0
    BAD_MAGIC = 1
    UNKNOWN_OPCODE = 2
    BAD_LENGTH = 3
    BAD_HEAD = 4
    BAD_REGISTER = 5
    BAD_ARGUMENT = 6
    NOT_CONFIGURED = 7


ERROR_TEXT = {
    ErrorCode.OK: "no error",
    ErrorCode.BAD_MAGIC: "the frame does not start with the magic byte 0xA5",
    ErrorCode.UNKNOWN_OPCODE: "the opcode is not one of the tile's commands",
    ErrorCode.BAD_LENGTH: "the payload length differs from what the opcode and its arguments require",
    ErrorCode.BAD_HEAD: "the head (or head + count) lies outside the heads mapped to this tile",
    ErrorCode.BAD_REGISTER: "the register address is not in the map, or the register is read-only",
    ErrorCode.BAD_ARGUMENT: "an argument is out of range (HCCS rows/n, a head parameter, a state counter)",
    ErrorCode.NOT_CONFIGURED: "DECODE or HCCS on a head that no CONFIGURE_HEAD has set up since reset",
}


@dataclasses.dataclass(frozen=True)
class Register:
    name: str
    address: int
    access: str  # "ro" or "rw"
    doc: str


GLOBAL_REGISTERS: tuple[tuple[str, str, str], ...] = (
    ("ID", "ro", "the constant 0x534F4D54 ('SOMT')"),
    ("API_LEVEL", "ro", "the command-layer API level; host and firmware refuse a mismatch"),
    ("STATUS", "ro", "bit 0: an error is latched (cleared by CLEAR_ERROR)"),
    ("ERROR_CODE", "ro", "the first error code since the last CLEAR_ERROR (ErrorCode)"),
    ("ERROR_OPCODE", "ro", "the opcode byte of the frame that raised ERROR_CODE"),
    ("CYCLES_LAST", "ro", "clock cycles of the last completed command, first header beat (or the previous "
                          "response's end, if later) to last response beat"),
    ("COMMANDS", "ro", "command frames completed (with or without error), modulo 2**32"),
    ("TOKENS", "ro", "head decode steps completed, modulo 2**32"),
    ("CONFIGURED", "ro", "bit h: head h has parameters from a successful CONFIGURE_HEAD"),
    ("SCRATCH", "rw", "free for the host (link tests); the only register REG_WRITE accepts"),
)

# The capacity registers (read-only): the tile parameters that INFO reports, then the tile's index in the
# array, the derived sizes and the commands the tile runs.
INFO_FIELDS: tuple[str, ...] = (*(name for name, p in TILE_PARAMS.items() if p.info),
                                "tile_index", "state_bytes", "staging_bytes", "commands")


def commands_mask(opcodes) -> int:
    """The ``commands`` INFO register of a tile that runs ``opcodes``: bit n set for opcode n. The RTL tile and
    its model run every :class:`Opcode`; the HCCS-only SoC's command layer in firmware (hw/soc.py, peripheral
    ``hccs_unit``) runs fewer, and the host refuses the others before sending them."""
    return sum(1 << int(op) for op in opcodes)


def info_values(params: TileParams, tile_index: int = 0) -> list[int]:
    """The INFO registers' values, in INFO_FIELDS order (a named choice as its index: ``TileParam.code``; for
    hccs_out that is its somatile.model.hccs OUT_CODES code)."""
    derived = {"tile_index": tile_index, "state_bytes": state_bytes(params), "staging_bytes": staging_bytes(params),
               "commands": commands_mask(Opcode)}
    return [int(derived[f]) if f in derived else TILE_PARAMS[f].code(getattr(params, f)) for f in INFO_FIELDS]


INFO_BASE = 0x040
HEAD_BASE = 0x100
HEAD_STRIDE = 0x80


@dataclasses.dataclass(frozen=True)
class HeadParam:
    """One per-head parameter register: the SomaConfig field it sets, its legal range and power-on value.

    ``choices`` names the values of an enumerated field (index = register value)."""

    name: str
    lo: int
    hi: int
    default: int
    doc: str
    choices: tuple = ()


def _head_params(profile: str) -> tuple[HeadParam, ...]:
    from somatile.model import hccs, intexp, soma, wide

    # Power-on values are the SomaConfig field defaults (read without building a config: the defaults of one
    # field may only be valid together with a ring size).
    defaults = {f.name: f.default for f in dataclasses.fields(soma.SomaConfig)}
    mult = (0, soma.INT_MULT_MAX)
    shift = (0, soma.INT_SHIFT_MAX)

    def enum(name, choices, doc):
        # The float-only default normaliser (softmax) has no register value: power-on is the first choice.
        default = choices.index(defaults[name]) if defaults[name] in choices else 0
        return HeadParam(name, 0, len(choices) - 1, default, doc, tuple(choices))

    def num(name, lo_hi, doc):
        # Fields the model derives when left at None power on at their lowest legal value.
        default = lo_hi[0] if defaults[name] is None else int(defaults[name])
        return HeadParam(name, lo_hi[0], lo_hi[1], default, doc)

    # The wide profile has the same registers in the same order; the normaliser gains pwl2_int (code 2) and
    # the logit-unit registers are as wide as its 2^-8 bit units. B may be 0 there (pwl2 and exp ignore it;
    # the HCCS rule of the model refuses 0 for hccs_int).
    if profile == "wide":
        normalisers, recency = soma.PROFILE_NORMALISERS["wide"], (0, wide.LOGIT_MAX)
        B, S, dmax = (0, wide.B_MAX), (wide.S_MIN, wide.S_MAX), (wide.DMAX_MIN, wide.DMAX_MAX)
        units = "2^-8 bit units"
    else:
        normalisers, recency = soma.PROFILE_NORMALISERS["paper"], (0, 127)
        B, S, dmax = (hccs.B_MIN, hccs.B_MAX), (hccs.S_MIN, hccs.S_MAX), (hccs.DMAX_MIN, hccs.DMAX_MAX)
        units = "int8 logit units"
    return (
        enum("normaliser", normalisers,
             "near-field normaliser: " + ", ".join(f"{i} {name}" for i, name in enumerate(normalisers))),
        enum("hccs_mode", soma.HCCS_MODES, "HCCS normalisation: 0 div, 1 clb (profile paper)"),
        HeadParam("include_self", 0, 1, int(defaults["include_self"]), "1: the token attends to itself (written first)"),
        enum("field_source", soma.FIELD_SOURCES, "far field: 0 EMA of keys, 1 EMA of values"),
        enum("gating", soma.GATINGS, "far field: 0 ungated, 1 gated by the query (needs values)"),
        HeadParam("gamma_q15", 0, soma.GAMMA_Q15_ONE - 1, int(round(defaults["gamma"] * soma.GAMMA_Q15_ONE)),
                  "field EMA decay gamma in Q15"),
        num("score_mult", mult, "q.k int32 -> normaliser logit: multiplier"),
        num("score_shift", shift, "q.k int32 -> normaliser logit: shift"),
        num("recency_int", recency, f"recency bias: {units} per token of ring distance"),
        num("hccs_B", B, "HCCS intercept B"),
        num("hccs_S", S, "HCCS (wide: and pwl2) slope S"),
        num("hccs_dmax", dmax, "HCCS (wide: and pwl2) distance cap Dmax"),
        num("exp_mult", (intexp.EXP_MULT_MIN, intexp.EXP_MULT_MAX), "integer exp input scale M (profile paper)"),
        num("out_mult", mult, "P.V int32 -> output: multiplier"),
        num("out_shift", shift, "P.V int32 -> output: shift"),
        num("alpha_mult", mult, "far-field weight: multiplier"),
        num("alpha_shift", shift, "far-field weight: shift"),
        num("gate_mult", mult, "query gate logit -> Q7 gate: multiplier"),
        num("gate_shift", shift, "query gate logit -> Q7 gate: shift"),
    )


PROFILE_HEAD_PARAMS: dict[str, tuple[HeadParam, ...]] = {profile: _head_params(profile) for profile in TILE_PROFILES}
"""The per-head parameter registers of each profile, in register order (index i at HEAD_BASE + head*HEAD_STRIDE
+ 4*i). Every profile has the same registers in the same order; ranges and choices differ."""

HEAD_PARAMS: tuple[HeadParam, ...] = PROFILE_HEAD_PARAMS["paper"]
"""The paper profile's head parameter registers (``PROFILE_HEAD_PARAMS`` has each profile's)."""

HEAD_INDEX = {p.name: i for i, p in enumerate(HEAD_PARAMS)}
assert all([p.name for p in table] == list(HEAD_INDEX) for table in PROFILE_HEAD_PARAMS.values())


def head_fields(values, profile: str = "paper") -> dict:
    """A head parameter block (register values in the profile's HEAD_PARAMS order) as {name: value},
    enumerated fields as their names; raises ValueError naming the first value outside its register's range."""
    fields = {}
    for p, value in zip(PROFILE_HEAD_PARAMS[profile], values, strict=True):
        value = int(value)
        if not p.lo <= value <= p.hi:
            raise ValueError(f"head parameter {p.name} = {value}: expected {p.lo}..{p.hi} (profile {profile})")
        fields[p.name] = p.choices[value] if p.choices else value
    return fields


def state_layout(params: TileParams) -> list[tuple[str, int, tuple[int, ...], str]]:
    """The bytes of one head's state as (name, offset, shape, dtype), in the order of the model's
    ``SomaState.to_arrays()`` with the three counters in one section. Each section starts on a local-memory
    word (``params.word_bytes``), so LOAD_STATE/READ_STATE are plain copies. ``gate_field`` is always
    present (zeros unless the head is gated) so that every head has the same size."""
    d, word = params.head_dim, params.word_bytes
    sections = [("ring_k", (params.ring, d), "int8"), ("ring_v", (params.ring, d), "int8"),
                ("sink_k", (params.sinks, d), "int8"), ("sink_v", (params.sinks, d), "int8"),
                ("field", (d,), "int16"), ("gate_field", (d,), "int16"), ("counters", (3,), "uint32")]
    layout, offset = [], 0
    for name, shape, dtype in sections:
        layout.append((name, offset, shape, dtype))
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        offset += -(-nbytes // word) * word
    return layout


def state_bytes(params: TileParams) -> int:
    """Bytes of one head's state in local memory and on the wire (LOAD_STATE / READ_STATE payload)."""
    name, offset, shape, dtype = state_layout(params)[-1]
    return offset + -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // params.word_bytes) * params.word_bytes


def element_bytes(params: TileParams) -> int:
    """Bytes of one normaliser logit, probability and output element in the tile's profile: the paper profile's
    int8/uint8 (HCCS output: ``hccs_out``), the wide profile's int16/uint16."""
    return 2 if params.profile == "wide" else 1


def hccs_row_bytes(params: TileParams, n: int) -> int:
    """Bytes of one row of ``n`` logits in an HCCS command's payload, padded to the granule."""
    return padded(n * element_bytes(params))


def hccs_out_dtype(params: TileParams) -> np.dtype:
    """The HCCS command's output element (little-endian): Q15 uint16 in the wide profile, else ``hccs_out``."""
    return np.dtype("uint16" if params.profile == "wide" else params.hccs_out).newbyteorder("<")


def decode_out_bytes(params: TileParams) -> int:
    """Bytes of one head's DECODE output (head_dim elements of int8, or int16 in the wide profile)."""
    return params.head_dim * element_bytes(params)


def staging_bytes(params: TileParams) -> int:
    """Local memory that holds one command's payload before it is executed: q, k, v and out of every head
    for DECODE, or the rows of one HCCS command (at least one row of n_max)."""
    need = max(params.heads * (3 * params.head_dim + decode_out_bytes(params)), hccs_row_bytes(params, params.n_max))
    return -(-need // params.word_bytes) * params.word_bytes


def ahead_bytes(params: TileParams) -> int:
    """Local memory past the staging area for the next DECODE frame's q, k and v, received while the current
    frame computes (hw/tile.py): ``heads * 3 * head_dim`` bytes where they fit beside the heads' state and the
    staging area, else 0 (the tile then takes a DECODE frame's payload only once the previous one is done)."""
    need = params.heads * 3 * params.head_dim
    fits = params.heads * state_bytes(params) + staging_bytes(params) + need <= params.local_memory_bytes
    return need if fits else 0


def check_fits(params: TileParams) -> None:
    """Raise ValueError when the heads' state and the staging area exceed the tile's local memory."""
    total = params.heads * state_bytes(params) + staging_bytes(params)
    if total > params.local_memory_bytes:
        raise ValueError(
            f"tile local memory: {params.heads} heads x {state_bytes(params)} state bytes (ring={params.ring}, "
            f"sinks={params.sinks}, head_dim={params.head_dim}) + {staging_bytes(params)} staging bytes = "
            f"{total} > local_memory_bytes = {params.local_memory_bytes}; use fewer heads per tile, a shorter "
            f"ring or more local memory")


def registers(params: TileParams) -> list[Register]:
    """Every register of a tile with these parameters, in address order."""
    regs = [Register(name, i * REGISTER_BYTES, access, doc) for i, (name, access, doc) in enumerate(GLOBAL_REGISTERS)]
    regs += [Register(f"INFO_{f.upper()}", INFO_BASE + i * REGISTER_BYTES, "ro", f"tile parameter {f}")
             for i, f in enumerate(INFO_FIELDS)]
    for h in range(params.heads):
        regs += [Register(f"HEAD{h}_{p.name.upper()}", head_register(h, i), "ro", p.doc)
                 for i, p in enumerate(PROFILE_HEAD_PARAMS[params.profile])]
    return regs


def head_register(head: int, index: int) -> int:
    return HEAD_BASE + head * HEAD_STRIDE + index * REGISTER_BYTES


def padded(nbytes: int) -> int:
    """``nbytes`` rounded up to the frame granule."""
    return -(-nbytes // FRAME_GRANULE) * FRAME_GRANULE


def pack_command(opcode: int, head: int = 0, count: int = 0, payload: bytes = b"", arg0: int = 0,
                 arg1: int = 0, length: int | None = None, magic: int = FRAME_MAGIC) -> bytes:
    """A command frame: header + payload zero-padded to the granule. ``length`` and ``magic`` may be given
    explicitly to build faulty frames for tests."""
    body = bytes(payload) + bytes(padded(len(payload)) - len(payload))
    if length is None:
        length = len(body)
    return struct.pack("<BBBBIII", magic, opcode, head, count, length, arg0 & 0xFFFFFFFF, arg1 & 0xFFFFFFFF) + body


@dataclasses.dataclass(frozen=True)
class Response:
    opcode: int
    head: int
    error: int
    result: int
    payload: bytes


def pack_response(opcode: int, head: int, error: int, payload: bytes = b"", result: int = 0) -> bytes:
    body = bytes(payload) + bytes(padded(len(payload)) - len(payload))
    return struct.pack("<BBBBIII", FRAME_MAGIC, opcode, head, error, len(body), result & 0xFFFFFFFF, 0) + body


def unpack_response(frame: bytes) -> Response:
    """Parse one response frame; raises ValueError naming what is wrong with it."""
    if len(frame) < HEADER_BYTES:
        raise ValueError(f"response frame of {len(frame)} bytes: expected at least {HEADER_BYTES}")
    magic, opcode, head, error, length, result, _ = struct.unpack_from("<BBBBIII", frame)
    if magic != FRAME_MAGIC:
        raise ValueError(f"response frame magic 0x{magic:02X}: expected 0x{FRAME_MAGIC:02X}")
    if length != len(frame) - HEADER_BYTES:
        raise ValueError(f"response frame says {length} payload bytes but carries {len(frame) - HEADER_BYTES}")
    return Response(opcode, head, error, result, bytes(frame[HEADER_BYTES:]))


def to_json(params: TileParams) -> dict:
    return {
        "api_level": API_LEVEL,
        "frame": {"magic": FRAME_MAGIC, "header_bytes": HEADER_BYTES, "granule": FRAME_GRANULE},
        "params": dataclasses.asdict(params),
        "state_bytes": state_bytes(params),
        "state_layout": [{"name": n, "offset": o, "shape": list(s), "dtype": d}
                         for n, o, s, d in state_layout(params)],
        "opcodes": {o.name: int(o) for o in Opcode},
        "errors": {e.name: {"code": int(e), "text": ERROR_TEXT[e]} for e in ErrorCode},
        "head_params": [{"name": p.name, "index": i, "lo": p.lo, "hi": p.hi, "default": p.default,
                         "choices": list(p.choices), "doc": p.doc}
                        for i, p in enumerate(PROFILE_HEAD_PARAMS[params.profile])],
        "staging_bytes": staging_bytes(params),
        "info": dict(zip(INFO_FIELDS, info_values(params))),
        "head_base": HEAD_BASE,
        "head_stride": HEAD_STRIDE,
        "info_fields": list(INFO_FIELDS),
        "registers": [dataclasses.asdict(r) for r in registers(params)],
    }


def to_c_header(params: TileParams) -> str:
    guard = "SOMATILE_REGMAP_H"
    lines = [f"/* Generated by `somatile regmap` from somatile.hw.regmap; do not edit. */",
             f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", "",
             f"#define SOMATILE_API_LEVEL {API_LEVEL}u",
             f"#define SOMATILE_FRAME_MAGIC 0x{FRAME_MAGIC:02X}u",
             f"#define SOMATILE_HEADER_BYTES {HEADER_BYTES}u",
             f"#define SOMATILE_FRAME_GRANULE {FRAME_GRANULE}u",
             f"#define SOMATILE_ID_VALUE 0x{ID_VALUE:08X}u", ""]
    for field, value in zip(INFO_FIELDS, info_values(params)):
        lines.append(f"#define SOMATILE_{field.upper()} {value}u")
    for name, offset, shape, dtype in state_layout(params):
        lines.append(f"#define SOMATILE_STATE_{name.upper()}_OFFSET {offset}u /* {dtype} {list(shape)} */")
    lines += ["", "/* opcodes */"] + [f"#define SOMATILE_OP_{o.name} 0x{int(o):02X}u" for o in Opcode]
    lines += ["", "/* error codes */"] + [f"#define SOMATILE_ERR_{e.name} {int(e)}u /* {ERROR_TEXT[e]} */"
                                         for e in ErrorCode]
    lines += ["", "/* global and info registers (byte addresses) */"]
    lines += [f"#define SOMATILE_REG_{r.name} 0x{r.address:03X}u /* {r.access}: {r.doc} */"
              for r in registers(params) if not r.name.startswith("HEAD")]
    lines += ["", "/* per-head parameter registers: SOMATILE_REG_HEAD(h, SOMATILE_HEAD_<NAME>) */",
              f"#define SOMATILE_HEAD_BASE 0x{HEAD_BASE:03X}u", f"#define SOMATILE_HEAD_STRIDE 0x{HEAD_STRIDE:02X}u",
              "#define SOMATILE_REG_HEAD(h, index) (SOMATILE_HEAD_BASE + (h) * SOMATILE_HEAD_STRIDE + (index) * 4u)"]
    lines += [f"#define SOMATILE_HEAD_{p.name.upper()} {i}u /* {p.doc} */"
              for i, p in enumerate(PROFILE_HEAD_PARAMS[params.profile])]
    lines += [f"#define SOMATILE_HEAD_PARAM_COUNT {len(HEAD_PARAMS)}u", "", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def write(out_dir: str | Path, params: TileParams) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header = out / "somatile_regmap.h"
    header.write_text(to_c_header(params))
    js = out / "somatile_regmap.json"
    js.write_text(json.dumps(to_json(params), indent=2) + "\n")
    return [header, js]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from somatile import boards

    parser.add_argument("--out", required=True, help="folder for somatile_regmap.h and somatile_regmap.json")
    parser.add_argument("--board", default=boards.DEFAULT_BOARD,
                        help=f"board name or YAML path whose tile the map describes (default: {boards.DEFAULT_BOARD})")


def run(args: argparse.Namespace) -> int:
    from somatile import boards

    try:
        params = boards.load(args.board or boards.DEFAULT_BOARD).tile
    except ValueError as exc:
        raise SystemExit(f"somatile regmap: {exc}") from None
    for path in write(args.out, params):
        print(path)
    return 0
