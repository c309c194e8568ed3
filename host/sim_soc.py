"""sim://?board=NAME&top=soc[&KEY=VALUE...]: the board's whole SoC in Verilator (hw/soc.py, sim/soc.py): the
soft CPU runs the cross-built firmware, and the host reaches it through the simulated UART's pty with the
unchanged serial:// driver. So this checks the firmware as the board runs it (its SoC HAL, its cross
compiler, its bit rate), not only the host build of it.

The first open of a board config builds the firmware and the Verilator model (a minute; reused after). The
link's default timeout grows with what the simulated UART needs for the largest frame (the simulation runs
at a fraction of the board's clock). ``device.simulation`` is the running :class:`somatile.sim.soc.SocSimulation`
(the fault tests stall the tile through it).
"""

from __future__ import annotations

import urllib.parse

SIM_CYCLES_PER_S = 200_000
"""A conservative floor of the SoC model's speed in Verilator (clock cycles per second of wall time), used
only to size the default link timeout."""


def open_url(parts: urllib.parse.SplitResult, query: str, **options):
    from somatile import boards
    from somatile.host.emu import url_board
    from somatile.host.transport_firmware import board_file
    from somatile.host.transport_serial import SerialTransport
    from somatile.host.tile_driver import open_transport
    from somatile.sim import soc

    link, board, overrides = url_board(parts._replace(query=query), options)
    cfg = boards.load(board, overrides or None)
    board_arg, _ = board_file(board, overrides)
    built = soc.build(cfg, board_arg)
    frame_s = 10 * built.bit_cycles * (cfg.soc["max_payload"] + 64) / SIM_CYCLES_PER_S
    link.setdefault("timeout", max(4.0, 2 * frame_s))
    simulation = soc.SocSimulation(built)
    try:
        device = open_transport(SerialTransport(simulation.pty, baud=cfg.soc["baud"]), f"sim://?{parts.query}",
                                **link)
    except BaseException:
        simulation.close()
        raise
    device.simulation = simulation
    device.on_close.append(simulation.close)
    return device
