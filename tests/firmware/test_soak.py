"""Fault soak of the firmware's host build (issue 24): valid host sessions and hostile clients at the same
time on one firmware over loopback TCP. Hostile clients send garbage, truncated frames, frames cut by a
disconnect or a reset, corrupted CRCs, oversized lengths, requests they never read the answers of, or
nothing at all. Afterwards every valid session's results equal the same session on emu://, and the firmware
still serves a new host.

The test suite runs it for SUITE_SECONDS; ``make fuzz`` runs it longer:
``python tests/firmware/test_soak.py --seconds 1800 [--seed N]`` prints the counts as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
import threading
import time

import numpy as np

import somatile.host
from somatile.host import protocol
from somatile.host.protocol import Opcode
from somatile.hw import regmap

SUITE_SECONDS = 20.0
LEVEL = regmap.API_LEVEL


@dataclasses.dataclass
class Counts:
    """What a soak did: frames sent (by the valid sessions, counting resends, and by hostile clients),
    hostile connections (faults), hostile connects that timed out (the listen queue full of other hostile
    connections: a flood the single-owner device does not prevent), valid sessions completed, valid sessions
    that failed or differed from emu://."""

    frames: int = 0
    faults: int = 0
    refused: int = 0
    sessions: int = 0
    failures: int = 0
    seconds: float = 0.0
    fault_kinds: dict = dataclasses.field(default_factory=dict)
    errors: list = dataclasses.field(default_factory=list)

    def add(self, error: str | None = None, **counts) -> None:
        with _LOCK:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)
            if error and len(self.errors) < 20:
                self.errors.append(error)


_LOCK = threading.Lock()


def session_plan(seed: int, params) -> dict:
    """One valid session's inputs, drawn from ``seed``: a few decode steps, a state round trip, HCCS rows (of
    sinks + ring elements, the rows the configured heads' HCCS parameters were checked for)."""
    rng = np.random.default_rng(seed)
    heads, d = params.heads * params.n_tiles, params.head_dim
    steps = int(rng.integers(2, 10))
    return {"qkv": [rng.integers(-128, 128, (steps, heads, d)).astype(np.int8) for _ in range(3)],
            "x": rng.integers(-128, 128, (int(rng.integers(1, 5)), params.sinks + params.ring)).astype(np.int8),
            "split": int(rng.integers(1, steps))}


def run_session(dev, plan, cfg) -> dict:
    """The session's requests on ``dev``; returns every result."""
    q, k, v = plan["qkv"]
    s = plan["split"]
    dev.reset()
    dev.configure(cfg)
    first = dev.decode(q[:s], k[:s], v[:s])
    state = dev.read_state()
    dev.load_state(state)
    rest = dev.decode(q[s:], k[s:], v[s:])
    return {"decode": np.concatenate([first, rest]), "hccs": dev.hccs(plan["x"], head=1), "state": dev.read_state()}


def same_results(a: dict, b: dict) -> bool:
    return (np.array_equal(a["decode"], b["decode"]) and np.array_equal(a["hccs"], b["hccs"])
            and a["state"].keys() == b["state"].keys()
            and all(np.array_equal(a["state"][n], b["state"][n]) for n in a["state"]))


def hostile_client(address, rng: np.random.Generator, counts: Counts, stop: threading.Event) -> None:
    """Connect again and again, each time misbehaving in one way; never waits for the device on purpose."""
    read_id = protocol.encode_frame(LEVEL, Opcode.TILE, 1, protocol.TILE_PREFIX.pack(0) +
                                    regmap.pack_command(regmap.Opcode.REG_READ, arg0=0))
    hello = protocol.encode_frame(LEVEL, Opcode.HELLO, int(rng.integers(0, 1 << 16)))
    kinds = ["garbage", "truncated", "cut", "reset", "bad_crc", "oversize", "unread", "idle"]
    while not stop.is_set():
        kind = kinds[int(rng.integers(len(kinds)))]
        frames = 0
        try:
            sock = socket.create_connection(address, timeout=5)
        except OSError:
            counts.add(refused=1)
            stop.wait(0.5)
            continue
        try:
            if kind == "garbage":
                sock.sendall(rng.integers(0, 256, int(rng.integers(1, 5000))).astype(np.uint8).tobytes())
            elif kind == "truncated":  # then silence: the inter-byte timeout drops it
                sock.sendall(hello + read_id[:int(rng.integers(2, len(read_id)))])
                frames = 2
                time.sleep(float(rng.uniform(0.25, 0.6)))
            elif kind in ("cut", "reset"):
                sock.sendall(hello + read_id[:int(rng.integers(2, len(read_id)))])
                frames = 2
                if kind == "reset":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            elif kind == "bad_crc":
                damaged = bytearray(read_id)
                damaged[int(rng.integers(len(damaged)))] ^= 1 << int(rng.integers(8))
                sock.sendall(hello + bytes(damaged) * int(rng.integers(1, 20)))
                frames = 2
            elif kind == "oversize":
                sock.sendall(protocol.HEADER.pack(protocol.MAGIC, LEVEL, Opcode.TILE, 1, 0xFFFFFFF0) +
                             bytes(int(rng.integers(0, 70000))))
                frames = 1
            elif kind == "unread":  # finding 1: many answers, none read, then gone
                count = int(rng.integers(2, 40))
                sock.sendall(hello * count)
                frames = count
            else:  # idle: hold the connection without a word
                stop.wait(float(rng.uniform(0.2, 2.0)))
        except OSError:
            pass  # the firmware may drop a hostile client first; that is the point
        finally:
            sock.close()
        counts.add(frames=frames, faults=1)
        with _LOCK:
            counts.fault_kinds[kind] = counts.fault_kinds.get(kind, 0) + 1
        stop.wait(float(rng.uniform(0.0, 0.3)))


