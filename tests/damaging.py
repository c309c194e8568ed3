"""A transport wrapper that damages chosen writes of the host: the link-fault tests of the firmware (host build,
tests/firmware) and of the SoC (tests/boards/test_soc.py) share it."""

from somatile.host.device import Transport


class Damaging(Transport):
    """Passes everything to ``inner`` but the writes named in ``plan`` (write number -> action): "corrupt"
    flips a bit of byte 12, "truncate" sends the first half, "split" sends it in pieces of 7 bytes, "noise"
    puts line noise in front."""

    def __init__(self, inner: Transport, plan: dict | None = None):
        self.inner, self.plan, self.writes = inner, dict(plan or {}), 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        action = self.plan.get(self.writes)
        if action == "corrupt":
            data = data[:12] + bytes([data[12] ^ 0x80]) + data[13:]
        elif action == "truncate":
            data = data[:len(data) // 2]
        elif action == "noise":
            data = bytes(range(7, 250, 9)) + data
        if action == "split":
            for i in range(0, len(data), 7):
                self.inner.write(data[i:i + 7])
        else:
            self.inner.write(data)

    def read(self, n: int, timeout: float) -> bytes:
        return self.inner.read(n, timeout)

    def close(self) -> None:
        self.inner.close()
