"""Tensor throughput through the device API: emu:// (in-process golden model), the C firmware over a
loopback TCP socket and over a pty (serial://), and sim:// (tile RTL in Verilator behind the firmware).

All devices use the same small tile (``device_cli.DEMO_QUERY``: 2 heads, head_dim 16, ring 8, 2 sinks) so
the rows compare like with like; every run is also checked bit for bit against the model. Rows: decode
tokens/s (one DECODE frame per token for both heads), HCCS input MB/s (int8 rows of ring + sinks), and state
read-back MB/s (READ_STATE, pure data movement). Firmware and sim rows carry the emu value as baseline.
"""

from __future__ import annotations

import time

import numpy as np


def _measure(dev, tokens: int, rows: int, reads: int) -> dict:
    from somatile.host.device_cli import demo_config, demo_tensors

    info = dev.info()
    dev.configure(demo_config(info))
    dev.reset()
    q, k, v, _ = demo_tensors(info, tokens, seed=3)
    x = np.random.default_rng(4).integers(-128, 128, (rows, info.ring + info.sinks)).astype(np.int8)
    # Warm-up outside the timing: first-call costs of the model kernels behind the tile (per process/config).
    dev.decode(q[:4], k[:4], v[:4])
    dev.hccs(x[:20], head=1)
    dev.reset()
    start = time.perf_counter()
    dev.decode(q, k, v)
    decode_s = time.perf_counter() - start
    start = time.perf_counter()
    dev.hccs(x, head=1)
    hccs_s = time.perf_counter() - start
    state_bytes = info.extra["state_bytes"] * info.heads
    start = time.perf_counter()
    for _ in range(reads):
        dev.read_state()
    state_s = time.perf_counter() - start
    return {"decode": tokens / decode_s, "hccs": x.nbytes / hccs_s / 1e6, "state": reads * state_bytes / state_s / 1e6}


def run() -> list[dict]:
    import somatile.host
    from somatile.host.device_cli import DEMO_QUERY, agree
    from somatile.host.emu import board_params, start_tile_server, url_board
    from somatile.host.transport_firmware import board_file
    from somatile.host.transport_firmware import FirmwareProcess

    check = agree([f"emu://?{DEMO_QUERY}", f"sim://?{DEMO_QUERY}"], tokens=16)
    if not check["agree"]:
        raise AssertionError(f"emu:// and sim:// disagree: {check['mismatches']}")
    import urllib.parse

    _, board, overrides = url_board(urllib.parse.urlsplit(f"emu://?{DEMO_QUERY}"), {})
    params, name = board_params(board, overrides)
    tiles = start_tile_server(params)
    board_arg, build_name = board_file(board, overrides)
    results = {}
    with somatile.host.open(f"emu://?{DEMO_QUERY}") as dev:
        results["emu"] = _measure(dev, tokens=400, rows=4000, reads=200)
    for link in ("tcp", "pty"):
        with FirmwareProcess(tiles, board=board_arg, build_name=build_name, board_name=name, link=link) as fw:
            with somatile.host.open(fw.url) as dev:
                results[f"firmware {link}"] = _measure(dev, tokens=400, rows=4000, reads=200)
    with somatile.host.open(f"sim://?{DEMO_QUERY}") as dev:
        results["sim"] = _measure(dev, tokens=40, rows=200, reads=10)
    units = {"decode": "tokens/s", "hccs": "MB/s", "state": "MB/s"}
    what = {"decode": "decode", "hccs": "HCCS input", "state": "state read-back"}
    rows = []
    for metric in ("decode", "hccs", "state"):
        base = results["emu"][metric]
        for backend, values in results.items():
            row = {"name": f"{what[metric]} through {backend}", "value": values[metric], "unit": units[metric]}
            if backend != "emu":
                row.update(baseline=base, ratio=values[metric] / base, ratio_note="value / emu")
            rows.append(row)
    rows[0]["notes"] = ("tile 2 heads x head_dim 16, ring 8, sinks 2; emu and sim checked bit-exact against the "
                        "model before timing; firmware = C host build on the golden tile model over loopback")
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)
