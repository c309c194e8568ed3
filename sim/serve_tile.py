"""cocotb tile server: the tile RTL in the simulator answers tile-bus requests from the firmware's host build.

The framing is `somatile.hw.tile_bus`, the same as the golden-model server's (``somatile.host.emu.serve_tiles``)
and the firmware HAL's (firmware/hal/host/hal_host.c); this server has one tile. Each frame goes through the
tile's AXI4-Stream ports with cocotbext-axi (no idle cycles, no backpressure), so the firmware and the host
driver see the RTL's own bytes.

Started by ``somatile.host.sim_backend`` through ``somatile.sim.runner.build_and_test`` with inputs ``config``
(the tile parameters, JSON) and ``port``. The test listens on 127.0.0.1:port; connections that close
without a request (readiness probes) are skipped; it ends when the first real client disconnects, or when no
client comes within ``accept_timeout`` seconds. The simulator only advances while a frame is in flight.
"""

from __future__ import annotations

import json
import socket

import cocotb
import numpy as np

from somatile.hw import tile_bus


@cocotb.test()
async def serve(dut):
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
                while (request := tile_bus.read_request(connection, 1)) is not None:
                    _, frame = request
                    tile_bus.send_answer(connection, await tb.command(frame))
                    served += 1
    write_job_outputs(commands=np.array(served))
