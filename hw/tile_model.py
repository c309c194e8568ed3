"""Golden model of the tile command layer: command frame bytes in, response frame bytes out.

:class:`TileModel` behaves exactly like the RTL tile (``hw/tile.py``) at the level of frames, built on the
integer kernels of ``somatile.model`` (``soma.decode_step`` with ``integer=True``, ``hccs.hccs_int``). It is
the cocotb scoreboard of the tile, the ``emu://`` backend of the host driver and the backend of the firmware's
host build, so the three produce identical bytes. The frame format, opcodes, error codes, registers and the
state layout are those of :mod:`somatile.hw.regmap` (read its docstring first).

Behaviour that the RTL shares and the tests check:

- One response frame per command frame. The count byte names the heads of DECODE and RESET_STATE
  (``head .. head + count - 1``); every other command ignores it. Header checks run in this order and the first failure wins:
  magic (BAD_MAGIC), opcode (UNKNOWN_OPCODE), head range (BAD_HEAD), register address (BAD_REGISTER),
  HCCS rows and n (BAD_ARGUMENT), configured heads (NOT_CONFIGURED), the head's HCCS parameters for rows of
  n (BAD_ARGUMENT, the rules of ``hccs.check_params``), the header's length field against the length the
  opcode requires (BAD_LENGTH). Then the payload must carry exactly that many bytes (BAD_LENGTH;
  a frame shorter than its 16-byte header is BAD_LENGTH with opcode and head echoed as 0).
  An error response carries no payload; its result word is the expected payload length for BAD_LENGTH,
  else 0. The first error since CLEAR_ERROR is latched in ERROR_CODE / ERROR_OPCODE and STATUS bit 0.
- A faulting command changes no head state and no parameter, with one exception: a LOAD_STATE whose payload
  has the wrong length or whose counters are out of range (write_pos < ring, fill <= ring,
  step <= 2**31 - 1) leaves that head's state cleared, never half-loaded.
- Heads power on unconfigured and with a cleared state (all bytes zero). CONFIGURE_HEAD validates the whole
  parameter block as the model's ``SomaConfig`` does (BAD_ARGUMENT leaves the old parameters in place).
- ``CYCLES_LAST`` reads 0 here (the model has no clock); every other register matches the RTL.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from somatile.hw import regmap
from somatile.hw.regmap import ErrorCode, Opcode, TileParams

_HEAD_OPCODES = {Opcode.CONFIGURE_HEAD, Opcode.LOAD_STATE, Opcode.READ_STATE, Opcode.DECODE, Opcode.HCCS,
                 Opcode.RESET_STATE}
_COUNTED_OPCODES = {Opcode.DECODE, Opcode.RESET_STATE}
_GLOBAL_INDEX = {name: i for i, (name, _, _) in enumerate(regmap.GLOBAL_REGISTERS)}


class CommandError(Exception):
    """A command refused by the tile: ``code`` and ``detail`` go into the error response."""

    def __init__(self, code: ErrorCode, detail: int = 0):
        super().__init__(code.name)
        self.code, self.detail = code, detail


def head_config(params: TileParams, values) -> "soma.SomaConfig":
    """The one-head integer SomaConfig (in the tile's profile) that a head parameter block (the profile's
    HEAD_PARAMS order) describes.

    Raises ValueError (from SomaConfig) when the combination is not valid for the tile's geometry."""
    from somatile.model import soma

    fields = regmap.head_fields(values, params.profile)
    fields["include_self"] = bool(fields["include_self"])
    gamma_q15 = fields.pop("gamma_q15")
    if params.profile == "wide":
        fields.pop("exp_mult")  # the wide integer exp takes no input scale
    return soma.SomaConfig(n_heads=1, head_dim=params.head_dim, ring=params.ring, sinks=params.sinks,
                           integer=True, gamma=gamma_q15 / soma.GAMMA_Q15_ONE, gamma_q15=gamma_q15,
                           profile=params.profile, **fields)


def state_to_arrays(params: TileParams, data: bytes, gated: bool = True) -> dict[str, np.ndarray]:
    """One head's state bytes -> the arrays of ``SomaState.to_arrays()`` for a one-KV-head config.

    ``gated=False`` gives ``gate_field`` the shape (1, 0) that an ungated config expects."""
    out = {}
    for name, offset, shape, dtype in regmap.state_layout(params):
        count = int(np.prod(shape))
        values = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"), count=count, offset=offset)
        if name == "counters":
            for counter, value in zip(("write_pos", "fill", "step"), values):
                out[counter] = np.array(value, np.int32)
        elif name == "gate_field" and not gated:
            out[name] = np.zeros((1, 0), np.int16)
        else:
            out[name] = values.astype(np.dtype(dtype)).reshape((1,) + tuple(shape))
    return out


