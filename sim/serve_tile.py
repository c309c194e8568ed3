"""cocotb tile server: the tile RTL in the simulator answers tile-bus requests from the firmware's host build.

The same framing as the golden-model server (``somatile.host.emu.serve_tiles``, firmware/hal/host/hal_host.c):
a request is ``u8 kind (1), u8 tile, u16 0, u32 length`` and a command frame, the answer ``u32 length`` and the
response frame. Each frame goes through the tile's AXI4-Stream ports with cocotbext-axi (no idle cycles, no
backpressure), so the firmware and the host driver see the RTL's own bytes.

Started by ``somatile.host.sim_backend`` through ``somatile.sim.runner.build_and_test`` with inputs ``config``
(the tile parameters, JSON) and ``port``. The test listens on 127.0.0.1:port; connections that close
without a request (readiness probes) are skipped; it ends when the first real client disconnects, or when no
client comes within ``accept_timeout`` seconds. The simulator only advances while a frame is in flight.
"""

from __future__ import annotations

import json
import socket
import struct

import cocotb
import numpy as np

ANSWER_LENGTH = struct.Struct("<I")


def _read_exact(connection: socket.socket, n: int) -> bytes:
    parts, have = [], 0
    while have < n:
        chunk = connection.recv(n - have)
        if not chunk:
            break
        parts.append(chunk)
        have += len(chunk)
    return b"".join(parts)


@cocotb.test()
async def serve(dut):
    from somatile.host.emu import TILE_BUS_KIND_COMMAND, TILE_BUS_REQUEST
    from somatile.sim.runner import job_inputs, write_job_outputs
    from somatile.sim.tb_tile import TB

    inputs = job_inputs()
    config = json.loads(str(inputs["config"]))
    tb = TB(dut, "full", 1)
    await tb.reset()
    served = 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", int(inputs["port"])))
        server.listen(4)
        server.settimeout(float(config.get("accept_timeout", 600)))
        while not served:
            try:
                connection, _ = server.accept()
            except TimeoutError:
                break
            with connection:
                connection.settimeout(None)
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while len(head := _read_exact(connection, TILE_BUS_REQUEST.size)) == TILE_BUS_REQUEST.size:
                    kind, tile, _, length = TILE_BUS_REQUEST.unpack(head)
                    frame = _read_exact(connection, length)
                    if kind != TILE_BUS_KIND_COMMAND or tile != 0 or len(frame) != length:
                        raise ConnectionError(f"tile bus: bad request (kind {kind}, tile {tile}, length {length})")
                    answer = await tb.command(frame)
                    connection.sendall(ANSWER_LENGTH.pack(len(answer)) + answer)
                    served += 1
    write_job_outputs(commands=np.array(served))
