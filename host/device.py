"""The device API every backend implements, and the byte transport the wire-protocol backends share.

`Device` is what `somatile.host.open(url)` returns. The methods are the same on every backend (emu://,
sim://, tcp://, serial://, metal://) and every backend returns bit-identical integer results:

- ``info() -> DeviceInfo``: board, API level, lanes, heads, capacity.
- ``configure(params)``: per-head HCCS parameters (an object with per-head arrays, a mapping, or the path of
  the YAML that `somatile calibrate` writes).
- ``hccs(x, head=0, mask=None) -> ndarray``: integer HCCS of int8 logit rows ``x`` of shape (rows, n) or
  (n,) with the parameters of ``head``; large inputs are chunked to the device's capacity.
- ``decode(q, k, v) -> ndarray``: one Soma decode step; q of shape (heads, head_dim), k and v of shape
  (kv_heads, head_dim), all int8. The device keeps the Soma state between calls. A leading token axis
  (T, heads, head_dim) runs T steps in order and returns (T, heads, head_dim).
- ``read_state() -> dict[str, ndarray]`` / ``load_state(state)``: the integer Soma state in the layout of
  the model's ``to_arrays()`` / ``from_arrays()``.
- ``reset()``: clear the Soma state and any device error; keeps the configured parameters.
- ``close()``; devices are context managers.

Errors: `DeviceError` (the device refused a command: names the command and the device's error code),
`DeviceTimeout` (no answer in time, after the retries), `ProtocolError` (the link broke the protocol).

`Transport` is the byte stream under the wire-protocol backends (TCP, serial, a pipe to a firmware process,
an in-memory loopback). It only moves bytes; framing, CRC, sequence numbers and retries live in
`somatile.host.protocol`, written once for every transport.
"""

from __future__ import annotations

import abc
import os
import struct
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np


class DeviceError(RuntimeError):
    """The device answered a command with an error code.

    Attributes: ``command`` (name of the command), ``code`` (the numeric error code from the device),
    ``code_name`` (its symbolic name), ``detail`` (an integer the device adds, e.g. the expected length).
    """

    def __init__(self, command: str, code: int, code_name: str, detail: int = 0, message: str = ""):
        self.command, self.code, self.code_name, self.detail = command, code, code_name, detail
        text = f"device error in command {command}: {code_name} (code {code}, detail {detail})"
        super().__init__(f"{text}: {message}" if message else text)


class DeviceTimeout(TimeoutError):
    """The device did not answer (after the configured retries)."""


class ProtocolError(RuntimeError):
    """The link broke the wire protocol (wrong API level, unexpected sequence number, malformed answer)."""


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What a device reports about itself.

    ``capacity`` is the largest number of int8 elements one HCCS command may carry (the host chunks larger
    tensors); ``max_payload`` the largest wire-frame payload in bytes (0 where there is no wire).
    """

    backend: str
    board: str
    api_level: int
    lanes: int
    heads: int
    kv_heads: int
    head_dim: int
    ring: int
    sinks: int
    n_max: int
    capacity: int
    max_payload: int = 0
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        return d


class Device(abc.ABC):
    """Abstract device: see the module docstring for the contract of each method."""

    @abc.abstractmethod
    def info(self) -> DeviceInfo: ...

    @abc.abstractmethod
    def configure(self, params: Any) -> None: ...

    @abc.abstractmethod
    def hccs(self, x: np.ndarray, head: int = 0, mask: np.ndarray | None = None) -> np.ndarray: ...

    @abc.abstractmethod
    def decode(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def read_state(self) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def load_state(self, state: Mapping[str, np.ndarray]) -> None: ...

    @abc.abstractmethod
    def reset(self) -> None: ...

    def close(self) -> None:
        """Release the link; the default has nothing to release."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def as_int8(name: str, x: Any, ndim: tuple[int, ...], shape_tail: tuple[int, ...] = ()) -> np.ndarray:
    """Check that tensor ``name`` is integer with values in int8 range and one of ``ndim`` dimensions.

    ``shape_tail`` (if given) must equal the trailing dimensions. Returns a C-contiguous int8 copy or view.
    """
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"tensor {name}: expected int8 values, got dtype {a.dtype}")
    if a.ndim not in ndim:
        raise ValueError(f"tensor {name}: expected {' or '.join(map(str, ndim))} dimensions, got shape {a.shape}")
    if shape_tail and tuple(a.shape[-len(shape_tail):]) != tuple(shape_tail):
        raise ValueError(f"tensor {name}: expected trailing shape {tuple(shape_tail)}, got shape {a.shape}")
    if a.size and (a.min() < -128 or a.max() > 127):
        raise ValueError(f"tensor {name}: values outside int8 range [-128, 127]")
    return np.ascontiguousarray(a, dtype=np.int8)


