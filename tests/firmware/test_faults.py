"""The firmware's host build against hosts that misbehave (issue 24): hosts that vanish before reading their
answers, hosts that connect and say nothing, retries that change their payload. Each test ends by checking
that the next valid host is served. The soak (many such hosts at once) is tests/firmware/test_soak.py."""

import socket
import time

import numpy as np
import pytest

import somatile.host
from somatile.host import protocol
from somatile.host.emu import board_params, start_tile_server
from somatile.host.protocol import LinkError, Opcode
from somatile.host.transport_firmware import FirmwareProcess
from somatile.hw import regmap

LEVEL = regmap.API_LEVEL
# firmware/hal/host/main.c: HOST_IDLE_TAKEOVER_MS
IDLE_TAKEOVER_S = 3.0


@pytest.fixture(scope="module")
def tiles():
    return start_tile_server(board_params("sim")[0])


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("tcp://").split(":")
    return host, int(port)


def serves_a_valid_host(firmware: FirmwareProcess, **options) -> bool:
    """A new host connects, says HELLO and reads register ID through the tile: the firmware is alive."""
    with somatile.host.open(firmware.url, **options) as dev:
        return dev.tile_command(0, regmap.Opcode.REG_READ, arg0=0).result == regmap.ID_VALUE


def test_a_host_that_closes_before_reading_its_answers_costs_only_its_connection(tiles):
    # Found by issue 24: the firmware wrote the second answer into a reset connection and died of SIGPIPE.
    hellos = protocol.encode_frame(LEVEL, Opcode.HELLO, 1) * 20
    with FirmwareProcess(tiles) as firmware:
        for _ in range(3):
            with socket.create_connection(address(firmware.url)) as sock:
                sock.sendall(hellos)
        for _ in range(2):  # and one that resets the connection (SO_LINGER 0) mid-way through its answers
            sock = socket.create_connection(address(firmware.url))
            sock.sendall(hellos)
            sock.recv(1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            sock.close()
        assert serves_a_valid_host(firmware)
        assert firmware.process.poll() is None


def test_an_idle_host_gives_the_device_up_to_a_waiting_one_and_keeps_it_when_nobody_waits(tiles):
    with FirmwareProcess(tiles) as firmware:
        silent = socket.create_connection(address(firmware.url))  # connects and never says anything
        start = time.monotonic()
        assert serves_a_valid_host(firmware, timeout=2.0, retries=2)
        waited = time.monotonic() - start
        assert IDLE_TAKEOVER_S * 0.9 <= waited < IDLE_TAKEOVER_S + 1.5
        silent.settimeout(1.0)
        assert silent.recv(1) == b""  # the firmware closed the idle connection
        silent.close()

        # An owner idle for longer than the takeover time keeps the device while nobody else asks for it.
        with somatile.host.open(firmware.url) as owner:
            time.sleep(IDLE_TAKEOVER_S + 1)
            assert owner.tile_command(0, regmap.Opcode.REG_READ, arg0=0).result == regmap.ID_VALUE


def test_an_owner_that_only_sends_garbage_is_idle_for_the_takeover(tiles):
    # Bytes that never make a frame are not a host using the device: line noise must not hold it.
    import threading

    with FirmwareProcess(tiles) as firmware:
        noisy = socket.create_connection(address(firmware.url))
        stop = threading.Event()

        def babble():
            try:
                while not stop.wait(0.05):
                    noisy.sendall(b"S\x00noise" + protocol.MAGIC[:1])
            except OSError:
                pass  # the firmware dropped this host

        thread = threading.Thread(target=babble)
        thread.start()
        start = time.monotonic()
        try:
            assert serves_a_valid_host(firmware, timeout=2.0, retries=2)
            assert time.monotonic() - start < IDLE_TAKEOVER_S + 1.5
        finally:
            stop.set()
            thread.join()
            noisy.close()


def test_a_retry_must_repeat_the_payload_of_the_request_it_retries(tiles):
    read_id = protocol.TILE_PREFIX.pack(0) + regmap.pack_command(regmap.Opcode.REG_READ, arg0=0)
    read_api = protocol.TILE_PREFIX.pack(0) + regmap.pack_command(regmap.Opcode.REG_READ, arg0=4)
    stream = (protocol.encode_frame(LEVEL, Opcode.HELLO, 7) + protocol.encode_frame(LEVEL, Opcode.TILE, 8, read_id)
              + protocol.encode_frame(LEVEL, Opcode.TILE, 8, read_id)    # a retry: the cached answer
              + protocol.encode_frame(LEVEL, Opcode.TILE, 8, read_api))  # same seq, other payload: refused
    with FirmwareProcess(tiles) as firmware, socket.create_connection(address(firmware.url)) as sock:
        sock.sendall(stream)
        sock.settimeout(2.0)
        answers, parser = [], protocol.FrameParser(1 << 20)
        while len(answers) < 4:
            answers += parser.feed(sock.recv(65536))
    first, again, refused = answers[1:]
    assert first == again and regmap.unpack_response(first.payload).result == regmap.ID_VALUE
    assert refused.opcode == protocol.ERROR_OPCODE
    assert protocol.ERROR_PAYLOAD.unpack(refused.payload) == (LinkError.SEQUENCE, Opcode.TILE, 8, 9)