def arrays_to_state(params: TileParams, arrays, into: bytearray | None = None) -> bytearray:
    """The arrays of ``SomaState.to_arrays()`` (one KV head) -> state bytes; an empty ``gate_field`` leaves
    the bytes of ``into`` (zeros for a new buffer) untouched."""
    data = bytearray(regmap.state_bytes(params)) if into is None else into
    for name, offset, shape, dtype in regmap.state_layout(params):
        if name == "counters":
            values = np.array([int(arrays[c]) for c in ("write_pos", "fill", "step")], np.uint32)
        else:
            values = np.asarray(arrays[name])
            if values.size == 0:
                continue
            if values.size != int(np.prod(shape)):
                raise ValueError(f"state array {name!r}: expected {int(np.prod(shape))} elements of {dtype} "
                                 f"{tuple(shape)}, got shape {values.shape}")
        raw = values.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
        data[offset:offset + len(raw)] = raw
    return data


def counters_error(params: TileParams, data: bytes) -> str | None:
    """Why the counters in a head's state bytes are out of range, or None."""
    from somatile.model import soma

    arrays = state_to_arrays(params, data)
    limits = {"write_pos": params.ring - 1, "fill": params.ring, "step": soma.COUNTER_MAX}
    for name, limit in limits.items():
        if not 0 <= int(np.uint32(arrays[name])) <= limit:
            return f"{name} = {int(np.uint32(arrays[name]))} outside 0..{limit}"
    return None


@dataclasses.dataclass
class _Head:
    values: list[int]
    configured: bool
    state: bytearray


