"""tcp://HOST:PORT: a board (or the firmware's host build) running the firmware, over a TCP byte stream.

A link: `TcpTransport` moves the bytes, the tile driver (`somatile.host.tile_driver.open_transport`, also
importable from here) speaks the wire protocol over it.
"""

from __future__ import annotations

import select
import socket
import urllib.parse

from somatile.host.device import DeviceTimeout, Transport
from somatile.host.tile_driver import link_options, open_transport


class TcpTransport(Transport):
    """A connected TCP socket as a `Transport` (Nagle off: frames are small and answered one by one).
    A write that the device does not take within ``write_timeout`` seconds raises `DeviceTimeout`."""

    def __init__(self, host: str, port: int, connect_timeout: float = 5.0, write_timeout: float = 30.0):
        self.write_timeout = write_timeout
        try:
            self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as exc:
            raise ConnectionError(f"tcp://{host}:{port}: cannot connect ({exc})") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)

    def write(self, data: bytes) -> None:
        self.sock.settimeout(self.write_timeout)
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise DeviceTimeout(f"tcp: the device took no data for {self.write_timeout} s") from None
        finally:
            self.sock.setblocking(False)

    def read(self, n: int, timeout: float) -> bytes:
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return b""
        try:
            data = self.sock.recv(n)
        except BlockingIOError:
            return b""
        if not data:
            raise ConnectionError("tcp: the device closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


def open_url(parts: urllib.parse.SplitResult, **options):
    """tcp://HOST:PORT[?timeout=SECONDS&retries=N]"""
    if not parts.hostname or not parts.port:
        raise ValueError(f"device URL {parts.geturl()!r}: expected tcp://HOST:PORT")
    link, _ = link_options(parts, set(), options)
    return open_transport(TcpTransport(parts.hostname, parts.port), parts.geturl(), **link)
