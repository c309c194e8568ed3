"""serial:///dev/ttyUSB0[?baud=N]: a board running the firmware behind a UART (pyserial, loaded lazily)."""

from __future__ import annotations

import urllib.parse

from somatile.host.device import Transport
from somatile.host.tile_driver import link_options, open_transport

DEFAULT_BAUD = 921600


class SerialTransport(Transport):
    """A serial port (8N1, no flow control) as a `Transport`."""

    def __init__(self, port: str, baud: int = DEFAULT_BAUD):
        try:
            import serial
        except ModuleNotFoundError:
            raise ModuleNotFoundError("serial:// needs pyserial: pip install pyserial", name="serial") from None
        try:
            self.port = serial.Serial(port, baudrate=baud, timeout=0, write_timeout=10)
        except serial.SerialException as exc:
            raise ConnectionError(f"serial://{port}: cannot open ({exc})") from None

    def write(self, data: bytes) -> None:
        self.port.write(data)
        self.port.flush()

    def read(self, n: int, timeout: float) -> bytes:
        self.port.timeout = max(0.0, timeout)
        first = self.port.read(1)
        if not first:
            return b""
        self.port.timeout = 0
        return first + self.port.read(min(n - 1, self.port.in_waiting))

    def close(self) -> None:
        self.port.close()


def open_url(parts: urllib.parse.SplitResult, **options):
    """serial:///dev/PATH[?baud=N&timeout=SECONDS&retries=N]"""
    if not parts.path:
        raise ValueError(f"device URL {parts.geturl()!r}: expected serial:///dev/PORT")
    link, query = link_options(parts, {"baud"}, options)
    baud = int(query.get("baud", DEFAULT_BAUD))
    return open_transport(SerialTransport(parts.path, baud), f"serial://{parts.path}", **link)
