"""The host <-> firmware wire protocol (docs/protocol.md): frames, the stream parser, both ends of the link.

Frame (all integers little-endian)::

    offset 0  magic      2 bytes  0x53 0x54 ("ST")
    offset 2  api_level  u8       must equal the device's API level (somatile.hw.regmap.API_LEVEL)
    offset 3  opcode     u8       request opcode; a response carries opcode | 0x80; an error frame 0xFF
    offset 4  seq        u16      sequence number; a response repeats the seq of its request
    offset 6  length     u32      payload bytes, at most the device's max_payload
    offset 10 payload    length bytes
    then      crc32      u32      CRC-32 (IEEE 802.3, zlib.crc32) of header and payload

Every request gets exactly one answer: the response (opcode | 0x80) or an error frame (opcode 0xFF, payload
``code u8, request opcode u8, request seq u16, detail u32``). The device remembers the seq and the answer of
the last request it executed: a repeat of that seq (a retry) gets the same answer again without executing
twice, so a retried decode step never advances the Soma state twice; a retry repeats opcode and payload
too (the device compares a CRC-32 of the payload), anything else under that seq is a new request. Any other
seq than last + 1 is refused with SEQUENCE (detail: the expected seq). HELLO is accepted with any seq and sets
the expected sequence.

The parser (`FrameParser`) is the reference for the C firmware's parser (firmware/src/frame.c): both consume
the same byte stream into the same frames and error events, which the tests check byte for byte.
`DeviceEndpoint` is the device end in Python, `WireLink` the host end.

Layer: above the device API (`somatile.host.device`, the only module of the package imported here), below
the tile driver (`somatile.host.tile_driver`), which carries tile commands in TILE requests.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import time
import zlib
from collections.abc import Callable, Mapping

from somatile.host.device import DeviceError, DeviceTimeout, ProtocolError, Transport
from somatile.hw.tile_params import TILE_PARAMS

MAGIC = b"ST"
HEADER = struct.Struct("<2sBBHI")
HEADER_SIZE = HEADER.size
CRC_SIZE = 4
RESPONSE_FLAG = 0x80
ERROR_OPCODE = 0xFF
ERROR_PAYLOAD = struct.Struct("<BBHI")
# Largest payload of the reference device and of the firmware's host build (FW_MAX_PAYLOAD in
# firmware/include/fw.h defaults to this value through the generated WIRE_DEFAULT_MAX_PAYLOAD).
DEFAULT_MAX_PAYLOAD = 65536
# A frame whose bytes stop arriving for this long is dropped as truncated (device side).
DEFAULT_INTERBYTE_TIMEOUT = 0.2


class Opcode(enum.IntEnum):
    """Link-level requests (payload -> response payload). Tile indices and heads are u32, device-global."""

    HELLO = 0x01  # empty -> device info (INFO_FORMAT); sets the expected sequence number
    TILE = 0x02  # u32 tile index + one tile command frame (hw/regmap.py) -> the tile's response frame
    CONFIGURE = 0x03  # u32 head + the head's parameter registers (u32 each, HEAD_PARAMS order) -> empty
    RESET = 0x04  # empty -> empty: every tile's Soma state and latched error cleared; parameters kept


class LinkError(enum.IntEnum):
    """Error codes of the error frame (the tile's own error codes travel inside TILE responses)."""

    BAD_CRC = 1  # CRC-32 mismatch: the frame was dropped; retry with the same seq
    TRUNCATED = 2  # the frame stopped arriving mid-way: dropped; retry with the same seq
    OVERSIZE = 3  # length above max_payload (detail: max_payload): header dropped, the rest hunted for magic
    WRONG_API_LEVEL = 4  # frame or tile at another API level (detail: the level the device expects)
    UNKNOWN_OPCODE = 5  # detail: the opcode
    BAD_LENGTH = 6  # payload length wrong for the opcode (detail: the expected length or granule)
    SEQUENCE = 7  # detail: the expected seq
    BAD_TILE = 8  # tile index or head outside the device (detail: the number of tiles or heads)
    TILE_TIMEOUT = 9  # the tile did not finish its answer in time (detail: bytes received)
    TILE_OVERFLOW = 10  # the tile's answer exceeded max_payload (detail: max_payload); drained
    TILE_REFUSED = 11  # a tile command of HELLO/CONFIGURE/RESET failed (detail: the tile's error code)
    TILE_BAD_ANSWER = 12  # the tile's answer to a firmware-made command was malformed (detail: its length)


# Errors after which the host resends the same frame: the device dropped it before executing. The host never
# sends a length above max_payload, so OVERSIZE for its seq means the length was damaged on the way.
RETRYABLE = frozenset({LinkError.BAD_CRC, LinkError.TRUNCATED, LinkError.OVERSIZE})

# HELLO response: api_level and max_payload, then the INFO registers of tile 0 named in TILE_INFO_REGISTERS
# (the tile parameters INFO reports, from their one declaration, then two derived sizes and the mask of the tile
# commands the device runs; the firmware reads them through REG_READ), u32 each, then the board name (16 bytes,
# NUL padded).
TILE_INFO_REGISTERS = (*(name for name, p in TILE_PARAMS.items() if p.info), "state_bytes", "staging_bytes",
                       "commands")
INFO_FIELDS = ("api_level", "max_payload") + TILE_INFO_REGISTERS
BOARD_NAME_BYTES = 16
INFO_FORMAT = struct.Struct(f"<{len(INFO_FIELDS)}I{BOARD_NAME_BYTES}s")
TILE_PREFIX = struct.Struct("<I")


def pack_info(info: Mapping[str, int], board: str) -> bytes:
    name = board.encode("ascii", "replace")[:BOARD_NAME_BYTES]
    return INFO_FORMAT.pack(*(int(info[f]) for f in INFO_FIELDS), name)


def unpack_info(payload: bytes) -> dict:
    values = INFO_FORMAT.unpack(payload)
    info: dict = dict(zip(INFO_FIELDS, values[:-1]))
    info["board"] = values[-1].rstrip(b"\0").decode("ascii", "replace")
    return info


def encode_frame(api_level: int, opcode: int, seq: int, payload: bytes = b"") -> bytes:
    """One frame: header, payload, CRC-32 of both."""
    head = HEADER.pack(MAGIC, api_level, opcode, seq & 0xFFFF, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(head))
    return b"".join((head, payload, crc.to_bytes(4, "little")))


def encode_error(api_level: int, code: int, opcode: int, seq: int, detail: int = 0) -> bytes:
    return encode_frame(api_level, ERROR_OPCODE, seq,
                        ERROR_PAYLOAD.pack(int(code), opcode & 0xFF, seq & 0xFFFF, detail & 0xFFFFFFFF))


@dataclasses.dataclass(frozen=True)
class Frame:
    api_level: int
    opcode: int
    seq: int
    payload: bytes


@dataclasses.dataclass(frozen=True)
class BadFrame:
    """A frame the parser dropped: ``code`` is a LinkError; opcode/seq come from the header when it was read."""

    code: LinkError
    opcode: int
    seq: int
    detail: int = 0


class FrameParser:
    """Incremental frame parser: ``feed(bytes)`` returns the frames and dropped-frame events completed.

    Semantics (mirrored by firmware/src/frame.c): skip bytes up to the first "ST"; read the 10-byte header;
    a length above ``max_payload`` drops the header (OVERSIZE) and the search resumes after it; otherwise
    read payload and CRC; a CRC mismatch drops the frame (BAD_CRC) and the search resumes after it.
    ``expire()`` (called when no byte came for the inter-byte timeout) drops a partly read frame
    (TRUNCATED); a lone magic byte is dropped silently.
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD):
        self.max_payload = max_payload
        self._buf = bytearray()

    @property
    def mid_frame(self) -> bool:
        return len(self._buf) > 1 or self._buf == MAGIC[:1]

    def feed(self, data: bytes) -> list[Frame | BadFrame]:
        self._buf += data
        events: list[Frame | BadFrame] = []
        while True:
            start = self._buf.find(MAGIC)
            if start < 0:
                keep = 1 if self._buf[-1:] == MAGIC[:1] else 0
                del self._buf[:len(self._buf) - keep]
                return events
            del self._buf[:start]
            if len(self._buf) < HEADER_SIZE:
                return events
            _, api, opcode, seq, length = HEADER.unpack_from(self._buf)
            if length > self.max_payload:
                events.append(BadFrame(LinkError.OVERSIZE, opcode, seq, self.max_payload))
                del self._buf[:HEADER_SIZE]
                continue
            end = HEADER_SIZE + length
            if len(self._buf) < end + CRC_SIZE:
                return events
            crc = int.from_bytes(self._buf[end:end + CRC_SIZE], "little")
            if zlib.crc32(memoryview(self._buf)[:end]) != crc:
                events.append(BadFrame(LinkError.BAD_CRC, opcode, seq))
            else:
                events.append(Frame(api, opcode, seq, bytes(self._buf[HEADER_SIZE:end])))
            del self._buf[:end + CRC_SIZE]

    def expire(self) -> list[BadFrame]:
        """The inter-byte timeout passed: drop the partial frame."""
        events = []
        if len(self._buf) >= HEADER_SIZE:
            _, _, opcode, seq, _ = HEADER.unpack_from(self._buf)
            events.append(BadFrame(LinkError.TRUNCATED, opcode, seq))
        elif len(self._buf) > 1:
            events.append(BadFrame(LinkError.TRUNCATED, 0, 0))
        self._buf.clear()
        return events


class CommandError(Exception):
    """Raised by a device-side command handler: answered with an error frame (code, detail)."""

    def __init__(self, code: LinkError, detail: int = 0):
        super().__init__(f"{code.name} (detail {detail})")
        self.code, self.detail = code, detail


class DeviceEndpoint:
    """The device side of the protocol in Python: the reference the C firmware's dispatch is checked against,
    and the far end of the in-process emu:// link.

    ``handlers`` maps a request opcode to ``fn(payload) -> response payload``; a handler raises
    `CommandError` for a refused command. ``feed(bytes)`` and ``expire()`` return the bytes to send back.
    """

    def __init__(self, api_level: int, handlers: Mapping[int, Callable[[bytes], bytes]],
                 max_payload: int = DEFAULT_MAX_PAYLOAD):
        self.api_level = api_level
        self.handlers = dict(handlers)
        self.parser = FrameParser(max_payload)
        self.last_seq: int | None = None
        self.last_opcode: int | None = None
        self.last_crc = 0  # of the cached request's payload: a retry must repeat the payload too
        self.last_answer = b""

    def feed(self, data: bytes) -> bytes:
        return b"".join(self._answer(event) for event in self.parser.feed(data))

    def expire(self) -> bytes:
        return b"".join(self._answer(event) for event in self.parser.expire())

    def _answer(self, event: Frame | BadFrame) -> bytes:
        if isinstance(event, BadFrame):
            return encode_error(self.api_level, event.code, event.opcode, event.seq, event.detail)
        if event.api_level != self.api_level:
            return encode_error(self.api_level, LinkError.WRONG_API_LEVEL, event.opcode, event.seq,
                                self.api_level)
        if event.opcode == Opcode.HELLO:
            self.last_seq = None
        elif (self.last_seq is not None and event.seq == self.last_seq and event.opcode == self.last_opcode
              and zlib.crc32(event.payload) == self.last_crc):
            # A retry repeats the whole request; the same seq with another opcode or payload is a new request
            # that reused a number, refused below with SEQUENCE rather than answered with another's result.
            return self.last_answer
        elif self.last_seq is None or event.seq != (self.last_seq + 1) & 0xFFFF:
            expected = 0 if self.last_seq is None else (self.last_seq + 1) & 0xFFFF
            return encode_error(self.api_level, LinkError.SEQUENCE, event.opcode, event.seq, expected)
        handler = self.handlers.get(event.opcode)
        try:
            if handler is None:
                raise CommandError(LinkError.UNKNOWN_OPCODE, event.opcode)
            answer = encode_frame(self.api_level, event.opcode | RESPONSE_FLAG, event.seq, handler(event.payload))
        except CommandError as exc:
            answer = encode_error(self.api_level, exc.code, event.opcode, event.seq, exc.detail)
        self.last_seq, self.last_opcode, self.last_answer = event.seq, event.opcode, answer
        self.last_crc = zlib.crc32(event.payload)
        return answer


class WireLink:
    """The host side of the protocol over any `Transport`: one request at a time, each acknowledged.

    ``request(opcode, payload) -> response payload``. A lost, truncated or corrupted frame in either
    direction is retried (same seq, so the device answers a repeat from its cache) up to ``retries`` times;
    then `DeviceTimeout`. An error frame for the request raises `DeviceError` naming the opcode and code.
    ``timeout`` must be a positive finite number of seconds and ``retries`` a non-negative integer
    (ValueError otherwise). After ``close()`` every request raises ValueError.
    """

    def __init__(self, transport: Transport, api_level: int, *, timeout: float = 2.0, retries: int = 3,
                 max_payload: int = DEFAULT_MAX_PAYLOAD):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"timeout = {timeout!r}: expected a positive finite number of seconds")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries = {retries!r}: expected a non-negative integer")
        self.closed = False
        self.transport = transport
        self.api_level = api_level
        self.timeout = timeout
        self.retries = retries
        self.max_payload = max_payload
        self.seq = 0
        self.retried = 0  # frames resent over the life of the link (for tests and statistics)

    def hello(self) -> dict:
        """Synchronise the sequence number and read the device info (raises on a wrong API level)."""
        self.seq = 0
        payload = self.request(Opcode.HELLO, b"", _first=True)
        if len(payload) != INFO_FORMAT.size:
            raise ProtocolError(f"HELLO: expected {INFO_FORMAT.size} bytes of device info, got {len(payload)}")
        return unpack_info(payload)

    def close(self) -> None:
        self.closed = True
        self.transport.close()

    def request(self, opcode: int, payload: bytes = b"", *, _first: bool = False) -> bytes:
        if self.closed:
            raise ValueError(f"{_name(opcode)}: the device is closed")
        if len(payload) > self.max_payload:
            raise ValueError(f"{_name(opcode)}: payload of {len(payload)} bytes exceeds the device's "
                             f"max_payload {self.max_payload}; chunk it")
        if not _first:
            self.seq = (self.seq + 1) & 0xFFFF
        frame = encode_frame(self.api_level, opcode, self.seq, payload)
        parser = FrameParser(max(self.max_payload, INFO_FORMAT.size))
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
                self.transport.discard_input()
            self.transport.write(frame)
            answer = self._await(parser, opcode)
            if answer is not None:
                return answer
        raise DeviceTimeout(f"{_name(opcode)} (seq {self.seq}): no valid answer after {self.retries + 1} "
                            f"attempts of {self.timeout} s each")

    def _await(self, parser: FrameParser, opcode: int) -> bytes | None:
        """The answer to the current request, or None when it should be resent."""
        deadline = time.monotonic() + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            chunk = self.transport.read(65536, left)
            if not chunk:
                break
            for event in parser.feed(chunk):
                if isinstance(event, BadFrame) or event.seq != self.seq:
                    continue  # a damaged or stale answer (e.g. the late reply to an earlier attempt)
                if event.opcode == opcode | RESPONSE_FLAG:
                    return event.payload
                if event.opcode == ERROR_OPCODE and len(event.payload) == ERROR_PAYLOAD.size:
                    code, req_opcode, _, detail = ERROR_PAYLOAD.unpack(event.payload)
                    if code in RETRYABLE:
                        return None
                    raise _link_error(opcode, code, detail, self.api_level)
                raise ProtocolError(f"{_name(opcode)} (seq {self.seq}): unexpected answer opcode "
                                    f"0x{event.opcode:02x}")
        parser.expire()
        return None


def _name(opcode: int) -> str:
    try:
        return Opcode(opcode).name
    except ValueError:
        return f"opcode 0x{opcode:02x}"


def _link_error(opcode: int, code: int, detail: int, host_level: int) -> Exception:
    try:
        name = LinkError(code).name
    except ValueError:
        name = f"UNKNOWN_ERROR_{code}"
    if code == LinkError.WRONG_API_LEVEL:
        return ProtocolError(f"{_name(opcode)}: the device speaks API level {detail}, this host API level "
                             f"{host_level}; update the host package or the firmware")
    if code == LinkError.SEQUENCE:
        return ProtocolError(f"{_name(opcode)}: the device expected sequence number {detail}; "
                             f"reconnect (HELLO) to resynchronise")
    return DeviceError(_name(opcode), code, name, detail)


def c_header() -> str:
    """The wire-protocol constants for the firmware (firmware/build/<board>/gen/somatile_wire.h): one source."""
    lines = ["/* Generated by `python -m somatile.host.protocol --c-header`; do not edit. */",
             "#ifndef SOMATILE_WIRE_H", "#define SOMATILE_WIRE_H", "",
             f"#define WIRE_MAGIC0 0x{MAGIC[0]:02X}u", f"#define WIRE_MAGIC1 0x{MAGIC[1]:02X}u",
             f"#define WIRE_HEADER_SIZE {HEADER_SIZE}u", f"#define WIRE_CRC_SIZE {CRC_SIZE}u",
             f"#define WIRE_RESPONSE_FLAG 0x{RESPONSE_FLAG:02X}u", f"#define WIRE_ERROR_OPCODE 0x{ERROR_OPCODE:02X}u",
             f"#define WIRE_ERROR_PAYLOAD_SIZE {ERROR_PAYLOAD.size}u",
             f"#define WIRE_DEFAULT_MAX_PAYLOAD {DEFAULT_MAX_PAYLOAD}u",
             f"#define WIRE_INTERBYTE_TIMEOUT_MS {round(DEFAULT_INTERBYTE_TIMEOUT * 1000)}u",
             f"#define WIRE_INFO_FIELDS {len(INFO_FIELDS)}u", f"#define WIRE_BOARD_NAME_BYTES {BOARD_NAME_BYTES}u",
             f"#define WIRE_INFO_SIZE {INFO_FORMAT.size}u", f"#define WIRE_TILE_PREFIX_SIZE {TILE_PREFIX.size}u", ""]
    lines += [f"#define WIRE_OP_{op.name} 0x{int(op):02X}u" for op in Opcode]
    lines += [""] + [f"#define WIRE_ERR_{e.name} {int(e)}u" for e in LinkError]
    lines += [""] + [f"#define WIRE_INFO_{name.upper()} {i}u" for i, name in enumerate(INFO_FIELDS)]
    lines += ["/* the tile INFO registers HELLO reports, after api_level and max_payload */",
              "#define WIRE_INFO_REGISTERS " + ", ".join(f"SOMATILE_REG_INFO_{n.upper()}" for n in TILE_INFO_REGISTERS),
              f"#define WIRE_INFO_REGISTER_COUNT {len(TILE_INFO_REGISTERS)}u"]
    lines += ["", "#endif", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    import pathlib

    cli = argparse.ArgumentParser(description="write the wire-protocol C header for the firmware")
    cli.add_argument("--c-header", required=True, metavar="PATH")
    path = pathlib.Path(cli.parse_args().c_header)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(c_header())