class Transport(abc.ABC):
    """A bidirectional byte stream.

    ``read(n, timeout)`` returns up to ``n`` bytes: whatever arrives first (at least one byte), or ``b""``
    when nothing arrived within ``timeout`` seconds. ``write(data)`` sends all of ``data``. Neither frames
    nor retries: that is the protocol's job.
    """

    @abc.abstractmethod
    def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def read(self, n: int, timeout: float) -> bytes: ...

    def discard_input(self) -> None:
        """Drop whatever is buffered on the input side (used before a retry)."""
        while self.read(65536, 0.0):
            pass

    def close(self) -> None:
        """Close the stream; the default has nothing to close."""

    def read_exact(self, n: int, timeout: float) -> bytes:
        """Read exactly ``n`` bytes, or fewer if ``timeout`` seconds pass first (the caller checks)."""
        deadline = time.monotonic() + timeout
        parts, have = [], 0
        while have < n:
            chunk = self.read(n - have, max(0.0, deadline - time.monotonic()))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts)


def head_register_values(cfg, head: int) -> list[int]:
    """The head parameter registers (``somatile.hw.regmap.HEAD_PARAMS`` order) of query head ``head`` of an
    integer ``somatile.model.soma.SomaConfig``; fields the config leaves at None take the power-on value."""
    from somatile.hw import regmap

    values = []
    for p in regmap.HEAD_PARAMS:
        value = getattr(cfg, p.name)
        if isinstance(value, (tuple, list)):
            value = value[head]
        if value is None:
            value = p.default
        elif p.choices:
            if value not in p.choices:
                raise ValueError(f"SomaConfig.{p.name} = {value!r}: the tile supports {', '.join(map(str, p.choices))}")
            value = p.choices.index(value)
        values.append(int(value))
    return values


