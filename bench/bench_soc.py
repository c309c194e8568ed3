"""Decode through the whole SoC (hw/soc.py) in Verilator: PicoRV32 running the cross-built firmware, the UART,
the tile, reached over the simulated UART's pty by the unchanged serial driver (sim://?board=sim&top=soc).

The simulation is cycle-accurate at the UART pins, so its cycle counter is board time: tokens per second of
the board = the CPU's clock / simulated CPU cycles per token (the sim board: CPU side at 50 MHz, the tile at
100 MHz, 3.125 Mbit/s, one tile of 2 heads x 64). Rows: that figure; the wall-clock rate of the simulation
(what a test waits); the wire bytes per token and the token rate a link of each FPGA board's ``soc.baud``
allows (bytes x 10 bits / baud: the UART bound, computed, not measured); and the share of the simulated cycles
the UART's bits account for. Every output is checked against the model's integer decode.
"""

from __future__ import annotations

import time

import numpy as np

from somatile.host.device import Transport

TOKENS = 12


class Counting(Transport):
    """A transport that counts the bytes each way (the wire cost of a token)."""

    def __init__(self, inner: Transport):
        self.inner, self.sent, self.received = inner, 0, 0

    def write(self, data):
        self.sent += len(data)
        self.inner.write(data)

    def read(self, n, timeout):
        data = self.inner.read(n, timeout)
        self.received += len(data)
        return data

    def close(self):
        self.inner.close()


def run() -> list[dict]:
    import somatile.host
    from somatile import boards
    from somatile.host.device_cli import demo_config, demo_tensors
    from somatile.host.tile_driver import open_transport
    from somatile.host.transport_serial import SerialTransport
    from somatile.model import soma

    cfg = boards.load("sim")
    with somatile.host.open("sim://?board=sim&top=soc") as sim:
        simulation = sim.simulation
        bit_cycles, cpu_hz = simulation.build.bit_cycles, simulation.build.clock_hz
        counting_link = Counting(SerialTransport(simulation.pty))
        with open_transport(counting_link, "soc-bench", timeout=30.0) as dev:
            info = dev.info()
            model_cfg = demo_config(info)
            dev.configure(model_cfg)
            dev.reset()
            q, k, v, _ = demo_tensors(info, TOKENS, seed=3)
            sent, received = counting_link.sent, counting_link.received
            c0, t0 = simulation.cycles(), time.perf_counter()
            out = dev.decode(q, k, v)
            wall = time.perf_counter() - t0
            cycles = simulation.cycles() - c0
            wire = (counting_link.sent - sent + counting_link.received - received) / TOKENS
    expected = soma.prefill(model_cfg, q, k, v)[0]
    if not np.array_equal(out, expected):
        raise AssertionError("the SoC's decode differs from the model's integer decode")
    per_token = cycles / TOKENS
    uart_cycles = wire * 10 * bit_cycles
    geometry = f"{info.heads} heads x {info.head_dim}, ring {info.ring} + {info.sinks} sinks"
    rows = [
        {"name": f"SoC decode, board time (sim board: CPU {cpu_hz / 1e6:g} MHz, tile {cfg.clock_mhz:g} MHz, "
                 f"{cfg.soc['baud']} bit/s; {geometry})",
         "value": cpu_hz / per_token, "unit": "tokens/s",
         "notes": f"{per_token:.0f} simulated CPU cycles per token ({TOKENS} tokens, 1 DECODE request each), of "
                  f"which the UART's bits are {uart_cycles / per_token:.0%}"},
        {"name": "SoC decode, wall clock of the Verilator simulation", "value": TOKENS / wall, "unit": "tokens/s",
         "notes": f"{cycles / wall / 1e3:.0f}k simulated cycles/s"},
        {"name": "SoC wire bytes per token (request + answer frames)", "value": wire, "unit": "bytes"},
    ]
    for name in boards.names():
        board = boards.load(name)
        if board.kind == "fpga" and board.soc is not None:
            rows.append({"name": f"{name}: UART bound at soc.baud = {board.soc['baud']} bit/s (computed, "
                                 f"{geometry})", "value": board.soc["baud"] / (10 * wire), "unit": "tokens/s"})
    return rows
