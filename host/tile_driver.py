"""The tile driver: the `Device` that speaks the wire protocol to the firmware, over any `Transport`.

`TileDevice` turns the device API (`somatile.host.device`) into tile command frames (``somatile.hw.regmap``)
carried by `somatile.host.protocol.WireLink`. It is written once: emu://, tcp://, serial://, sim:// and
metal:// each give `open_transport` their own byte stream and get this driver back, so every backend runs
the same host code. `link_options` reads the wire-link options (``timeout``, ``retries``) of a device URL.

Layers (each imports only those before it): `somatile.host.device` (the API and its errors) ->
`somatile.host.protocol` (frames, CRC, parser, both link ends) -> this module -> the links
(`transport_tcp`, `transport_serial`, `emu`, `sim_backend`, `metal_backend`), which `somatile.host.open`
picks by URL scheme.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import urllib.parse
from collections.abc import Mapping
from typing import Any

import numpy as np

from somatile.host import protocol, url_options
from somatile.host.device import (Device, DeviceError, DeviceInfo, ProtocolError, Transport, UnsupportedCommand,
                                  as_int8, as_integers)
from somatile.hw import regmap
from somatile.hw.tile_params import TILE_PARAMS


def link_options(parts: urllib.parse.SplitResult, allowed: set[str], options: dict) -> tuple[dict, dict]:
    """Split a URL's query into WireLink options (timeout, retries) and the rest; unknown keys are errors."""
    query = url_options(parts)
    unknown = set(query) - allowed - {"timeout", "retries"}
    if unknown:
        raise ValueError(f"device URL {parts.geturl()!r}: unknown option(s) {sorted(unknown)}; expected "
                         f"{sorted(allowed | {'timeout', 'retries'})}")
    link = dict(options)
    for name, kind in (("timeout", float), ("retries", int)):
        if name in query:
            text = query.pop(name)
            try:
                link[name] = kind(text)
            except ValueError:
                raise ValueError(f"device URL {parts.geturl()!r}: option {name}={text!r}: expected "
                                 f"{'seconds' if kind is float else 'an integer'}") from None
    return link, query


def open_transport(transport: Transport, backend: str, **options) -> "TileDevice":
    """The host driver (`TileDevice`) over any byte transport speaking the wire protocol; ``options`` are the
    `WireLink` options and ``progress``. The transport is closed if the device cannot be opened."""
    progress = options.pop("progress", None)
    try:
        return TileDevice(protocol.WireLink(transport, regmap.API_LEVEL, **options), backend=backend,
                          progress=progress)
    except BaseException:
        transport.close()
        raise


