"""The C firmware (host build) against its Python reference, byte for byte, and under faults (the fuzz runs:
test_fuzz_frame.py).

The firmware runs as a real process; its link is a loopback TCP socket and its tile stream a socket to the
golden tile models (somatile.host.emu.serve_tiles).
"""

import socket
import threading
import time

import numpy as np
import pytest

import somatile.host
from somatile.host import protocol
from somatile.host.emu import ReferenceFirmware, board_params, start_tile_server
from somatile.host.protocol import LinkError, Opcode
from somatile.hw.tile_model import head_values
from somatile.host.transport_firmware import FIRMWARE_DIR, FirmwareProcess, build_firmware
from somatile.host.transport_tcp import TcpTransport, open_transport
from somatile.hw import regmap
from somatile.model import soma
from tests.damaging import Damaging

LEVEL = regmap.API_LEVEL


@pytest.fixture(scope="module")
def board():
    return board_params("sim")


@pytest.fixture(scope="module")
def tiles(board):
    return start_tile_server(board[0])


def config(params):
    return soma.SomaConfig(n_heads=params.heads, head_dim=params.head_dim, ring=params.ring, sinks=params.sinks,
                           integer=True, normaliser="hccs_int", alpha=0.1, alpha_mult=5, alpha_shift=3)


def tile_frame(tile, *args, **kwargs):
    return protocol.TILE_PREFIX.pack(tile) + regmap.pack_command(*args, **kwargs)


def session(params, rng, count):
    """A byte stream of `count` requests (valid, refused, repeated, damaged) for a fresh device, as chunks."""
    cfg = config(params)
    heads, d = params.heads, params.head_dim
    valid = [(Opcode.CONFIGURE, np.uint32(h).tobytes() + np.array(head_values(cfg, h), "<u4").tobytes())
             for h in range(heads)]
    choices = [
        lambda: (Opcode.TILE, tile_frame(0, regmap.Opcode.DECODE, 0, heads,
                                         rng.integers(-128, 128, 3 * heads * d).astype(np.int8).tobytes())),
        lambda: (Opcode.TILE, tile_frame(0, regmap.Opcode.READ_STATE, int(rng.integers(0, heads + 1)))),
        lambda: (Opcode.TILE, tile_frame(0, regmap.Opcode.HCCS, 1, 0, rng.integers(-128, 128, 2 * 80)
                                         .astype(np.int8).tobytes(), arg0=2, arg1=int(rng.integers(60, 81)))),
        lambda: (Opcode.TILE, tile_frame(int(rng.integers(0, 2)), int(rng.integers(0, 12)), 0, 1)),
        lambda: (Opcode.TILE, tile_frame(0, regmap.Opcode.CLEAR_ERROR) + bytes(int(rng.integers(0, 3)))),
        lambda: (Opcode.CONFIGURE, bytes(int(rng.integers(0, 90)))),
        lambda: (Opcode.RESET, b""),
        lambda: (Opcode.HELLO, b""),
        lambda: (int(rng.integers(5, 256)), b"?"),
    ]
    requests = valid + [choices[int(rng.integers(len(choices)))]() for _ in range(count)]
    stream, seq = bytearray(protocol.encode_frame(LEVEL, Opcode.HELLO, 500)), 500
    for opcode, payload in requests:
        seq = (seq + 1) & 0xFFFF
        frame = bytearray(protocol.encode_frame(LEVEL, opcode, seq, payload))
        fault = rng.random()
        if fault < 0.08:
            frame[int(rng.integers(len(frame)))] ^= 1 << int(rng.integers(8))  # damaged on the way
        elif fault < 0.12:
            frame = bytearray(protocol.encode_frame(LEVEL + 1, opcode, seq, payload))  # another API level
        elif fault < 0.16:
            seq = (seq + 2) & 0xFFFF  # a gap
        stream += frame
        if rng.random() < 0.1:
            stream += frame  # a retry of the same seq
        if rng.random() < 0.05:
            stream += rng.integers(0, 256, int(rng.integers(1, 30))).astype(np.uint8).tobytes()  # line noise
    return bytes(stream)


def run_firmware(url, stream, chunks, rng):
    """Send `stream` in random chunks while reading every answer; stop when the link has been quiet."""
    host, port = url.removeprefix("tcp://").split(":")
    answers = bytearray()
    with socket.create_connection((host, int(port))) as sock:
        def reader():
            sock.settimeout(3.0)
            try:
                while data := sock.recv(65536):
                    answers.extend(data)
            except (TimeoutError, socket.timeout):
                pass

        thread = threading.Thread(target=reader)
        thread.start()
        cuts = sorted(rng.integers(0, len(stream), chunks))
        for a, b in zip([0, *cuts], [*cuts, len(stream)]):
            sock.sendall(stream[a:b])
        thread.join()
    return bytes(answers)


def test_firmware_builds_warning_free_from_the_generated_headers(board):
    executable = build_firmware("sim")
    assert executable.exists()
    header = (FIRMWARE_DIR / "build" / "sim" / "gen" / "somatile_regmap.h").read_text()
    assert f"#define SOMATILE_HEADS {board[0].heads}u" in header
    assert f"#define SOMATILE_API_LEVEL {LEVEL}u" in header


