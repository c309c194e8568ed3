"""Coverage-guided fuzzing (atheris) of the Python side of the wire protocol: `protocol.FrameParser` and the
reference firmware (`emu.ReferenceFirmware`: `protocol.DeviceEndpoint` with the golden tile models).

The harness is this file run as a script; the test runs it bounded in a subprocess, because ``atheris.Fuzz()``
never returns. Input convention as in the C fuzz target (firmware/fuzz/fuzz_frame.c): the input is the byte
stream from the host, and ``00 FF 00`` stands for "the inter-byte timeout passed here". Checked on every input:

- the parser gives the same events whether a segment arrives whole or byte by byte, and every frame it
  reports is, re-encoded, a substring of its segment;
- the device answers every parser event with exactly one well-formed frame (a response or an error frame)
  at its API level, carrying the request's opcode and sequence number (or, for a retry, the cached answer
  again), and no handler raises anything but `CommandError`;
- the C firmware (firmware/fuzz/hal_session.c in a shared library, its tiles golden tile models too) answers
  with exactly the same bytes (differential fuzzing; the C side is also fuzzed on its own under libFuzzer
  with ASan, tests/firmware/test_fuzz_frame.py).

A longer run (docs/protocol.md): ``python tests/host/test_fuzz_protocol.py -max_total_time=3600 CORPUS_DIR``
(the corpus directory is seeded with a recorded host session when empty).
"""

import ctypes
import functools
import importlib
import pathlib
import platform
import subprocess
import sys
import urllib.parse

import pytest

TIMEOUT_MARK = b"\x00\xff\x00"
BOUNDED_SECONDS = 20
# Where the dev extra installs atheris (pyproject.toml), so where a missing atheris is a failure, not a skip.
ATHERIS_PLATFORM = sys.platform == "linux" and platform.machine() == "x86_64" and sys.version_info >= (3, 11)


def demo_query():
    """(link options, board, tile overrides) of the demo geometry (host/device_cli.py DEMO_QUERY): small
    tensors, so the seed session stays under a KiB."""
    from somatile.host.device_cli import DEMO_QUERY
    from somatile.host.emu import url_board

    return url_board(urllib.parse.urlsplit(f"emu://?{DEMO_QUERY}"), {})


@functools.cache
def demo_board():
    """(TileParams, name) of the demo geometry."""
    from somatile.host.emu import board_params

    _, board, overrides = demo_query()
    return board_params(board, overrides)


def endpoint_under_fuzz():
    """The device end of a fresh reference firmware (fresh per input, so every input starts from reset)."""
    from somatile.host.emu import ReferenceFirmware

    return ReferenceFirmware(*demo_board()).endpoint


class FirmwareSession:
    """The C firmware as a function from link bytes to link bytes (firmware/fuzz/hal_session.c, built for the
    same board as `demo_board`), its tiles fresh golden tile models for every session."""

    PORT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t,
                            ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t))

    def __init__(self):
        from somatile.host.transport_firmware import board_file
        from somatile.host.transport_firmware import build_firmware

        self.params, name = demo_board()
        _, board, overrides = demo_query()
        board_arg, build_name = board_file(board, overrides)
        self.lib = ctypes.CDLL(str(build_firmware(board_arg, build_name, name, target="libfw_session.so")))
        self.lib.fw_session.restype = ctypes.c_size_t
        self.lib.fw_session.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                        self.PORT]
        self.lib.fuzz_reseal.restype = ctypes.c_size_t
        self.lib.fuzz_reseal.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self.port = self.PORT(self._tile_port)
        self.tiles: list = []
        self.port_error: BaseException | None = None

    def reseal(self, data: bytes) -> bytes:
        """``data`` with every complete frame in it given its correct CRC (the C mutators' ``fuzz_reseal``):
        random mutations alone almost never get past the CRC check."""
        buffer = ctypes.create_string_buffer(data, len(data))
        self.lib.fuzz_reseal(buffer, len(data))
        return buffer.raw

    def make_tiles(self) -> list:
        from somatile.hw.tile_model import TileModel

        return [TileModel(self.params, i).command for i in range(self.params.n_tiles)]

    def _tile_port(self, tile, command, n, answer, cap, answer_len) -> int:
        # An exception cannot cross back into C (ctypes would print it and answer 0): kept and raised in run().
        try:
            out = self.tiles[tile](ctypes.string_at(command, n))
        except BaseException as exc:  # noqa: BLE001 - re-raised by run()
            self.port_error = self.port_error or exc
            out = b""
        if len(out) > cap:
            return -1
        ctypes.memmove(answer, out, len(out))
        answer_len[0] = len(out)
        return 0

    def run(self, data: bytes) -> bytes:
        """What the firmware, freshly reset, answers to ``data`` (the fuzz input convention)."""
        cap = 1 << 16
        while True:
            self.tiles = self.make_tiles()
            self.port_error = None
            output = ctypes.create_string_buffer(cap)
            n = self.lib.fw_session(data, len(data), output, cap, self.port)
            if self.port_error is not None:
                raise self.port_error
            if n <= cap:
                return output.raw[:n]
            cap = n