class TileDevice(Device):
    """The host driver of the tile command layer over the wire protocol (`somatile.host.protocol.WireLink`).

    Written once for every byte transport: emu:// (in-process), tcp://, serial://, sim:// and metal:// all
    construct this class around their own `Transport` (through `open_transport`). ``progress``: show tqdm bars for chunked transfers (None: only
    when more than ``progress_min`` chunks).
    """

    def __init__(self, link, backend: str, *, progress: bool | None = None, progress_min: int = 64):
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
        fields = {f.name: TILE_PARAMS[f.name].value_of(info[f.name]) for f in dataclasses.fields(regmap.TileParams)}
        self._params = regmap.TileParams(**fields)
        self.profile = self._params.profile
        self._head_params = regmap.PROFILE_HEAD_PARAMS[self.profile]
        self._values = [[p.default for p in self._head_params] for _ in range(self.heads)]
        self._configured: list[bool] = [False] * self.heads
        self._hccs_dtype = regmap.hccs_out_dtype(self._params)
        self._out_dtype = np.dtype("<i2" if self.profile == "wide" else np.int8)
        self.commands = tuple(op.name for op in regmap.Opcode if info["commands"] >> op & 1)

    def info(self) -> DeviceInfo:
        i = self._info
        room = i["max_payload"] - 4 - regmap.HEADER_BYTES
        return DeviceInfo(backend=self.backend, board=i["board"], api_level=i["api_level"], lanes=i["lanes"],
                          heads=self.heads, kv_heads=self.heads, head_dim=i["head_dim"], ring=i["ring"],
                          sinks=i["sinks"], n_max=i["n_max"], profile=self.profile,
                          capacity=min(i["staging_bytes"], room) // regmap.element_bytes(self.tile_params()),
                          max_payload=i["max_payload"], commands=self.commands,
                          extra={k: i[k] for k in ("stream_width", "n_tiles", "state_bytes", "staging_bytes")})

    def close(self) -> None:
        """Close the link; every later call on this device raises ValueError (closing again does nothing)."""
        self.link.close()
        while self.on_close:
            self.on_close.pop(0)()

    def _require(self, method: str, *opcodes: regmap.Opcode) -> None:
        """UnsupportedCommand naming the device and ``method`` unless the device runs every one of ``opcodes``."""
        missing = [op.name for op in opcodes if op.name not in self.commands]
        if missing:
            raise UnsupportedCommand(f"{method}()", f"{self.backend} (board {self._info['board']})", self.commands,
                                     f"it has no {', '.join(missing)} (no decode unit: an HCCS-only SoC, "
                                     f"docs/firmware.md); use hccs() here, decode on a board with a tile")

    def tile_command(self, tile: int, opcode, head: int = 0, count: int = 0, payload: bytes = b"", arg0: int = 0,
                     arg1: int = 0) -> regmap.Response:
        """One tile command (``somatile.hw.regmap.Opcode``) to ``tile``, sent as is: the tile command layer under
        the device API, for tools and tests. Returns the tile's response; an error response raises `DeviceError`
        naming the command, the tile and the head, a malformed one `ProtocolError`."""
        frame = protocol.TILE_PREFIX.pack(tile) + regmap.pack_command(opcode, head, count, payload, arg0, arg1)
        answer = self.link.request(protocol.Opcode.TILE, frame)
        try:
            response = regmap.unpack_response(answer)
        except ValueError as exc:
            raise ProtocolError(f"tile {tile} {regmap.Opcode(opcode).name}: {exc}") from None
        if response.error:
            code = regmap.ErrorCode(response.error)
            raise DeviceError(regmap.Opcode(opcode).name, int(code), code.name, response.result,
                              f"tile {tile}, head {head}: {regmap.ERROR_TEXT[code]}")
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
        if profile is not None and profile != self.profile:
            raise ValueError(f"configure: the parameters are for integer profile {profile!r}; this device "
                             f"({self._info['board']}) was built for profile {self.profile!r} (docs/numerics.md; "
                             f"calibrate with --profile {self.profile}, or SomaConfig(profile={self.profile!r}))")
        updates = self._parameter_updates(params)
        blocks = []
        for head in range(self.heads):
            values = list(self._values[head])
            for name, per_head in updates.items():
                values[regmap.HEAD_INDEX[name]] = per_head[head]
            self._check_head_block(head, values, params)
            blocks.append(values)
        for head, values in enumerate(blocks):
            try:
                self.configure_head(head, values)
            except DeviceError:
                for earlier in range(head):
                    self.configure_head(earlier, self._values[earlier])
                raise
        self._values = blocks
        self._configured = [True] * self.heads

    def configure_head(self, head: int, values: list[int]) -> None:
        """Send one head's register block (``HEAD_PARAMS`` order) without the host-side checks of `configure`
        (the device's own checks still apply: a refused block raises `DeviceError` naming the head)."""
        try:
            self.link.request(protocol.Opcode.CONFIGURE, struct.pack(f"<I{len(values)}I", head, *values))
        except DeviceError as exc:
            if exc.code_name == "TILE_REFUSED":
                code = regmap.ErrorCode(exc.detail)
                raise DeviceError("CONFIGURE", exc.code, exc.code_name, exc.detail,
                                  f"head {head} refused its parameters ({code.name}: "
                                  f"{regmap.ERROR_TEXT[code]}): "
                                  f"{dict(zip(regmap.HEAD_INDEX, values))}") from None
            raise

    def _check_head_block(self, head: int, values: list, params: Any) -> None:
        """ValueError naming ``head`` unless ``values`` (HEAD_PARAMS order) is a block the tile accepts."""
        from somatile.hw import tile_model

        for p, value in zip(self._head_params, values):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"configure: head {head}: register {p.name} = {value!r}: expected an integer "
                                 f"{p.lo}..{p.hi}" + (f" or one of {', '.join(p.choices)}" if p.choices else ""))
        try:
            tile_model.head_config(self.tile_params(), values)
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
            from somatile.hw import tile_model

            blocks = [tile_model.head_values(params, h) for h in range(self.heads)]
            return {p.name: [b[i] for b in blocks] for i, p in enumerate(self._head_params)}
        if isinstance(params, HccsParams):
            if params.heads != self.heads:
                raise ValueError(f"HccsParams: {params.heads} heads, this device has {self.heads}")
            fallback_heads = np.flatnonzero(params.fallback).tolist()
            if fallback_heads and params.fallback_exp != "somatile":
                raise ValueError(f"HccsParams: key 'fallback_exp': {params.fallback_exp!r} for fallback heads "
                                 f"{fallback_heads}, but the tile runs somatile's integer exp (calibrate with "
                                 f"--fallback-exp somatile for this device)")
            fallback = np.asarray(params.fallback)
            choices = {p.name: p.choices for p in self._head_params}
            normaliser = [choices["normaliser"].index("exp_int" if f else params.normaliser + "_int")
                          for f in fallback]
            updates = {"hccs_B": list(params.B), "hccs_S": list(params.S), "hccs_dmax": list(params.dmax),
                       "hccs_mode": [choices["hccs_mode"].index(params.mode)] * self.heads,
                       "normaliser": normaliser}
            if self.profile == "paper":  # the wide integer exp takes no input scale
                updates["exp_mult"] = list(params.exp_mult)
            return updates
        if isinstance(params, Mapping):
            out = {}
            for name, value in params.items():
                if name not in regmap.HEAD_INDEX:
                    raise ValueError(f"configure: unknown head parameter {name!r}; expected one of "
                                     f"{', '.join(regmap.HEAD_INDEX)}")
                p = self._head_params[regmap.HEAD_INDEX[name]]
                per_head = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value] * self.heads
                if len(per_head) != self.heads:
                    raise ValueError(f"configure: {name} has {len(per_head)} values, expected 1 or {self.heads}")
                if p.choices and any(isinstance(v, str) and v not in p.choices for v in per_head):
                    raise ValueError(f"configure: {name} = {value!r}: expected one of {', '.join(p.choices)}")
                out[name] = [p.choices.index(v) if p.choices and isinstance(v, str) else v for v in per_head]
            return out
        raise TypeError(f"configure: expected SomaConfig, HccsParams, a YAML path or a mapping, got {type(params)}")

    def hccs(self, x: np.ndarray, head: int = 0, mask: np.ndarray | None = None) -> np.ndarray:
        """The tile's row normaliser with the parameters of ``head``, chunked to the tile's staging memory:
        integer HCCS of int8 rows (profile paper), or the head's wide normaliser of int16 rows into Q15
        uint16 (profile wide)."""
        if mask is not None:
            raise ValueError("hccs: mask is not supported by the tile's HCCS command (API level "
                             f"{self._info['api_level']}); pass rows without masked elements")
        if not 0 <= head < self.heads:
            raise ValueError(f"hccs: head {head} outside 0..{self.heads - 1}")
        rows = as_integers("x", x, (1, 2), np.int16 if self.profile == "wide" else np.int8)
        flat = rows.reshape(-1, rows.shape[-1])
        n = flat.shape[1]
        if not 1 <= n <= self._info["n_max"]:
            raise ValueError(f"tensor x: rows of {n} elements; the device takes 1..{self._info['n_max']}")
        row_bytes = regmap.hccs_row_bytes(self.tile_params(), n)
        n_pad = row_bytes // rows.itemsize
        out_row = n_pad * self._hccs_dtype.itemsize
        room = self._info["max_payload"] - 4 - regmap.HEADER_BYTES
        per_chunk = max(1, min(self._info["staging_bytes"] // row_bytes, room // row_bytes, room // out_row))
        tile, local = divmod(head, self.tile_heads)
        padded = np.zeros((flat.shape[0], n_pad), rows.dtype.newbyteorder("<"))
        padded[:, :n] = flat
        out = np.empty((flat.shape[0], n), self._hccs_dtype.newbyteorder("="))
        for start in self._chunks(range(0, flat.shape[0], per_chunk), "hccs"):
            block = padded[start:start + per_chunk]
            response = self.tile_command(tile, regmap.Opcode.HCCS, local, 0, block.tobytes(), len(block), n)
            got = np.frombuffer(response.payload, self._hccs_dtype).reshape(len(block), n_pad)
            out[start:start + len(block)] = got[:, :n]
        return out.reshape(rows.shape)

    def decode(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """One decode step per token for every head: q, k, v int8 (heads, head_dim) or (T, heads, head_dim);
        the output int8 (profile paper) or int16 (profile wide) of the same shape."""
        self._require("decode", regmap.Opcode.DECODE)
        shape = (self.heads, self.head_dim)
        q8, k8, v8 = (as_int8(name, t, (2, 3), shape) for name, t in (("q", q), ("k", k), ("v", v)))
        if not q8.shape == k8.shape == v8.shape:
            raise ValueError(f"tensors q, k, v: shapes {q8.shape}, {k8.shape}, {v8.shape} differ")
        steps = q8.reshape(-1, *shape), k8.reshape(-1, *shape), v8.reshape(-1, *shape)
        out = np.empty(steps[0].shape, self._out_dtype.newbyteorder("="))
        n_tiles, th = self._info["n_tiles"], self.tile_heads
        qkv = np.stack(steps, axis=2)  # (T, heads, 3, D): the DECODE payload order per head
        for t in self._chunks(range(len(out)), "decode"):
            for tile in range(n_tiles):
                heads = slice(tile * th, (tile + 1) * th)
                response = self.tile_command(tile, regmap.Opcode.DECODE, 0, th, qkv[t, heads].tobytes())
                got = response.payload[:th * self.head_dim * self._out_dtype.itemsize]
                out[t, heads] = np.frombuffer(got, self._out_dtype).reshape(th, -1)
        return out.reshape(q8.shape)

    def read_state(self) -> dict[str, np.ndarray]:
        """The Soma state of all heads as ``SomaState.to_arrays()`` of an n_heads config (heads in step)."""
        from somatile.hw import tile_model

        self._require("read_state", regmap.Opcode.READ_STATE)
        params = self.tile_params()
        per_head = []
        for head in range(self.heads):
            tile, local = divmod(head, self.tile_heads)
            data = self.tile_command(tile, regmap.Opcode.READ_STATE, local).payload[:self._info["state_bytes"]]
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

        self._require("load_state", regmap.Opcode.READ_STATE, regmap.Opcode.LOAD_STATE)
        params = self.tile_params()
        blocks = [bytes(tile_model.arrays_to_state(params, arrays)) for arrays in self._state_arrays(params, state)]
        previous = []
        for head, data in enumerate(blocks):
            tile, local = divmod(head, self.tile_heads)
            try:
                previous.append(self.tile_command(tile, regmap.Opcode.READ_STATE, local).payload[:len(data)])
                self.tile_command(tile, regmap.Opcode.LOAD_STATE, local, 0, data)
            except DeviceError:
                for earlier, old in enumerate(previous[:head]):
                    earlier_tile, earlier_local = divmod(earlier, self.tile_heads)
                    self.tile_command(earlier_tile, regmap.Opcode.LOAD_STATE, earlier_local, 0, old)
                raise

    def _state_arrays(self, params, state: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """``state`` (the layout of ``read_state()``) split into one checked mapping of arrays per head."""
        from somatile.model import soma

        layout = {name: (shape, np.dtype(dtype)) for name, _, shape, dtype in regmap.state_layout(params)}
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
        self.link.request(protocol.Opcode.RESET)

    def _gated(self, head: int) -> bool:
        gating = self._head_params[regmap.HEAD_INDEX["gating"]]
        return gating.choices[self._values[head][regmap.HEAD_INDEX["gating"]]] != "none"

    def tile_params(self) -> regmap.TileParams:
        """The tile parameters the device reported at HELLO."""
        return self._params
