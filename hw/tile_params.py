"""The parameters of one tile, each declared once: name, type, meaning, legal values, default, and where the
tile and the device API report it.

Everything else that names a tile parameter is generated from :data:`TILE_PARAMS` or checked against it
(``tests/hw/test_tile_params.py``): the board schema and ``BoardConfig`` (``boards/config.py``), the fields,
defaults and rules of :class:`TileParams` (the RTL's elaboration parameters), the INFO registers
(``hw/regmap.py`` ``INFO_FIELDS``, and through them the firmware header and the wire protocol's HELLO), and
``DeviceInfo`` (``host/device.py``). The value sets (:data:`STREAM_WIDTHS`, :data:`HCCS_LANES`,
:data:`HCCS_OUT_TYPES`, :data:`TILE_PROFILES`) are declared here and imported wherever they are needed.

To add or change a tile parameter, edit its entry here; the board files (``boards/*.yaml``) then set it.

This module imports nothing of somatile: the board loader, the RTL and the register map all import it
without importing one another.
"""

from __future__ import annotations

import dataclasses
from typing import Any

STREAM_WIDTHS = (32, 64, 128)
"""AXI4-Stream tdata widths a tile port supports (bits)."""
FRAME_GRANULE = max(STREAM_WIDTHS) // 8
"""Payloads are padded to this many bytes, so that every supported stream width sees whole beats."""
HCCS_LANES = (1, 4, 8, 16, 32)
"""int8 lanes per beat the HCCS normaliser is built for."""
HCCS_OUT_TYPES = ("uint8", "int16")
"""HCCS output element types, in the order of their codes (``somatile.model.hccs.OUT_CODES``): the INFO
register and the host carry the index."""
TILE_PROFILES = ("paper", "wide")
"""The integer profiles of docs/numerics.md a tile can be built for, in the order of their INFO codes: "paper"
(int8 logits, uint8 probabilities, int8 output) and "wide" (int16 logits, Q15 probabilities, int16 output).
A board states its profile (boards/*.yaml ``profile``); the device API refuses parameters of any other, and a
backend that does not implement a profile refuses to build it (:data:`RTL_PROFILES`)."""
RTL_PROFILES = ("paper", "wide")
"""The profiles the tile RTL (hw/tile.py) elaborates; emu:// and the firmware carry every profile."""

DEVICE_REPORTS = ("field", "extra", "total", "")
"""Where ``DeviceInfo`` reports a tile parameter: a field of the same name and value, a key of its ``extra``,
a field of the same name that counts the whole device (the parameter times ``n_tiles``), or not at all."""


class TileParamError(ValueError):
    """A tile parameter is outside its legal values or breaks a rule between parameters.

    ``name``, ``value`` and ``expected`` say which parameter, its value and what was expected."""

    def __init__(self, name: str, value: Any, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"TileParams.{name} = {value!r}: expected {expected}")


@dataclasses.dataclass(frozen=True)
class TileParam:
    """One tile parameter. Its legal values are ``choices`` or the integers ``lo..hi`` (only the powers of
    two among them with ``power_of_two``, only the multiples of ``multiple_of``); ``why`` gives the reason
    for a bound. ``info``: an INFO register reports it; ``device``: where ``DeviceInfo`` does
    (:data:`DEVICE_REPORTS`)."""

    name: str
    type: type
    default: Any
    doc: str
    choices: tuple = ()
    lo: int = 0
    hi: int = 0
    power_of_two: bool = False
    multiple_of: int = 1
    why: str = ""
    info: bool = True
    device: str = ""

    def __post_init__(self) -> None:
        if self.device not in DEVICE_REPORTS:
            raise ValueError(f"tile parameter {self.name}: device {self.device!r}, expected one of {DEVICE_REPORTS}")
        if not self.allows(self.default):
            raise ValueError(f"tile parameter {self.name}: default {self.default!r}, expected {self.expected()}")

    def allows(self, value: Any) -> bool:
        if self.choices:
            return value in self.choices
        if not self.lo <= value <= self.hi:
            return False
        if self.power_of_two:
            return value & (value - 1) == 0
        return value % self.multiple_of == 0

    def expected(self, python: bool = False) -> str:
        """The legal values in the words of a board file (``one of uint8, int16``, ``an integer from 1 to
        255``) or, with ``python``, of a Python caller (``'uint8' or 'int16'``, ``1..255``)."""
        if self.choices and not python:
            text = "one of " + ", ".join(map(str, self.choices))
        elif self.choices:
            text = " or ".join(map(repr, self.choices)) if len(self.choices) == 2 else f"one of {self.choices}"
        elif self.power_of_two:
            text = f"a power of two from {self.lo} to {self.hi}"
        elif self.multiple_of > 1:
            text = f"a multiple of {self.multiple_of} from {self.lo} to {self.hi}"
        else:
            text = f"{self.lo}..{self.hi}" if python else f"an integer from {self.lo} to {self.hi}"
        return f"{text} ({self.why})" if self.why else text

    def code(self, value: Any) -> int:
        """The register value of ``value``: its index among ``choices``, or the integer itself (INFO)."""
        return self.choices.index(value) if self.choices and self.type is str else int(value)

    def value_of(self, code: int) -> Any:
        """The parameter value a register ``code`` stands for (the inverse of :meth:`code`)."""
        return self.choices[code] if self.choices and self.type is str else code

    def problem(self, value: Any) -> str | None:
        """None when ``value`` is legal, else what was expected (the board schema's check)."""
        return None if self.allows(value) else self.expected()


