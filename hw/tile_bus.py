"""The tile bus of the firmware's host build: tile command frames over a TCP connection.

On a board the firmware reaches a tile through the tile's AXI4-Stream ports; in its host build
(firmware/hal/host/hal_host.c) through a TCP connection to a tile server: the golden tile models
(`somatile.host.emu.serve_tiles`) or the tile RTL in Verilator (`somatile.sim.serve_tile`). Both servers and
any Python client frame the bytes with this module, the one Python statement of the framing (the C side is
hal_host.c). All integers little-endian::

    request  u8 kind (KIND_COMMAND = 1), u8 tile, u16 0, u32 length, then one tile command frame
             (somatile.hw.regmap) of length bytes
    answer   u32 length, then the tile's response frame

One request at a time: the server answers before it reads the next. A connection that closes between
requests ends the session; a request of another kind, for a tile the server does not have, or cut short is
a broken link (`ConnectionError`).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Sequence

REQUEST = struct.Struct("<BBHI")
ANSWER = struct.Struct("<I")
KIND_COMMAND = 1


def recv_exact(connection: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``connection``, or fewer if it closes first (the caller checks the length)."""
    parts, have = [], 0
    while have < n:
        chunk = connection.recv(n - have)
        if not chunk:
            break
        parts.append(chunk)
        have += len(chunk)
    return b"".join(parts)


def read_request(connection: socket.socket, n_tiles: int) -> tuple[int, bytes] | None:
    """The next request as (tile, command frame); None when the connection closed before a whole request
    header; `ConnectionError` for a malformed request (the server has tiles 0..n_tiles-1)."""
    head = recv_exact(connection, REQUEST.size)
    if len(head) < REQUEST.size:
        return None
    kind, tile, _, length = REQUEST.unpack(head)
    frame = recv_exact(connection, length)
    if kind != KIND_COMMAND or tile >= n_tiles or len(frame) != length:
        raise ConnectionError(f"tile bus: bad request (kind {kind}, tile {tile}, length {length})")
    return tile, frame


def send_answer(connection: socket.socket, frame: bytes) -> None:
    connection.sendall(ANSWER.pack(len(frame)) + frame)


def serve(connection: socket.socket, tiles: Sequence[Callable[[bytes], bytes]]) -> int:
    """Answer requests with ``tiles[tile](frame)`` until the connection closes; returns the requests served."""
    served = 0
    while (request := read_request(connection, len(tiles))) is not None:
        tile, frame = request
        send_answer(connection, tiles[tile](frame))
        served += 1
    return served


def request(connection: socket.socket, tile: int, frame: bytes) -> bytes:
    """Client side, as the firmware's HAL: send one command frame to ``tile`` and return its answer frame."""
    connection.sendall(REQUEST.pack(KIND_COMMAND, tile, 0, len(frame)) + frame)
    head = recv_exact(connection, ANSWER.size)
    if len(head) < ANSWER.size:
        raise ConnectionError("tile bus: the server closed the connection before answering")
    (length,) = ANSWER.unpack(head)
    answer = recv_exact(connection, length)
    if len(answer) != length:
        raise ConnectionError(f"tile bus: answer cut short ({len(answer)} of {length} bytes)")
    return answer
