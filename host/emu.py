"""emu://: the golden tile model in-process, behind the same wire protocol and host driver as a real board.

`ReferenceFirmware` is the firmware's request handling written in Python over `TileModel` instances: the
reference the C firmware (firmware/src/dispatch.c) is checked against byte for byte, and the device end of
the in-process link. `LoopbackTransport` connects the host driver to it without sockets, so emu:// runs the
exact host code path of tcp:// and serial://.

The same module serves the tile models to the firmware's host build (`serve_tiles`, over the tile bus of
`somatile.hw.tile_bus`): ``python -m somatile.host.emu --serve-tiles 0 [--board NAME]``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import urllib.parse

from somatile.host import protocol
from somatile.host.device import Transport
from somatile.host.protocol import CommandError, LinkError, Opcode
from somatile.host.tile_driver import link_options, open_transport
from somatile.hw import tile_bus


def board_params(board: str, overrides: dict | None = None):
    """(TileParams, board name) of a board config (``somatile.boards.load``) with tile parameter overrides
    (``{"ring": 8}``; validated by the board loader)."""
    from somatile import boards
    from somatile.hw.regmap import TileParams

    config = boards.load(board, overrides or None)
    return TileParams(**config.array_kwargs()), config.name


def url_board(parts: urllib.parse.SplitResult, options: dict) -> tuple[dict, str, dict]:
    """(WireLink options, board, tile overrides) from ``?board=NAME&KEY=VALUE...&timeout=..&retries=..``."""
    import dataclasses

    from somatile import boards
    from somatile.hw.regmap import TileParams

    link, query = link_options(parts, {"board"} | {f.name for f in dataclasses.fields(TileParams)}, options)
    board = query.pop("board", "sim")
    return link, board, boards.parse_assignments([f"{k}={v}" for k, v in query.items()])


class ReferenceFirmware:
    """The firmware's handlers over a list of tile ports (``port(frame bytes) -> answer bytes``).

    ``tiles`` defaults to one `TileModel` per tile of ``params``. ``endpoint`` is the protocol's device end.
    """

    def __init__(self, params, board: str, *, max_payload: int = protocol.DEFAULT_MAX_PAYLOAD, tiles=None):
        from somatile.hw import regmap

        self.regmap = regmap
        self.params = params
        self.board = board
        self.max_payload = max_payload
        if tiles is None:
            from somatile.hw.tile_model import TileModel

            tiles = [TileModel(params, i).command for i in range(params.n_tiles)]
        self.tiles = list(tiles)
        self.address = {r.name: r.address for r in regmap.registers(params)}
        self.endpoint = protocol.DeviceEndpoint(regmap.API_LEVEL, {
            Opcode.HELLO: self.hello, Opcode.TILE: self.tile, Opcode.CONFIGURE: self.configure,
            Opcode.RESET: self.reset}, max_payload)

    @property
    def total_heads(self) -> int:
        return self.params.heads * self.params.n_tiles

    def _own_command(self, tile: int, opcode: int, head: int = 0, count: int = 0, arg0: int = 0,
                     payload: bytes = b"") -> int:
        """A command the firmware makes itself; returns the result word, raises on a refused command."""
        rm = self.regmap
        answer = self.tiles[tile](rm.pack_command(opcode, head, count, payload, arg0=arg0))
        if len(answer) != rm.HEADER_BYTES or answer[0] != rm.FRAME_MAGIC:
            raise CommandError(LinkError.TILE_BAD_ANSWER, len(answer))
        if answer[3]:
            raise CommandError(LinkError.TILE_REFUSED, answer[3])
        return int.from_bytes(answer[8:12], "little")

    def hello(self, payload: bytes) -> bytes:
        rm = self.regmap
        if payload:
            raise CommandError(LinkError.BAD_LENGTH, 0)
        for tile in range(self.params.n_tiles):
            level = self._own_command(tile, rm.Opcode.REG_READ, arg0=self.address["API_LEVEL"])
            if level != rm.API_LEVEL:
                raise CommandError(LinkError.WRONG_API_LEVEL, level)
        info = {"api_level": rm.API_LEVEL, "max_payload": self.max_payload}
        for name in protocol.TILE_INFO_REGISTERS:
            info[name] = self._own_command(0, rm.Opcode.REG_READ, arg0=self.address[f"INFO_{name.upper()}"])
        return protocol.pack_info(info, self.board)

    def tile(self, payload: bytes) -> bytes:
        rm = self.regmap
        if len(payload) < protocol.TILE_PREFIX.size + rm.HEADER_BYTES:
            raise CommandError(LinkError.BAD_LENGTH, protocol.TILE_PREFIX.size + rm.HEADER_BYTES)
        (tile,) = protocol.TILE_PREFIX.unpack_from(payload)
        if tile >= self.params.n_tiles:
            raise CommandError(LinkError.BAD_TILE, self.params.n_tiles)
        if (len(payload) - protocol.TILE_PREFIX.size) % self.params.stream_bytes:
            raise CommandError(LinkError.BAD_LENGTH, self.params.stream_bytes)
        answer = self.tiles[tile](payload[protocol.TILE_PREFIX.size:])
        if len(answer) > self.max_payload:
            raise CommandError(LinkError.TILE_OVERFLOW, self.max_payload)
        return answer

    def configure(self, payload: bytes) -> bytes:
        rm = self.regmap
        expected = 4 + 4 * len(rm.HEAD_PARAMS)
        if len(payload) != expected:
            raise CommandError(LinkError.BAD_LENGTH, expected)
        head = int.from_bytes(payload[:4], "little")
        if head >= self.total_heads:
            raise CommandError(LinkError.BAD_TILE, self.total_heads)
        tile, local = divmod(head, self.params.heads)
        self._own_command(tile, rm.Opcode.CONFIGURE_HEAD, local, payload=payload[4:])
        return b""

    def reset(self, payload: bytes) -> bytes:
        rm = self.regmap
        if payload:
            raise CommandError(LinkError.BAD_LENGTH, 0)
        for tile in range(self.params.n_tiles):
            # A tile without state (no RESET_STATE in its commands register) has only its error to clear.
            commands = self._own_command(tile, rm.Opcode.REG_READ, arg0=self.address["INFO_COMMANDS"])
            self._own_command(tile, rm.Opcode.CLEAR_ERROR)
            if commands >> rm.Opcode.RESET_STATE & 1:
                self._own_command(tile, rm.Opcode.RESET_STATE, 0, self.params.heads)
        return b""


class LoopbackTransport(Transport):
    """An in-process byte stream to a `protocol.DeviceEndpoint`.

    Reading when no answer is pending stands for the host waiting longer than the device's inter-byte
    timeout: the endpoint drops a partial frame (and answers TRUNCATED), as the firmware would.
    """

    def __init__(self, endpoint: protocol.DeviceEndpoint):
        self.endpoint = endpoint
        self._pending = bytearray()

    def write(self, data: bytes) -> None:
        self._pending += self.endpoint.feed(bytes(data))

    def read(self, n: int, timeout: float) -> bytes:
        if not self._pending and timeout > 0:
            self._pending += self.endpoint.expire()
        out = bytes(self._pending[:n])
        del self._pending[:n]
        return out


def open_url(parts: urllib.parse.SplitResult, **options):
    """emu://[?board=NAME&KEY=VALUE...] -> a `TileDevice` on the golden tile model of that board (default
    "sim"), tile parameters overridden like sim://."""
    link, board, overrides = url_board(parts, options)
    params, name = board_params(board, overrides)
    firmware = ReferenceFirmware(params, name)
    return open_transport(LoopbackTransport(firmware.endpoint), f"emu://?{parts.query or 'board=' + name}", **link)


