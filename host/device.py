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
`somatile.host.protocol`, and the device that speaks that protocol in `somatile.host.tile_driver`, each
written once for every transport.

This module is the bottom of `somatile.host`: it imports no other module of the package.
"""

from __future__ import annotations

import abc
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


class UnsupportedCommand(DeviceError):
    """The device does not run this command at all (``DeviceInfo.commands`` lacks it: the iCEBreaker's HCCS
    SoC has no decode unit and no state); raised before anything is sent. ``code_name`` is UNSUPPORTED."""

    def __init__(self, command: str, device: str, runs: tuple[str, ...], why: str):
        super().__init__(command, 0, "UNSUPPORTED", 0, f"{device} runs only {', '.join(runs)}; {why}")


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What a device reports about itself.

    A field named after a tile parameter carries that parameter, except ``heads``, which counts the heads of
    the whole device (per tile times tiles); ``hw/tile_params.py`` declares each parameter and where this
    class reports it (``tests/hw/test_tile_params.py`` checks that they agree).

    ``capacity`` is the largest number of logits one HCCS command may carry (the host chunks larger
    tensors); ``max_payload`` the largest wire-frame payload in bytes (0 where there is no wire).
    ``commands``: the names of the tile commands the device runs (``somatile.hw.regmap.Opcode``; every one on a
    tile, the HCCS-only SoC has no DECODE and no state); ``decodes`` says whether decode and the state methods
    work.
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
    profile: str = "paper"
    max_payload: int = 0
    commands: tuple[str, ...] = ()
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def decodes(self) -> bool:
        return {"DECODE", "READ_STATE", "LOAD_STATE", "RESET_STATE"} <= set(self.commands)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        d["decodes"] = self.decodes
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


def as_integers(name: str, x: Any, ndim: tuple[int, ...], dtype, shape_tail: tuple[int, ...] = ()) -> np.ndarray:
    """Check that tensor ``name`` is integer with values in the range of ``dtype`` (a signed integer type)
    and one of ``ndim`` dimensions.

    ``shape_tail`` (if given) must equal the trailing dimensions. Returns a C-contiguous copy or view of
    type ``dtype``.
    """
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"tensor {name}: expected {dtype} values, got dtype {a.dtype}")
    if a.ndim not in ndim:
        raise ValueError(f"tensor {name}: expected {' or '.join(map(str, ndim))} dimensions, got shape {a.shape}")
    if shape_tail and tuple(a.shape[-len(shape_tail):]) != tuple(shape_tail):
        raise ValueError(f"tensor {name}: expected trailing shape {tuple(shape_tail)}, got shape {a.shape}")
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise ValueError(f"tensor {name}: values outside {dtype} range [{info.min}, {info.max}]")
    return np.ascontiguousarray(a, dtype=dtype)


def as_int8(name: str, x: Any, ndim: tuple[int, ...], shape_tail: tuple[int, ...] = ()) -> np.ndarray:
    """:func:`as_integers` for int8 (the tile's q, k, v and the paper profile's logits)."""
    return as_integers(name, x, ndim, np.int8, shape_tail)


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