class TileDevice(Device):
    """The host driver of the tile command layer over the wire protocol (`somatile.host.protocol.WireLink`).

    Written once for every byte transport: emu:// (in-process), tcp://, serial:// and sim:// all construct
    this class around their own `Transport`. ``progress``: show tqdm bars for chunked transfers (None: only
    when more than ``progress_min`` chunks).
    """

    def __init__(self, link, backend: str, *, progress: bool | None = None, progress_min: int = 64):
        from somatile.hw import regmap

        self._rm = regmap
        self.link = link
        self.backend = backend
        self.progress, self.progress_min = progress, progress_min
        self.on_close: list = []  # callables run after the link closes (e.g. stop a firmware process)
        info = link.hello()
        link.max_payload = info["max_payload"]
        self._info = info
        self.heads = info["heads"] * info["n_tiles"]
        self.tile_heads = info["heads"]
        self.head_dim = info["head_dim"]
        self._values = [[p.default for p in regmap.HEAD_PARAMS] for _ in range(self.heads)]
        self._configured: list[bool] = [False] * self.heads
        self._hccs_dtype = np.dtype(["uint8", "int16"][info["hccs_out"]]).newbyteorder("<")

    def info(self) -> DeviceInfo:
        i = self._info
        room = i["max_payload"] - 4 - self._rm.HEADER_BYTES
        return DeviceInfo(backend=self.backend, board=i["board"], api_level=i["api_level"], lanes=i["lanes"],
                          heads=self.heads, kv_heads=self.heads, head_dim=i["head_dim"], ring=i["ring"],
                          sinks=i["sinks"], n_max=i["n_max"], capacity=min(i["staging_bytes"], room),
                          max_payload=i["max_payload"],
                          extra={k: i[k] for k in ("stream_width", "n_tiles", "state_bytes", "staging_bytes")})

    def close(self) -> None:
        """Close the link; every later call on this device raises ValueError (closing again does nothing)."""
        self.link.close()
        while self.on_close:
            self.on_close.pop(0)()

    def _tile(self, tile: int, opcode, head: int = 0, count: int = 0, payload: bytes = b"", arg0: int = 0,
              arg1: int = 0):
        from somatile.host import protocol

        rm = self._rm
        frame = protocol.TILE_PREFIX.pack(tile) + rm.pack_command(opcode, head, count, payload, arg0, arg1)
        answer = self.link.request(protocol.Opcode.TILE, frame)
        try:
            response = rm.unpack_response(answer)
        except ValueError as exc:
            raise ProtocolError(f"tile {tile} {rm.Opcode(opcode).name}: {exc}") from None
        if response.error:
            code = rm.ErrorCode(response.error)
            raise DeviceError(rm.Opcode(opcode).name, int(code), code.name, response.result,
                              f"tile {tile}, head {head}: {rm.ERROR_TEXT[code]}")
        return response

    def _chunks(self, items, what: str):
        items = list(items)
        show = self.progress if self.progress is not None else len(items) > self.progress_min
        if not show:
            return items
        from tqdm import tqdm

        return tqdm(items, desc=f"{self.backend} {what}", unit="chunk", leave=False)

    def configure(self, params: Any) -> None:
        """Set per-head parameters. ``params``: an integer `SomaConfig` with this device's geometry (every
        head), an `HccsParams` or the path of its YAML (HCCS integers; fallback heads get the integer exp),
        or a mapping ``{register name: value or one value per head}``. Unnamed registers keep their values.

        All or nothing: every head's block is checked by the tile's own rules (``tile_model.head_config``)
        before any is sent, and a value that is not an integer in its register's range, or a combination the
        tile refuses, raises ValueError naming the head and the register; if the device still refuses a head,
        the heads already sent get their previous blocks back before the DeviceError is raised."""
        from somatile.model.params import HccsParams

        if isinstance(params, (str, bytes, os.PathLike)):
            params = HccsParams.from_yaml(params)
        profile = getattr(params, "profile", None)
        if profile is not None and profile not in self._rm.TILE_PROFILES:
            raise ValueError(f"configure: the parameters are for integer profile {profile!r}; this device implements "
                             f"{' and '.join(repr(p) for p in self._rm.TILE_PROFILES)} (docs/numerics.md; calibrate "
                             f"with --profile paper, or SomaConfig(profile='paper'))")
        updates = self._parameter_updates(params)
        blocks = []
        for head in range(self.heads):
            values = list(self._values[head])
            for name, per_head in updates.items():
                values[self._rm.HEAD_INDEX[name]] = per_head[head]
            self._check_head_block(head, values, params)
            blocks.append(values)
        for head, values in enumerate(blocks):
            try:
                self._configure_head(head, values)
            except DeviceError:
                for earlier in range(head):
                    self._configure_head(earlier, self._values[earlier])
                raise
        self._values = blocks
        self._configured = [True] * self.heads

    def _configure_head(self, head: int, values: list[int]) -> None:
        from somatile.host import protocol

        try:
            self.link.request(protocol.Opcode.CONFIGURE, struct.pack(f"<I{len(values)}I", head, *values))
        except DeviceError as exc:
            if exc.code_name == "TILE_REFUSED":
                code = self._rm.ErrorCode(exc.detail)
                raise DeviceError("CONFIGURE", exc.code, exc.code_name, exc.detail,
                                  f"head {head} refused its parameters ({code.name}: "
                                  f"{self._rm.ERROR_TEXT[code]}): "
                                  f"{dict(zip(self._rm.HEAD_INDEX, values))}") from None
            raise

    def _check_head_block(self, head: int, values: list, params: Any) -> None:
        """ValueError naming ``head`` unless ``values`` (HEAD_PARAMS order) is a block the tile accepts."""
        from somatile.hw import tile_model

        for p, value in zip(self._rm.HEAD_PARAMS, values):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"configure: head {head}: register {p.name} = {value!r}: expected an integer "
                                 f"{p.lo}..{p.hi}" + (f" or one of {', '.join(p.choices)}" if p.choices else ""))
        try:
            tile_model.head_config(self._tile_params(), values)
        except ValueError as exc:
            rows = self._info["sinks"] + self._info["ring"]
            why = ""
            if getattr(params, "cols", rows) != rows:
                why = (f" (the HCCS parameters were calibrated for rows of {params.cols}; this device's Soma "
                       f"rows have sinks + ring = {rows})")
            raise ValueError(f"configure: head {head}: the tile refuses this parameter block: {exc}{why}") from None

    def _parameter_updates(self, params: Any) -> dict[str, list[int]]:
        from somatile.model import soma
        from somatile.model.params import HccsParams

        if isinstance(params, soma.SomaConfig):
            for field, want in (("n_heads", self.heads), ("head_dim", self.head_dim), ("ring", self._info["ring"]),
                                ("sinks", self._info["sinks"])):
                if getattr(params, field) != want:
                    raise ValueError(f"SomaConfig.{field} = {getattr(params, field)}: this device has {want}")
            if not params.integer or params.n_kv_heads != params.n_heads:
                raise ValueError("SomaConfig: the tile runs integer configs with n_kv_heads == n_heads")
            blocks = [head_register_values(params, h) for h in range(self.heads)]
            return {p.name: [b[i] for b in blocks] for i, p in enumerate(self._rm.HEAD_PARAMS)}
        if isinstance(params, HccsParams):
            if params.heads != self.heads:
                raise ValueError(f"HccsParams: {params.heads} heads, this device has {self.heads}")
            fallback = np.asarray(params.fallback)
            return {"hccs_B": list(params.B), "hccs_S": list(params.S), "hccs_dmax": list(params.dmax),
                    "hccs_mode": [self._rm.HEAD_PARAMS[self._rm.HEAD_INDEX["hccs_mode"]].choices.index(params.mode)]
                    * self.heads,
                    "normaliser": [1 if f else 0 for f in fallback], "exp_mult": list(params.exp_mult)}
        if isinstance(params, Mapping):
            out = {}
            for name, value in params.items():
                if name not in self._rm.HEAD_INDEX:
                    raise ValueError(f"configure: unknown head parameter {name!r}; expected one of "
                                     f"{', '.join(self._rm.HEAD_INDEX)}")
                p = self._rm.HEAD_PARAMS[self._rm.HEAD_INDEX[name]]
                per_head = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value] * self.heads
                if len(per_head) != self.heads:
                    raise ValueError(f"configure: {name} has {len(per_head)} values, expected 1 or {self.heads}")
                if p.choices and any(isinstance(v, str) and v not in p.choices for v in per_head):
                    raise ValueError(f"configure: {name} = {value!r}: expected one of {', '.join(p.choices)}")
                out[name] = [p.choices.index(v) if p.choices and isinstance(v, str) else v for v in per_head]
            return out
        raise TypeError(f"configure: expected SomaConfig, HccsParams, a YAML path or a mapping, got {type(params)}")

    def hccs(self, x: np.ndarray, head: int = 0, mask: np.ndarray | None = None) -> np.ndarray:
        """Integer HCCS of int8 rows with the parameters of ``head``; chunked to the tile's staging memory."""
        if mask is not None:
            raise ValueError("hccs: mask is not supported by the tile's HCCS command (API level "
                             f"{self._info['api_level']}); pass rows without masked elements")
        if not 0 <= head < self.heads:
            raise ValueError(f"hccs: head {head} outside 0..{self.heads - 1}")
        rows = as_int8("x", x, (1, 2))
        flat = rows.reshape(-1, rows.shape[-1])
        n = flat.shape[1]
        if not 1 <= n <= self._info["n_max"]:
            raise ValueError(f"tensor x: rows of {n} elements; the device takes 1..{self._info['n_max']}")
        n_pad = self._rm.padded(n)
        out_row = n_pad * self._hccs_dtype.itemsize
        room = self._info["max_payload"] - 4 - self._rm.HEADER_BYTES
        per_chunk = max(1, min(self._info["staging_bytes"] // n_pad, room // n_pad, room // out_row))
        tile, local = divmod(head, self.tile_heads)
        padded = np.zeros((flat.shape[0], n_pad), np.int8)
        padded[:, :n] = flat
        out = np.empty((flat.shape[0], n), self._hccs_dtype.newbyteorder("="))
        for start in self._chunks(range(0, flat.shape[0], per_chunk), "hccs"):
            block = padded[start:start + per_chunk]
            response = self._tile(tile, self._rm.Opcode.HCCS, local, 0, block.tobytes(), len(block), n)
            got = np.frombuffer(response.payload, self._hccs_dtype).reshape(len(block), n_pad)
            out[start:start + len(block)] = got[:, :n]
        return out.reshape(rows.shape)

    def decode(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """One decode step per token for every head: q, k, v int8 (heads, head_dim) or (T, heads, head_dim)."""
        shape = (self.heads, self.head_dim)
        q8, k8, v8 = (as_int8(name, t, (2, 3), shape) for name, t in (("q", q), ("k", k), ("v", v)))
        if not q8.shape == k8.shape == v8.shape:
            raise ValueError(f"tensors q, k, v: shapes {q8.shape}, {k8.shape}, {v8.shape} differ")
        steps = q8.reshape(-1, *shape), k8.reshape(-1, *shape), v8.reshape(-1, *shape)
        out = np.empty_like(steps[0])
        n_tiles, th = self._info["n_tiles"], self.tile_heads
        qkv = np.stack(steps, axis=2)  # (T, heads, 3, D): the DECODE payload order per head
        for t in self._chunks(range(len(out)), "decode"):
            for tile in range(n_tiles):
                heads = slice(tile * th, (tile + 1) * th)
                response = self._tile(tile, self._rm.Opcode.DECODE, 0, th, qkv[t, heads].tobytes())
                out[t, heads] = np.frombuffer(response.payload[:th * self.head_dim], np.int8).reshape(th, -1)
        return out.reshape(q8.shape)

    def read_state(self) -> dict[str, np.ndarray]:
        """The Soma state of all heads as ``SomaState.to_arrays()`` of an n_heads config (heads in step)."""
        from somatile.hw import tile_model

        params = self._tile_params()
        per_head = []
        for head in range(self.heads):
            tile, local = divmod(head, self.tile_heads)
            data = self._tile(tile, self._rm.Opcode.READ_STATE, local).payload[:self._info["state_bytes"]]
            per_head.append(tile_model.state_to_arrays(params, data, self._gated(head)))
        out = {}
        for name in per_head[0]:
            if per_head[0][name].ndim == 0:
                values = {int(a[name]) for a in per_head}
                if len(values) != 1:
                    raise ProtocolError(f"read_state: heads disagree on {name} ({sorted(values)})")
                out[name] = per_head[0][name]
            else:
                out[name] = np.concatenate([a[name] for a in per_head])
        return out

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Load a state in the layout of ``read_state()`` into every head.

        All or nothing: every array is checked for every head first (names, integer dtype, shape with one
        entry per head, values in the stored type's range, counters in the tile's ranges), ValueError naming
        the array (and head) otherwise; if the device still refuses a head, the heads already loaded get
        their previous state back before the DeviceError is raised."""
        from somatile.hw import tile_model

        params = self._tile_params()
        blocks = [bytes(tile_model.arrays_to_state(params, arrays)) for arrays in self._state_arrays(params, state)]
        previous = []
        for head, data in enumerate(blocks):
            tile, local = divmod(head, self.tile_heads)
            try:
                previous.append(self._tile(tile, self._rm.Opcode.READ_STATE, local).payload[:len(data)])
                self._tile(tile, self._rm.Opcode.LOAD_STATE, local, 0, data)
            except DeviceError:
                for earlier, old in enumerate(previous[:head]):
                    earlier_tile, earlier_local = divmod(earlier, self.tile_heads)
                    self._tile(earlier_tile, self._rm.Opcode.LOAD_STATE, earlier_local, 0, old)
                raise

    def _state_arrays(self, params, state: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """``state`` (the layout of ``read_state()``) split into one checked mapping of arrays per head."""
        from somatile.model import soma

        layout = {name: (shape, np.dtype(dtype)) for name, _, shape, dtype in self._rm.state_layout(params)}
        limits = {"write_pos": params.ring - 1, "fill": params.ring, "step": soma.COUNTER_MAX}
        expected = [n for n in layout if n != "counters"] + list(limits)
        missing = [n for n in expected if n not in state]
        unknown = [n for n in state if n not in expected]
        if missing or unknown:
            raise ValueError(f"load_state: {'missing' if missing else 'unknown'} array "
                             f"{(missing or unknown)[0]!r}; expected {', '.join(expected)}")
        checked = {}
        for name in expected:
            value = np.asarray(state[name])
            if value.dtype.kind not in "iu":
                raise ValueError(f"load_state: array {name!r}: expected integers, got dtype {value.dtype}")
            if name in limits:
                if value.ndim or not 0 <= int(value) <= limits[name]:
                    raise ValueError(f"load_state: {name!r}: expected one integer in 0..{limits[name]} for every "
                                     f"head, got {value.tolist()!r}")
                checked[name] = np.array(value, np.int32)
                continue
            shape, dtype = layout[name]
            shapes = [(self.heads, *shape)] + ([(self.heads, 0)] if name == "gate_field" else [])
            if value.shape not in shapes:
                raise ValueError(f"load_state: array {name!r}: expected shape {' or '.join(map(str, shapes))} "
                                 f"(one entry per head), got {value.shape}")
            info = np.iinfo(dtype)
            outside = np.flatnonzero(((value < info.min) | (value > info.max)).reshape(self.heads, -1).any(axis=1))
            if outside.size:
                raise ValueError(f"load_state: array {name!r}, head {outside[0]}: values outside {dtype} range "
                                 f"[{info.min}, {info.max}]")
            checked[name] = value.astype(dtype)
        return [{n: a if a.ndim == 0 else a[h:h + 1] for n, a in checked.items()} for h in range(self.heads)]

    def reset(self) -> None:
        from somatile.host import protocol

        self.link.request(protocol.Opcode.RESET)

    def _gated(self, head: int) -> bool:
        gating = self._rm.HEAD_PARAMS[self._rm.HEAD_INDEX["gating"]]
        return gating.choices[self._values[head][self._rm.HEAD_INDEX["gating"]]] != "none"

    def _tile_params(self):
        fields = {f.name: self._info[f.name] for f in dataclasses.fields(self._rm.TileParams)}
        fields["hccs_out"] = ["uint8", "int16"][fields["hccs_out"]]
        return self._rm.TileParams(**fields)