def serve_tiles(params, host: str = "127.0.0.1", port: int = 0, ready=None) -> None:
    """Serve golden tile models to firmware host builds, forever; each connection (one firmware process) gets
    its own tiles, fresh from reset as after a power cycle, and its own thread.

    ``ready(address)`` is called with the bound (host, port) once the server listens.
    """
    from somatile.hw.tile_model import TileModel

    def serve(connection: socket.socket) -> None:
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                tile_bus.serve(connection, [TileModel(params, i).command for i in range(params.n_tiles)])
            except (ConnectionError, OSError) as exc:
                print(f"somatile tile server: {exc}", file=sys.stderr)

    with socket.create_server((host, port)) as server:
        if ready is not None:
            ready(server.getsockname()[:2])
        while True:
            connection, _ = server.accept()
            threading.Thread(target=serve, args=(connection,), daemon=True).start()


def start_tile_server(params) -> tuple[str, int]:
    """Serve golden tile models from a daemon thread of this process; returns the address."""
    bound: list = []
    event = threading.Event()

    def ready(address):
        bound.append(address)
        event.set()

    threading.Thread(target=serve_tiles, args=(params,), kwargs={"ready": ready}, daemon=True).start()
    if not event.wait(10):
        raise RuntimeError("tile server did not start within 10 s")
    return bound[0]


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description="serve golden tile models to the firmware's host build")
    cli.add_argument("--serve-tiles", type=int, required=True, metavar="PORT", help="TCP port (0: any free one)")
    cli.add_argument("--board", default="sim")
    args = cli.parse_args(argv)
    params, _ = board_params(args.board)

    def ready(address):
        print(f"tiles {address[0]}:{address[1]}", flush=True)

    serve_tiles(params, port=args.serve_tiles, ready=ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