def seed_sessions() -> list[bytes]:
    """Valid sessions to start from: everything a host sent to emu:// while configuring, resetting, decoding
    two tokens and running HCCS (the whole session, and each distinct write on its own)."""
    from somatile.host.device_cli import stream_device
    from somatile.host.emu import LoopbackTransport
    from somatile.host.tile_driver import open_transport

    class RecordingTransport(LoopbackTransport):
        def __init__(self, endpoint):
            super().__init__(endpoint)
            self.sent: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.sent.append(bytes(data))
            super().write(data)

    transport = RecordingTransport(endpoint_under_fuzz())
    with open_transport(transport, "emu://") as dev:
        stream_device(dev, tokens=2, seed=3)
    return [b"".join(transport.sent), *dict.fromkeys(transport.sent)]


def check_input(data: bytes, protocol, make_endpoint, firmware: FirmwareSession | None = None) -> None:
    """The properties of the module docstring on one fuzz input; raises AssertionError on a violation.
    With ``firmware``, the C firmware must answer with exactly the reference's bytes."""
    whole = protocol.FrameParser()
    bytewise = protocol.FrameParser()
    reference = protocol.FrameParser()
    endpoint = make_endpoint()
    answers = bytearray()
    events = []
    for index, segment in enumerate(data.split(TIMEOUT_MARK)):
        if index:
            expired = whole.expire()
            assert expired == bytewise.expire()
            events += expired
            answers += endpoint.expire()
        got = whole.feed(segment)
        assert got == [e for i in range(len(segment)) for e in bytewise.feed(segment[i:i + 1])]
        for event in got:
            if isinstance(event, protocol.Frame):
                frame = protocol.encode_frame(event.api_level, event.opcode, event.seq, event.payload)
                assert frame in segment
        events += got
        answers += endpoint.feed(segment)
    events += whole.expire()
    answers += endpoint.expire()

    if firmware is not None:
        assert firmware.run(data) == bytes(answers), "the C firmware answered differently"
    replies = reference.feed(bytes(answers))
    assert not reference.mid_frame, "an answer ended mid-frame"
    assert len(replies) == len(events), f"{len(events)} frames and drops, {len(replies)} answers"
    # A retry repeats seq and opcode (docs/protocol.md), so even a cached answer names its request's opcode.
    for request, reply in zip(events, replies):
        assert isinstance(reply, protocol.Frame), f"malformed answer {reply} to {request}"
        assert reply.api_level == endpoint.api_level
        assert reply.seq == request.seq
        if reply.opcode == protocol.ERROR_OPCODE:
            _, opcode, seq, _ = protocol.ERROR_PAYLOAD.unpack(reply.payload)
            assert (opcode, seq) == (request.opcode, request.seq), (request, reply)
        else:
            assert reply.opcode == request.opcode | protocol.RESPONSE_FLAG, (request, reply)


