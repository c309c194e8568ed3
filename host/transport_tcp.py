"""tcp://HOST:PORT: a board (or the firmware's host build) running the firmware, over a TCP byte stream."""

from __future__ import annotations

import select
import socket
import urllib.parse

from somatile.host import url_options
from somatile.host.device import DeviceTimeout, Transport


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


def open_transport(transport: Transport, backend: str, **options):
    """The host driver (`TileDevice`) over any byte transport speaking the wire protocol."""
    from somatile.host.device import TileDevice
    from somatile.host.protocol import WireLink
    from somatile.hw.regmap import API_LEVEL

    progress = options.pop("progress", None)
    try:
        return TileDevice(WireLink(transport, API_LEVEL, **options), backend=backend, progress=progress)
    except BaseException:
        transport.close()
        raise


def open_url(parts: urllib.parse.SplitResult, **options):
    """tcp://HOST:PORT[?timeout=SECONDS&retries=N]"""
    if not parts.hostname or not parts.port:
        raise ValueError(f"device URL {parts.geturl()!r}: expected tcp://HOST:PORT")
    link, _ = link_options(parts, set(), options)
    return open_transport(TcpTransport(parts.hostname, parts.port), parts.geturl(), **link)