# In register order: the INFO registers, the fields of TileParams and the board's tile keys follow it.
TILE_PARAMS: dict[str, TileParam] = {p.name: p for p in (
    TileParam("lanes", int, 8, "int8 multiply-accumulates per cycle in the tile", lo=1, hi=256,
              power_of_two=True, device="field"),
    TileParam("stream_width", int, 32, "AXI4-Stream data width of a tile port (bits)", choices=STREAM_WIDTHS,
              device="extra"),
    TileParam("local_memory_bytes", int, 32 * 1024, "data memory per tile (bytes)", lo=1024, hi=1 << 20,
              power_of_two=True),
    TileParam("heads", int, 2, "attention heads mapped to one tile", lo=1, hi=255,
              why="the command header carries the head in one byte", device="total"),
    TileParam("ring", int, 64, "ring KV buffer entries per head", lo=1, hi=4096, device="field"),
    TileParam("sinks", int, 4, "attention-sink entries per head kept beside the ring", lo=0, hi=64,
              device="field"),
    TileParam("head_dim", int, 64, "elements per head vector", lo=FRAME_GRANULE, hi=1024,
              multiple_of=FRAME_GRANULE, why="whole payload granules", device="field"),
    TileParam("n_max", int, 256, "longest HCCS row held on chip (elements)", lo=1, hi=65536, device="field"),
    TileParam("hccs_lanes", int, 8, "int8 lanes per beat of the HCCS normaliser", choices=HCCS_LANES),
    TileParam("hccs_out", str, "uint8", "HCCS output element type (profile paper; the wide profile's is Q15 in "
              "uint16)", choices=HCCS_OUT_TYPES),
    TileParam("profile", str, "paper", "integer profile of docs/numerics.md the tile computes", choices=TILE_PROFILES,
              device="field"),
    TileParam("n_tiles", int, 1, "tiles in the array", lo=1, hi=512, device="extra"),
)}


def _one_field_per_param(cls):
    """Make ``cls`` a frozen dataclass with one field per :data:`TILE_PARAMS` entry, in order, defaulted."""
    cls.__annotations__ = {name: p.type for name, p in TILE_PARAMS.items()}
    for name, p in TILE_PARAMS.items():
        setattr(cls, name, p.default)
    return dataclasses.dataclass(frozen=True)(cls)


@_one_field_per_param
class TileParams:
    """Elaboration parameters of one tile (and of the array: ``n_tiles``): one field per entry of
    :data:`TILE_PARAMS`, with its default; ``BoardConfig.tile`` is one.

    Each field must hold one of its legal values, and two rules join fields: ``head_dim`` is a multiple of
    the local-memory word (:attr:`word_bytes`), and ``n_max >= ring + sinks``. A value that breaks either
    raises :class:`TileParamError` naming the field. Whether the heads' state fits ``local_memory_bytes``
    is ``somatile.hw.regmap.check_fits``.
    """

    def __post_init__(self) -> None:
        for name, param in TILE_PARAMS.items():
            if not param.allows(getattr(self, name)):
                raise TileParamError(name, getattr(self, name), param.expected(python=True))
        word = self.word_bytes
        if self.head_dim % word or word & (word - 1):
            raise TileParamError("head_dim", self.head_dim,
                                 f"a multiple of the local-memory word max(16, min(lanes, head_dim)) = {word} bytes, "
                                 f"which must be a power of two (one MAC operand vector per word)")
        if self.n_max < self.slots:
            raise TileParamError("n_max", self.n_max, f">= ring + sinks = {self.slots} (a decode row of every slot "
                                                      f"goes through the normaliser)")

    @property
    def stream_bytes(self) -> int:
        return self.stream_width // 8

    @property
    def mac_lanes(self) -> int:
        """MACs the decode unit uses per cycle: ``lanes``, but at most one head vector (the MAC array of an
        AI Engine tile is wider than a 64-element head; the lanes beyond head_dim would idle)."""
        return min(self.lanes, self.head_dim)

    @property
    def word_bytes(self) -> int:
        """Width of one local-memory word: one MAC operand vector, and never narrower than a granule."""
        return max(FRAME_GRANULE, self.mac_lanes)

    @property
    def slots(self) -> int:
        """Key/value slots per head: the sinks then the ring."""
        return self.sinks + self.ring

    @classmethod
    def from_board(cls, board) -> "TileParams":
        """The tile parameters of a board config (``somatile.boards.load``)."""
        return board.tile