def fuzz_main(argv: list[str]) -> None:
    """The atheris entry point: libFuzzer flags and corpus directories in ``argv``."""
    import atheris

    import somatile.model

    # The numba kernels of somatile.model cannot be compiled from instrumented bytecode (atheris excludes
    # modules by exact name); the protocol, the reference firmware and the tile model are instrumented.
    model_modules = [f"somatile.model.{p.stem}" for p in pathlib.Path(somatile.model.__path__[0]).glob("*.py")]
    with atheris.instrument_imports(include=["somatile"], exclude=model_modules):
        for name in ("somatile.host.protocol", "somatile.host.emu", "somatile.hw.tile_model", "somatile.hw.regmap"):
            importlib.import_module(name)
    from somatile.host import protocol

    firmware = FirmwareSession()
    corpus = [pathlib.Path(a) for a in argv[1:] if not a.startswith("-")]
    if corpus and corpus[0].is_dir() and not any(corpus[0].iterdir()):
        for n, session in enumerate(seed_sessions()):
            (corpus[0] / f"seed-{n:02d}").write_bytes(session)

    def one_input(data: bytes) -> None:
        check_input(data, protocol, endpoint_under_fuzz, firmware)

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        mutated = atheris.Mutate(data, max_size)
        return firmware.reseal(mutated) if seed & 1 else mutated

    atheris.Setup(argv, one_input, custom_mutator=mutate)
    atheris.Fuzz()


@pytest.mark.skipif(not ATHERIS_PLATFORM, reason="atheris 3.0.0 has wheels for Linux x86_64 and Python >= 3.11 only")
def test_atheris_bounded_run_finds_no_failure(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    result = subprocess.run(
        # -rss_limit_mb: libFuzzer's 2 GB default stopped one run of the suite on a loaded machine with a flat
        # 2.2 GB RSS from its first inputs (not a growth; the same run peaks at about 280 MB alone, cold numba
        # cache included). The limit guards against a leak; 4 GB still stops one within the bounded run.
        [sys.executable, __file__, f"-max_total_time={BOUNDED_SECONDS}", "-seed=20261129", "-print_final_stats=1",
         "-rss_limit_mb=4096",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=BOUNDED_SECONDS + 120)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = int(result.stderr.split("stat::number_of_executed_units:")[1].split()[0])
    new_units = int(result.stderr.split("stat::new_units_added:")[1].split()[0])
    assert runs > 100 and new_units > 0, result.stderr[-2000:]  # thresholds low: the machine may be busy


def test_seed_sessions_are_answered_without_errors_and_alike_by_the_c_firmware():
    from somatile.host import protocol

    session = seed_sessions()[0]
    check_input(session, protocol, endpoint_under_fuzz, FirmwareSession())
    replies = protocol.FrameParser().feed(endpoint_under_fuzz().feed(session))
    assert len(replies) > 5 and all(r.opcode != protocol.ERROR_OPCODE for r in replies)


def test_reseal_repairs_the_crc_of_every_complete_frame_only():
    from somatile.host import protocol

    frames = [protocol.encode_frame(3, 0x7E, seq, bytes(range(seq))) for seq in (0, 5, 40)]
    damaged = bytearray(b"xS" + b"".join(frames) + frames[0][:-2])
    for frame_end in (2 + len(frames[0]), 2 + len(frames[0]) + len(frames[1]) + len(frames[2])):
        damaged[frame_end - 1] ^= 0xFF  # the CRC of the first and the last complete frame
    repaired = FirmwareSession().reseal(bytes(damaged))
    assert repaired == b"xS" + b"".join(frames) + frames[0][:-2]


def test_checker_catches_a_device_that_answers_with_a_corrupted_frame():
    from somatile.host import protocol

    def corrupting_endpoint():
        endpoint = endpoint_under_fuzz()
        feed = endpoint.feed
        endpoint.feed = lambda data: bytes(b ^ 1 for b in feed(data))
        return endpoint

    with pytest.raises(AssertionError, match="answers"):
        check_input(seed_sessions()[0], protocol, corrupting_endpoint)


def test_checker_catches_a_c_firmware_that_answers_differently():
    from somatile.host import protocol
    from somatile.hw import regmap

    firmware = FirmwareSession()
    refused = bytes([regmap.FRAME_MAGIC, 0, 0, 1]) + bytes(regmap.HEADER_BYTES - 4)  # error code 1 on every command
    firmware.make_tiles = lambda: [lambda command: refused] * firmware.params.n_tiles
    with pytest.raises(AssertionError, match="answered differently"):
        check_input(seed_sessions()[0], protocol, endpoint_under_fuzz, firmware)


if __name__ == "__main__":
    fuzz_main(sys.argv)
