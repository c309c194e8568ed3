"""sim://?board=NAME[&top=tile|soc][&KEY=VALUE...]: the tile RTL of a board config in Verilator, behind the real
firmware (``top=soc``: the board's whole SoC, somatile.host.sim_soc).

The chain is the one of a board: host driver -> wire protocol over TCP -> the C firmware (host build,
firmware/) -> its HAL's tile stream -> ``somatile.sim.serve_tile``, a cocotb test that drives the tile's
AXI4-Stream ports in Verilator. So sim:// checks the RTL *and* the firmware with the same host code as
tcp:// and serial://. Query keys other than ``board``, ``timeout`` and ``retries`` override tile parameters
of the board (validated like ``somatile build --set``), e.g. ``sim://?board=sim&ring=8&head_dim=16``.

The first open of a parameter set compiles the Verilog with Verilator (minutes for large tiles; reused
after); ``build_timeout`` (seconds, keyword) bounds that wait. sim:// simulates one tile (n_tiles = 1).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
import urllib.parse

import numpy as np

from somatile.host.transport_firmware import FirmwareProcess, board_file
from somatile.host.transport_tcp import TcpTransport, open_transport


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimTileServer:
    """The tile RTL of ``params`` in Verilator, serving the tile bus on 127.0.0.1:``port`` (a thread of this
    process waits on the simulator; `wait_ready` returns once the server accepts connections)."""

    def __init__(self, params, accept_timeout: float = 600):
        from somatile.hw.regmap import TileParams

        if not isinstance(params, TileParams) or params.n_tiles != 1:
            raise ValueError(f"sim://: one tile is simulated; the board has n_tiles = {params.n_tiles}")
        self.params = params
        self.port = _free_port()
        self.error: BaseException | None = None
        self.result = None
        inputs = {"config": json.dumps({"params": dataclasses.asdict(params), "accept_timeout": accept_timeout}),
                  "port": self.port}
        self.thread = threading.Thread(target=self._run, args=(inputs,), daemon=True)
        self.thread.start()

    def _run(self, inputs) -> None:
        from somatile.hw.tile import Tile
        from somatile.sim import runner

        try:
            self.result = runner.build_and_test(Tile, dataclasses.asdict(self.params), "somatile_tile",
                                                "somatile.sim.serve_tile",
                                                inputs={k: np.array(v) for k, v in inputs.items()})
        except BaseException as exc:  # reported to the opener by wait_ready / close
            self.error = exc

    def wait_ready(self, timeout: float) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.thread.is_alive():
                raise RuntimeError(f"sim://: the tile simulation stopped before serving: {self.error}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return "127.0.0.1", self.port
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"sim://: the tile simulation was not ready within {timeout} s (Verilator build?)")

    def close(self, timeout: float = 30) -> None:
        self.thread.join(timeout)


def open_url(parts: urllib.parse.SplitResult, *, build_timeout: float = 1800, **options):
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    tops = [v for k, v in query if k == "top"]
    if tops and tops[-1] not in ("tile", "soc"):
        raise ValueError(f"device URL {parts.geturl()!r}: option top={tops[-1]!r}: expected 'tile' (the tile "
                         f"RTL behind the host-built firmware) or 'soc' (the board's whole SoC)")
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "top"])
    if tops and tops[-1] == "soc":
        from somatile.host import sim_soc
        return sim_soc.open_url(parts, rest, **options)
    parts = parts._replace(query=rest)
    from somatile.host.emu import board_params, url_board

    link, board, overrides = url_board(parts, options)
    params, name = board_params(board, overrides)
    server = SimTileServer(params)
    firmware = None
    try:
        tiles = server.wait_ready(build_timeout)
        board_arg, build_name = board_file(board, overrides)
        firmware = FirmwareProcess(tiles, board=board_arg, build_name=build_name, board_name=name)
        host, port = firmware.url.removeprefix("tcp://").split(":")
        device = open_transport(TcpTransport(host, int(port)), f"sim://?{parts.query}", **link)
    except BaseException:
        if firmware is not None:
            firmware.close()
        server.close(5)
        raise
    device.on_close += [firmware.close, server.close]
    return device