class TileModel:
    """The tile's command layer in software. ``command(frame) -> response`` for one frame at a time.

    params: the tile's :class:`TileParams` (raises ValueError when the state does not fit its memory, like
    elaboration); tile_index: the tile's position in an array (INFO and register INFO_TILE_INDEX).
    """

    def __init__(self, params: TileParams, tile_index: int = 0):
        regmap.check_fits(params)
        self.params = params
        self.tile_index = tile_index
        self._state_bytes = regmap.state_bytes(params)
        self.reset()

    def reset(self) -> None:
        """Power-on / reset: every head unconfigured with default parameters and a cleared state."""
        self._head_params = regmap.PROFILE_HEAD_PARAMS[self.params.profile]
        self.heads = [_Head([p.default for p in self._head_params], False, bytearray(self._state_bytes))
                      for _ in range(self.params.heads)]
        self.globals = {name: 0 for name, _, _ in regmap.GLOBAL_REGISTERS}
        self.globals["ID"] = regmap.ID_VALUE
        self.globals["API_LEVEL"] = regmap.API_LEVEL
        self._configs = [None] * self.params.heads

    def read_register(self, address: int) -> int:
        """The value REG_READ returns for ``address``; raises CommandError(BAD_REGISTER) off the map."""
        if address % regmap.REGISTER_BYTES:
            raise CommandError(ErrorCode.BAD_REGISTER)
        index = address // regmap.REGISTER_BYTES
        if index < len(regmap.GLOBAL_REGISTERS):
            name = regmap.GLOBAL_REGISTERS[index][0]
            if name == "CONFIGURED":
                return sum(1 << h for h, head in enumerate(self.heads) if head.configured)
            return self.globals[name] & 0xFFFFFFFF
        info_index = (address - regmap.INFO_BASE) // regmap.REGISTER_BYTES
        if address >= regmap.INFO_BASE and info_index < len(regmap.INFO_FIELDS):
            return regmap.info_values(self.params, self.tile_index)[info_index]
        head, offset = divmod(address - regmap.HEAD_BASE, regmap.HEAD_STRIDE)
        if address >= regmap.HEAD_BASE and head < self.params.heads and offset // 4 < len(self._head_params):
            return self.heads[head].values[offset // 4]
        raise CommandError(ErrorCode.BAD_REGISTER)

    def command(self, frame: bytes) -> bytes:
        """Execute one command frame (header + payload, as delimited by tlast) and return the response."""
        frame = bytes(frame)
        if len(frame) < regmap.HEADER_BYTES:
            response = self._error(0, 0, CommandError(ErrorCode.BAD_LENGTH, 0))
        else:
            magic, opcode, head, count, length, arg0, arg1 = struct.unpack_from("<BBBBIII", frame)
            try:
                expected = self._check_header(magic, opcode, head, count, length, arg0, arg1)
                payload = frame[regmap.HEADER_BYTES:]
                if len(payload) != expected:
                    if opcode == Opcode.LOAD_STATE:
                        self.heads[head].state[:] = bytes(self._state_bytes)
                    raise CommandError(ErrorCode.BAD_LENGTH, expected)
                result, out = self._execute(Opcode(opcode), head, count, arg0, arg1, payload)
                response = regmap.pack_response(opcode, head, ErrorCode.OK, out, result)
            except CommandError as error:
                response = self._error(opcode, head, error)
        self.globals["COMMANDS"] = (self.globals["COMMANDS"] + 1) & 0xFFFFFFFF
        return response

    def _error(self, opcode: int, head: int, error: CommandError) -> bytes:
        if not self.globals["STATUS"] & 1:
            self.globals["STATUS"] |= 1
            self.globals["ERROR_CODE"] = int(error.code)
            self.globals["ERROR_OPCODE"] = opcode
        return regmap.pack_response(opcode, head, error.code, b"", error.detail)

    def _check_header(self, magic, opcode, head, count, length, arg0, arg1) -> int:
        """Header checks in the documented order; returns the payload length the command requires."""
        p = self.params
        if magic != regmap.FRAME_MAGIC:
            raise CommandError(ErrorCode.BAD_MAGIC)
        if opcode not in Opcode.__members__.values():
            raise CommandError(ErrorCode.UNKNOWN_OPCODE)
        opcode = Opcode(opcode)
        # The heads a command touches: count of them for DECODE and RESET_STATE, the one head otherwise (the
        # RTL ignores the count byte of every other command, HCCS included).
        last = head + (count if opcode in _COUNTED_OPCODES else 1)
        if opcode in _HEAD_OPCODES:
            if head >= p.heads or last > p.heads or (opcode in _COUNTED_OPCODES and count == 0):
                raise CommandError(ErrorCode.BAD_HEAD)
        if opcode == Opcode.REG_READ:
            self.read_register(arg0)
        if opcode == Opcode.REG_WRITE and arg0 != _GLOBAL_INDEX["SCRATCH"] * regmap.REGISTER_BYTES:
            raise CommandError(ErrorCode.BAD_REGISTER)
        if opcode == Opcode.HCCS:
            row_bytes = regmap.hccs_row_bytes(p, arg1)
            if not (1 <= arg1 <= p.n_max and arg0 >= 1 and arg0 * row_bytes <= regmap.staging_bytes(p)):
                raise CommandError(ErrorCode.BAD_ARGUMENT)
        if opcode in (Opcode.DECODE, Opcode.HCCS):
            if not all(self.heads[h].configured for h in range(head, last)):
                raise CommandError(ErrorCode.NOT_CONFIGURED)
        if opcode == Opcode.HCCS:
            self.hccs_params(head, arg1)
        expected = {
            Opcode.CONFIGURE_HEAD: regmap.padded(regmap.REGISTER_BYTES * len(regmap.HEAD_PARAMS)),
            Opcode.LOAD_STATE: self._state_bytes,
            Opcode.DECODE: 3 * p.head_dim * count,
            Opcode.HCCS: arg0 * regmap.hccs_row_bytes(p, arg1),
        }.get(opcode, 0)
        if length != expected:
            raise CommandError(ErrorCode.BAD_LENGTH, expected)
        return expected

    def hccs_params(self, head: int, cols: int):
        """The head's normaliser fields, checked for rows of ``cols`` (a bad configuration raises the tile's
        fault): HCCS's rule in the paper profile, the head normaliser's rule in the wide profile."""
        from somatile.model import hccs, wide

        values = regmap.head_fields(self.heads[head].values, self.params.profile)
        try:
            if self.params.profile == "wide":
                wide.check_params(values["normaliser"].removesuffix("_int"), values["hccs_B"], values["hccs_S"],
                                  values["hccs_dmax"], 1)
            else:
                hccs.check_params(values["hccs_B"], values["hccs_S"], values["hccs_dmax"], cols)
        except ValueError:
            raise CommandError(ErrorCode.BAD_ARGUMENT) from None
        return values

    def _execute(self, opcode: Opcode, head: int, count: int, arg0: int, arg1: int, payload: bytes):
        p = self.params
        if opcode == Opcode.INFO:
            return 0, struct.pack(f"<{len(regmap.INFO_FIELDS)}I", *regmap.info_values(p, self.tile_index))
        if opcode == Opcode.REG_READ:
            return self.read_register(arg0), b""
        if opcode == Opcode.REG_WRITE:
            self.globals["SCRATCH"] = arg1
            return 0, b""
        if opcode == Opcode.CLEAR_ERROR:
            self.globals.update(STATUS=0, ERROR_CODE=0, ERROR_OPCODE=0)
            return 0, b""
        if opcode == Opcode.CONFIGURE_HEAD:
            values = list(struct.unpack_from(f"<{len(self._head_params)}I", payload))
            try:
                self._configs[head] = head_config(p, values)
            except ValueError:
                raise CommandError(ErrorCode.BAD_ARGUMENT) from None
            self.heads[head].values = values
            self.heads[head].configured = True
            return 0, b""
        if opcode == Opcode.LOAD_STATE:
            if counters_error(p, payload) is not None:
                self.heads[head].state[:] = bytes(self._state_bytes)
                raise CommandError(ErrorCode.BAD_ARGUMENT)
            self.heads[head].state[:] = payload
            return 0, b""
        if opcode == Opcode.READ_STATE:
            return 0, bytes(self.heads[head].state)
        if opcode == Opcode.RESET_STATE:
            for h in range(head, head + count):
                self.heads[h].state[:] = bytes(self._state_bytes)
            return 0, b""
        if opcode == Opcode.DECODE:
            vectors = np.frombuffer(payload, np.int8).reshape(count, 3, p.head_dim)
            out = [self.decode_head(h, *vectors[i]) for i, h in enumerate(range(head, head + count))]
            self.globals["TOKENS"] = (self.globals["TOKENS"] + count) & 0xFFFFFFFF
            return 0, b"".join(out)
        if opcode == Opcode.HCCS:
            return 0, self.hccs_rows(head, arg0, arg1, payload)
        raise AssertionError(f"opcode {opcode!r} passed the header checks but has no behaviour")

    def decode_head(self, head: int, q, k, v) -> bytes:
        """One decode step of ``head`` on its stored state (updated in place); the output (int8, or int16
        little-endian in the wide profile) as bytes."""
        from somatile.model import soma

        cfg = self._configs[head]
        record = self.heads[head]
        state = soma.SomaState.from_arrays(cfg, state_to_arrays(self.params, record.state, cfg.gated))
        out, state = self.decode_step(cfg, state, q[None], k[None], v[None])
        arrays_to_state(self.params, state.to_arrays(), into=record.state)
        return out.astype("<i2" if self.params.profile == "wide" else np.int8).tobytes()

    def hccs_rows(self, head: int, rows: int, n: int, payload: bytes) -> bytes:
        """The HCCS command: ``rows`` rows of ``n`` logits (int8, or int16 in the wide profile; each row padded
        to regmap.hccs_row_bytes) normalised with the head's parameters (the wide profile: by the head's
        normaliser); the output rows padded the same way, little-endian."""
        values = self.hccs_params(head, n)
        logit = np.dtype("<i2" if self.params.profile == "wide" else np.int8)
        width = regmap.hccs_row_bytes(self.params, n) // logit.itemsize
        x = np.frombuffer(payload, logit).reshape(rows, width)[:, :n]
        probs = self.normalise_rows(values, np.ascontiguousarray(x).astype(logit.newbyteorder("=")))
        out = np.zeros((rows, width), probs.dtype)
        out[:, :n] = probs
        return out.astype(regmap.hccs_out_dtype(self.params)).tobytes()

    # The two compute steps; a backend with another compute engine (Metal) overrides these only.
    def decode_step(self, cfg, state, q, k, v):
        """``somatile.model.soma.decode_step`` of a one-head config: (output, new state)."""
        from somatile.model import soma

        return soma.decode_step(cfg, state, q, k, v)

    def normalise_rows(self, values: dict, x: np.ndarray) -> np.ndarray:
        """The HCCS command's normaliser over rows ``x`` with a head's fields (``regmap.head_fields``)."""
        from somatile.model import hccs, wide

        if self.params.profile == "wide":
            return wide.wide_softmax(x, values["normaliser"].removesuffix("_int"), values["hccs_B"],
                                     values["hccs_S"], values["hccs_dmax"], impl="numpy")
        return hccs.hccs_int(x, values["hccs_B"], values["hccs_S"], values["hccs_dmax"], mode=values["hccs_mode"],
                             out=self.params.hccs_out)


def configure_frame(head: int, values) -> bytes:
    """CONFIGURE_HEAD frame for a parameter block in HEAD_PARAMS order (see :func:`head_values`)."""
    return regmap.pack_command(Opcode.CONFIGURE_HEAD, head, payload=struct.pack(f"<{len(values)}I", *values))


def head_values(cfg, head: int = 0) -> list[int]:
    """The parameter block (the HEAD_PARAMS order of ``cfg.profile``) of query head ``head`` of an integer
    SomaConfig; a fallback head of the wide profile gets the integer exp as its normaliser. Fields the config
    leaves at None take the power-on value; a choice the tile lacks raises ValueError naming the field."""
    values = []
    for p in regmap.PROFILE_HEAD_PARAMS[cfg.profile]:
        value = getattr(cfg, p.name)
        if isinstance(value, (tuple, list)):
            value = value[head]
        if p.name == "normaliser" and cfg.fallback is not None and cfg.fallback[head]:
            value = "exp_int"
        if value is None:  # a parameter the config's normaliser does not use
            value = p.choices[p.default] if p.choices else p.default
        if p.choices and value not in p.choices:
            raise ValueError(f"SomaConfig.{p.name} = {value!r}: the tile supports {', '.join(map(str, p.choices))}")
        values.append(p.choices.index(value) if p.choices else int(value))
    return values


def decode_frame(head: int, q, k, v) -> bytes:
    """DECODE frame for heads ``head .. head + len(q) - 1``; q, k, v int8 (count, head_dim)."""
    q, k, v = (np.asarray(a, np.int8) for a in (q, k, v))
    payload = np.stack([q, k, v], axis=1).tobytes()
    return regmap.pack_command(Opcode.DECODE, head, len(q), payload)


def load_state_frame(params: TileParams, head: int, arrays) -> bytes:
    """LOAD_STATE frame from the arrays of ``SomaState.to_arrays()`` (one KV head)."""
    return regmap.pack_command(Opcode.LOAD_STATE, head, payload=bytes(arrays_to_state(params, arrays)))


def hccs_frame(head: int, x, profile: str = "paper") -> bytes:
    """HCCS frame for rows ``x`` (rows, n) of int8 logits (int16 in the wide profile), each row zero-padded
    to the granule."""
    logit = np.dtype("<i2" if profile == "wide" else np.int8)
    x = np.asarray(x, logit)
    rows, n = x.shape
    padded = np.zeros((rows, regmap.padded(n * logit.itemsize) // logit.itemsize), logit)
    padded[:, :n] = x
    return regmap.pack_command(Opcode.HCCS, head, payload=padded.tobytes(), arg0=rows, arg1=n)


def reg_read_frame(name: str) -> bytes:
    """REG_READ frame of a global register by name."""
    return regmap.pack_command(Opcode.REG_READ, arg0=_GLOBAL_INDEX[name] * regmap.REGISTER_BYTES)


class ArrayModel:
    """The golden model of :class:`somatile.hw.array.TileArray`: frames routed by their head byte to
    ``n_tiles`` :class:`TileModel` instances (tile ``g // heads``, local head ``g % heads``, the last tile for
    heads beyond it), the response's head byte turned back into the global head."""

    def __init__(self, params: TileParams):
        self.params = params
        self.tiles = [TileModel(params, i) for i in range(params.n_tiles)]

    def reset(self) -> None:
        for tile in self.tiles:
            tile.reset()

    def command(self, frame: bytes) -> bytes:
        frame = bytearray(frame)
        heads, last = self.params.heads, self.params.n_tiles - 1
        tile = min(frame[2] // heads, last) if len(frame) > 2 else 0
        if len(frame) > 2:
            frame[2] -= tile * heads
        response = bytearray(self.tiles[tile].command(bytes(frame)))
        response[2] = (response[2] + tile * heads) & 0xFF
        return bytes(response)