def valid_client(url: str, seed: int, params, cfg, counts: Counts, stop: threading.Event) -> None:
    """Valid sessions one after another, each compared with the same session on emu://."""
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        plan = session_plan(int(rng.integers(1 << 31)), params)
        try:
            # The device serves one host at a time: wait for it behind the other clients.
            with somatile.host.open(url, timeout=2.0, retries=12) as dev:
                got = run_session(dev, plan, cfg)
                frames = dev.link.seq + 1 + dev.link.retried
        except Exception as exc:  # a valid session must never fail: record it, whatever it was
            counts.add(failures=1, error=f"valid session: {type(exc).__name__}: {exc}")
            stop.wait(0.5)
            continue
        with somatile.host.open("emu://") as emu:
            want = run_session(emu, plan, cfg)
        ok = same_results(got, want)
        counts.add(frames=frames, sessions=1, failures=0 if ok else 1,
                   error=None if ok else f"valid session differs from emu:// (client seed {seed})")


def soak(tiles, seconds: float, seed: int = 1, valid: int = 2, hostile: int = 4) -> Counts:
    """Run the soak against a fresh firmware on the tile server at ``tiles`` for ``seconds``."""
    from somatile.host.emu import board_params
    from somatile.host.transport_firmware import FirmwareProcess
    from tests.firmware.test_firmware import config

    params, _ = board_params("sim")
    cfg = config(params)
    counts = Counts()
    stop = threading.Event()
    start = time.monotonic()
    with FirmwareProcess(tiles) as firmware:
        host, port = firmware.url.removeprefix("tcp://").split(":")
        address = (host, int(port))
        threads = [threading.Thread(target=valid_client, args=(firmware.url, seed * 100 + i, params, cfg, counts,
                                                               stop)) for i in range(valid)]
        threads += [threading.Thread(target=hostile_client, args=(address, np.random.default_rng(seed * 1000 + i),
                                                                  counts, stop)) for i in range(hostile)]
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join()
        alive = firmware.process.poll() is None
        if alive:  # and it still serves the next host
            plan = session_plan(seed, params)
            try:
                with somatile.host.open(firmware.url, timeout=2.0, retries=3) as dev:
                    got = run_session(dev, plan, cfg)
            except Exception as exc:
                counts.add(error=f"the host after the soak: {type(exc).__name__}: {exc}")
                alive = False
            else:
                with somatile.host.open("emu://") as emu:
                    alive = same_results(got, run_session(emu, plan, cfg))
        if not alive:
            counts.add(failures=1, error=f"firmware not serving after the soak (exit status "
                                         f"{firmware.process.poll()})")
    counts.seconds = round(time.monotonic() - start, 1)
    return counts


def test_fault_soak_valid_sessions_equal_emu_and_the_firmware_survives():
    from somatile.host.emu import board_params, start_tile_server

    counts = soak(start_tile_server(board_params("sim")[0]), SUITE_SECONDS)
    print(json.dumps(dataclasses.asdict(counts)))
    assert counts.failures == 0, counts.errors[:5]
    assert counts.sessions >= 4 and counts.faults >= 40
    assert len(counts.fault_kinds) == 8  # every kind of misbehaviour happened


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    from somatile.host.emu import board_params, start_tile_server

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: `tests` from the checkout

    cli = argparse.ArgumentParser(description="fault soak of the firmware's host build")
    cli.add_argument("--seconds", type=float, default=600.0)
    cli.add_argument("--seed", type=int, default=1)
    cli.add_argument("--valid", type=int, default=2, help="concurrent valid host sessions")
    cli.add_argument("--hostile", type=int, default=4, help="concurrent hostile clients")
    args = cli.parse_args(argv)
    counts = soak(start_tile_server(board_params("sim")[0]), args.seconds, args.seed, args.valid, args.hostile)
    print(json.dumps(dataclasses.asdict(counts), indent=1))
    return 0 if counts.failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
