"""The tile-bus framing (hw/tile_bus.py) between a client and the golden tile server of the firmware's host build."""

import socket

import pytest

from somatile.host.emu import board_params, start_tile_server
from somatile.hw import regmap, tile_bus


def test_golden_server_answers_each_tile_through_the_framing():
    params = board_params("sim", {"n_tiles": 2})[0]
    with socket.create_connection(start_tile_server(params)) as connection:
        for tile in range(2):
            answer = tile_bus.request(connection, tile, regmap.pack_command(regmap.Opcode.REG_READ, arg0=0))
            response = regmap.unpack_response(answer)
            assert not response.error and response.result == regmap.ID_VALUE


def test_read_request_ends_at_a_closed_connection_and_refuses_malformed_requests():
    frame = regmap.pack_command(regmap.Opcode.REG_READ)
    cases = [(tile_bus.REQUEST.pack(tile_bus.KIND_COMMAND, 0, 0, len(frame)) + frame, (0, frame)),
             (tile_bus.REQUEST.pack(tile_bus.KIND_COMMAND, 0, 0, 0)[:5], None)]
    for sent, expected in cases:
        server, client = socket.socketpair()
        with server, client:
            client.sendall(sent)
            client.close()
            assert tile_bus.read_request(server, 1) == expected
    bad = {"kind 2, tile 0": tile_bus.REQUEST.pack(2, 0, 0, len(frame)) + frame,
           "kind 1, tile 1": tile_bus.REQUEST.pack(tile_bus.KIND_COMMAND, 1, 0, len(frame)) + frame,
           "length 99": tile_bus.REQUEST.pack(tile_bus.KIND_COMMAND, 0, 0, 99) + frame}
    for message, sent in bad.items():
        server, client = socket.socketpair()
        with server, client:
            client.sendall(sent)
            client.close()
            with pytest.raises(ConnectionError, match=message):
                tile_bus.read_request(server, 1)