@pytest.mark.parametrize("seed", [1, 2])
def test_firmware_answers_every_byte_stream_exactly_like_the_reference(board, tiles, seed):
    params, name = board
    rng = np.random.default_rng(seed)
    stream = session(params, rng, 120)
    reference = ReferenceFirmware(params, name)
    expected = reference.endpoint.feed(stream) + reference.endpoint.expire()
    with FirmwareProcess(tiles) as firmware:
        got = run_firmware(firmware.url, stream, 40, rng)
    events = protocol.FrameParser(1 << 20).feed(expected)
    kinds = {protocol.ERROR_PAYLOAD.unpack(e.payload)[0] for e in events if e.opcode == protocol.ERROR_OPCODE}
    assert {LinkError.BAD_CRC, LinkError.SEQUENCE, LinkError.WRONG_API_LEVEL} <= kinds  # the faults happened
    assert len(events) > 100
    assert got == expected


def test_each_link_fault_gets_its_error_frame_and_the_next_command_works(board, tiles):
    params, name = board
    hello = protocol.encode_frame(LEVEL, Opcode.HELLO, 1)
    read_id = protocol.encode_frame(LEVEL, Opcode.TILE, 2, tile_frame(0, regmap.Opcode.REG_READ, arg0=0))
    bad_crc = bytearray(read_id)
    bad_crc[-1] ^= 1
    oversize = protocol.HEADER.pack(b"ST", LEVEL, Opcode.TILE, 2, protocol.DEFAULT_MAX_PAYLOAD + 1)
    cases = [  # (bytes, expected error, whether the device executes the request and so consumes its seq)
        (bytes(bad_crc), LinkError.BAD_CRC, False),
        (oversize, LinkError.OVERSIZE, False),
        (read_id[:15], LinkError.TRUNCATED, False),  # then silence: the inter-byte timeout drops it
        (protocol.encode_frame(LEVEL, 0x42, 5), LinkError.UNKNOWN_OPCODE, True),  # seq after HELLO + 3 reads
        (protocol.encode_frame(LEVEL + 1, Opcode.TILE, 3), LinkError.WRONG_API_LEVEL, False),
    ]
    with FirmwareProcess(tiles) as firmware:
        transport = TcpTransport(*firmware.url.removeprefix("tcp://").split(":"))
        parser = protocol.FrameParser()
        transport.write(hello)
        assert parser.feed(transport.read_exact(len(hello) + protocol.INFO_FORMAT.size, 2))[0].opcode == 0x81
        seq = 1
        for data, code, executed in cases:
            transport.write(data)
            (answer,) = parser.feed(transport.read_exact(22, 2)) or pytest.fail(f"no error frame for {code!r}")
            assert answer.opcode == protocol.ERROR_OPCODE
            assert protocol.ERROR_PAYLOAD.unpack(answer.payload)[0] == code
            seq += 2 if executed else 1
            good = protocol.encode_frame(LEVEL, Opcode.TILE, seq, tile_frame(0, regmap.Opcode.REG_READ, arg0=0))
            for i in range(len(good)):  # and a frame split into single bytes still works
                transport.write(good[i:i + 1])
            (answer,) = parser.feed(transport.read_exact(10 + 16 + 4, 2))
            assert answer.opcode == Opcode.TILE | 0x80
            assert regmap.unpack_response(answer.payload).result == regmap.ID_VALUE
        transport.close()


def test_host_driver_recovers_from_corrupted_truncated_and_split_frames(board, tiles, rng):
    params, _ = board
    cfg = config(params)
    q, k, v = (rng.integers(-128, 128, (6, params.heads, params.head_dim)).astype(np.int8) for _ in range(3))
    with FirmwareProcess(tiles) as firmware:
        transport = Damaging(TcpTransport(*firmware.url.removeprefix("tcp://").split(":")))
        with open_transport(transport, firmware.url, timeout=1.0) as dev:
            dev.configure(cfg)
            dev.reset()
            base = transport.writes
            transport.plan = {base + 1: "corrupt", base + 3: "truncate", base + 5: "split", base + 6: "corrupt"}
            out = dev.decode(q, k, v)
            assert dev.link.retried == 3
    assert np.array_equal(out, soma.prefill(cfg, q, k, v)[0])


def test_two_tile_firmware_routes_heads_to_their_tiles_like_the_reference():
    import urllib.parse

    from somatile.host.device_cli import DEMO_QUERY, stream_device, stream_through
    from somatile.host.emu import url_board
    from somatile.host.transport_firmware import board_file

    query = f"{DEMO_QUERY}&n_tiles=2"
    _, board, overrides = url_board(urllib.parse.urlsplit(f"emu://?{query}"), {})
    params, name = board_params(board, overrides)
    emu = stream_through(f"emu://?{query}", tokens=14, seed=9)
    board_arg, build_name = board_file(board, overrides)
    with FirmwareProcess(start_tile_server(params), board=board_arg, build_name=build_name,
                         board_name=name) as firmware, somatile.host.open(firmware.url) as dev:
        assert dev.info().heads == 4 and dev.info().extra["n_tiles"] == 2
        got = stream_device(dev, tokens=14, seed=9)
    assert np.array_equal(got["decode"], emu["decode"]) and np.array_equal(got["hccs"], emu["hccs"])
    assert all(np.array_equal(got["state"][n], emu["state"][n]) for n in emu["state"])
