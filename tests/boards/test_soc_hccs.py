"""The iCEBreaker's SoC (hw/soc.py with peripheral hccs_unit): PicoRV32 running the firmware whose command layer
is in C (firmware/src/soft_tile.c) in front of the 1-lane HCCS unit, data memory in the SPRAM model, all in
Verilator with the UART bridged to a pty; the unchanged serial driver talks to it (sim://?board=icebreaker&top=soc).

HCCS rows with calibrated parameters and every tile command it runs are compared with emu://?board=icebreaker
(the golden tile model) byte for byte; what it does not run (decode, the state) is refused before anything
is sent, with the device named.
"""

import argparse

import numpy as np
import pytest

import somatile.host
from somatile import boards
from somatile.boards.config import BoardError
from somatile.boards.soc import build_firmware, soc_section
from somatile.host import protocol
from somatile.host.device import DeviceError, UnsupportedCommand
from somatile.host import device_cli
from somatile.host.tile_driver import open_transport
from somatile.host.transport_serial import SerialTransport
from somatile.hw import regmap
from somatile.hw.regmap import Opcode
from somatile.model import calibrate, hccs, quant
from tests.damaging import Damaging

SOC_URL = "sim://?board=icebreaker&top=soc"
EMU_URL = "emu://?board=icebreaker"


@pytest.fixture(scope="module")
def dev():
    with somatile.host.open(SOC_URL) as device:
        yield device


def calibrated(rng, n: int, mode: str):
    """Parameters calibrated on seeded logits of one peaked head (rows of n), and those logits as int8."""
    logits = rng.normal(0.0, 2.0, (1, 40, n))
    logits[0, :, n // 3] += 4.0
    params = calibrate.calibrate_params(logits, mode=mode)
    return params, quant.quantize_logits(logits, params.scale)[0]


def registers(params, mode: str) -> dict:
    """A head block that runs HCCS with ``params`` on rows of any length: with the integer exp as the head's
    decode normaliser, CONFIGURE_HEAD does not hold the HCCS parameters to its slots (sinks + ring); the HCCS
    command checks them against its own rows."""
    return {"normaliser": "exp_int", "hccs_mode": mode, "hccs_B": int(params.B[0]), "hccs_S": int(params.S[0]),
            "hccs_dmax": int(params.dmax[0])}


def raw(device, frame: bytes) -> bytes:
    """The tile's response frame to ``frame``, as the firmware returns it (no checks on the host side)."""
    return device.link.request(protocol.Opcode.TILE, protocol.TILE_PREFIX.pack(0) + frame)


def test_calibrated_hccs_rows_are_the_golden_models_bit_for_bit(dev, rng):
    with somatile.host.open(EMU_URL) as emu:
        # Rows of the head's own slots (sinks + ring), configured as a calibrated HccsParams...
        params, x = calibrated(rng, dev.info().sinks + dev.info().ring, "div")
        for device in (dev, emu):
            device.configure(params)
        got = dev.hccs(x)
        assert got.dtype == np.uint8 and np.array_equal(got, emu.hccs(x))
        assert np.array_equal(got, hccs.hccs_int(x, params.B[0], params.S[0], params.dmax[0], mode="div"))
        # ... and longer rows up to n_max, clb and div, through several commands each (staging holds 128 logits).
        for n, mode in ((64, "clb"), (dev.info().n_max, "div"), (37, "clb")):
            params, x = calibrated(rng, n, mode)
            for device in (dev, emu):
                device.configure(registers(params, mode))
            got = dev.hccs(x)
            assert np.array_equal(got, emu.hccs(x)), (n, mode)
            assert np.array_equal(got, hccs.hccs_int(x, params.B[0], params.S[0], params.dmax[0], mode=mode))


@pytest.mark.slow
def test_every_row_length_with_random_valid_parameters_matches_the_model(dev, rng):
    """Rows of every length 1..n_max, each with random parameters inside the HCCS rules for it, div or clb."""
    info = dev.info()
    for n in range(1, info.n_max + 1):
        least_floor = -(-hccs.MIN_FLOOR_MASS // n)
        B = int(rng.integers(least_floor, hccs.MAX_ROW_MASS // n + 1))
        dmax = int(rng.integers(0, hccs.DMAX_MAX + 1))
        S = int(rng.integers(0, min(hccs.S_MAX, (B - least_floor) // dmax if dmax else hccs.S_MAX) + 1))
        mode = ("div", "clb")[n % 2]
        dev.configure({"normaliser": "exp_int", "hccs_mode": mode, "hccs_B": B, "hccs_S": S, "hccs_dmax": dmax})
        x = rng.integers(-128, 128, (2 * max(1, info.capacity // regmap.padded(n)), n)).astype(np.int8)
        assert np.array_equal(dev.hccs(x), hccs.hccs_int(x, B, S, dmax, mode=mode)), (n, B, S, dmax, mode)


def frames(info) -> list[bytes]:
    """Commands the HCCS SoC runs, and faulty ones, in an order that exercises the checks' priority and the
    latched error."""
    pack, global_address = regmap.pack_command, {name: 4 * i for i, (name, _, _) in enumerate(regmap.GLOBAL_REGISTERS)}
    good = [0] * len(regmap.HEAD_PARAMS)
    for p in regmap.HEAD_PARAMS:
        good[regmap.HEAD_INDEX[p.name]] = p.default
    good[regmap.HEAD_INDEX["hccs_B"]], good[regmap.HEAD_INDEX["hccs_S"]], good[regmap.HEAD_INDEX["hccs_dmax"]] = \
        1000, 20, 30
    negative_floor = list(good)
    negative_floor[regmap.HEAD_INDEX["hccs_S"]] = 127
    query_gate_on_keys = list(good)
    query_gate_on_keys[regmap.HEAD_INDEX["gating"]], query_gate_on_keys[regmap.HEAD_INDEX["field_source"]] = 1, 0
    out_of_range = list(good)
    out_of_range[regmap.HEAD_INDEX["score_shift"]] = 48
    block = lambda values: np.array(values, "<u4").tobytes()  # noqa: E731
    rows = np.arange(-40, 40, dtype=np.int8)[:32].reshape(2, 16)
    readable = [a for name, a in global_address.items() if name != "CYCLES_LAST"]  # the model has no clock
    return [
        pack(Opcode.HCCS, payload=rows.tobytes(), arg0=2, arg1=16),        # NOT_CONFIGURED (after a reset)
        *[pack(Opcode.REG_READ, arg0=a) for a in readable],
        *[pack(Opcode.REG_READ, arg0=regmap.INFO_BASE + 4 * i) for i in range(len(regmap.INFO_FIELDS) - 1)],
        *[pack(Opcode.REG_READ, arg0=regmap.head_register(0, i)) for i in range(len(regmap.HEAD_PARAMS) + 1)],
        pack(Opcode.REG_READ, arg0=2), pack(Opcode.REG_READ, arg0=0x28), pack(Opcode.REG_READ, arg0=0x2000),
        pack(Opcode.REG_WRITE, arg0=global_address["SCRATCH"], arg1=0xDEADBEEF),
        pack(Opcode.REG_WRITE, arg0=global_address["ID"], arg1=1),
        pack(Opcode.REG_READ, arg0=global_address["SCRATCH"]), pack(Opcode.REG_READ, arg0=global_address["STATUS"]),
        pack(Opcode.REG_READ, arg0=global_address["ERROR_CODE"]), pack(Opcode.CLEAR_ERROR),
        pack(Opcode.INFO, magic=0x5A), pack(0x0B), pack(0x00), pack(Opcode.INFO, length=16),
        pack(Opcode.REG_READ, arg0=global_address["ERROR_OPCODE"]), pack(Opcode.CLEAR_ERROR),
        pack(Opcode.CONFIGURE_HEAD, head=info.heads, payload=block(good)),
        pack(Opcode.CONFIGURE_HEAD, payload=block(negative_floor)),
        pack(Opcode.CONFIGURE_HEAD, payload=block(query_gate_on_keys)),
        pack(Opcode.CONFIGURE_HEAD, payload=block(out_of_range)),
        pack(Opcode.CONFIGURE_HEAD, payload=block(good), length=64),
        pack(Opcode.CONFIGURE_HEAD, payload=block(good)),
        pack(Opcode.REG_READ, arg0=global_address["CONFIGURED"]),
        pack(Opcode.REG_READ, arg0=regmap.head_register(0, regmap.HEAD_INDEX["hccs_S"])),
        pack(Opcode.HCCS, payload=rows.tobytes(), arg0=2, arg1=16),
        pack(Opcode.HCCS, payload=rows.tobytes(), arg0=2, arg1=0),
        pack(Opcode.HCCS, payload=rows.tobytes(), arg0=0, arg1=16),
        pack(Opcode.HCCS, payload=rows.tobytes(), arg0=2, arg1=info.n_max + 1),
        pack(Opcode.HCCS, payload=bytes(144), arg0=9, arg1=16),             # beyond staging_bytes
        pack(Opcode.HCCS, payload=rows.tobytes(), arg0=0xFFFFFFFF, arg1=16),  # rows * row bytes past 2**32
        pack(Opcode.HCCS, payload=rows.tobytes(), arg0=2, arg1=16, length=16),
        pack(Opcode.HCCS, payload=rows[:1].tobytes(), arg0=2, arg1=16, length=32),
        pack(Opcode.HCCS, payload=rows[:1].tobytes()[:8], arg0=1, arg1=8),  # floor mass 8 * 400 fine
        pack(Opcode.HCCS, payload=bytes(16), arg0=1, arg1=1),               # floor mass 1 * 400 fine
        pack(Opcode.REG_READ, arg0=global_address["COMMANDS"]), pack(Opcode.CLEAR_ERROR),
    ]


def test_every_command_it_runs_and_each_fault_answers_like_the_golden_model(dev):
    # Half a frame, then the board's reset button: the heads come back unconfigured, the registers cleared,
    # and the rest of the frame never comes.
    half = SerialTransport(dev.simulation.pty)
    half.write(protocol.encode_frame(regmap.API_LEVEL, protocol.Opcode.TILE, 1, bytes(64))[:30])
    dev.simulation.reset()
    half.close()
    info = dev.info()
    with somatile.host.open(EMU_URL) as emu, \
            open_transport(SerialTransport(dev.simulation.pty), "soc-raw", timeout=10.0) as soc:
        for frame in frames(info):
            assert raw(soc, frame) == raw(emu, frame), frame.hex()
        # INFO: the model's registers but for the commands this tile runs (the last INFO register).
        soft = regmap.commands_mask(Opcode[name] for name in info.commands)
        words = regmap.info_values(boards.load("icebreaker").tile)[:-1] + [soft]
        assert regmap.unpack_response(raw(soc, regmap.pack_command(Opcode.INFO))).payload == \
            np.array(words, "<u4").tobytes()
        assert soc.tile_command(0, Opcode.REG_READ, arg0=regmap.INFO_BASE + 4 * (len(words) - 1)).result == soft
        # The commands it does not run: UNKNOWN_OPCODE, latched like any error, and not run by the firmware's
        # own RESET either (which only clears the error there).
        for opcode in (Opcode.DECODE, Opcode.READ_STATE, Opcode.LOAD_STATE, Opcode.RESET_STATE):
            response = regmap.unpack_response(raw(soc, regmap.pack_command(opcode, count=1)))
            assert (response.opcode, response.error, response.payload) == (opcode, regmap.ErrorCode.UNKNOWN_OPCODE, b"")
        assert soc.tile_command(0, Opcode.REG_READ, arg0=4 * 3).result == regmap.ErrorCode.UNKNOWN_OPCODE
        soc.reset()
        assert soc.tile_command(0, Opcode.REG_READ, arg0=4 * 2).result == 0  # STATUS: no error latched
    dev.link.hello()  # the fixture's link, after the SoC's reset


def test_decode_and_the_state_are_refused_naming_the_device_and_agree_runs_hccs_only(dev, capsys):
    info = dev.info()
    assert info.commands == ("INFO", "REG_READ", "REG_WRITE", "CONFIGURE_HEAD", "HCCS", "CLEAR_ERROR")
    with somatile.host.open(EMU_URL) as emu:
        assert not info.decodes and emu.info().decodes
    q = np.zeros((info.heads, info.head_dim), np.int8)
    message = r"decode\(\).*sim://\?board=icebreaker&top=soc \(board icebreaker\) runs only INFO.*HCCS.*no DECODE"
    with pytest.raises(UnsupportedCommand, match=message):
        dev.decode(q, q, q)
    with pytest.raises(UnsupportedCommand, match=r"read_state\(\).*no READ_STATE"):
        dev.read_state()
    with pytest.raises(UnsupportedCommand, match=r"load_state\(\).*no READ_STATE, LOAD_STATE"):
        dev.load_state({})
    dev.reset()  # clears the latched error; there is no state to clear
    # `somatile device agree` (the emu:// side of it decodes: tests/host/test_device_cli.py)
    assert device_cli.run(argparse.Namespace(action="agree", urls=[SOC_URL], tokens=4, seed=2)) == 0
    out = capsys.readouterr().out
    assert f"SKIPPED {SOC_URL}: decode and state skipped: the device runs only INFO, REG_READ, REG_WRITE, " \
           f"CONFIGURE_HEAD, HCCS, CLEAR_ERROR (no decode unit)" in out
    assert "HCCS 16 rows" in out and "all devices agree" in out
    assert device_cli.run(argparse.Namespace(action="decode", url=SOC_URL, tokens=4, seed=2)) == 2
    assert "runs only INFO" in capsys.readouterr().err


def test_damaged_frames_garbage_and_a_stalled_unit_are_survived(dev, rng):
    params, x = calibrated(rng, 18, "clb")
    expected = hccs.hccs_int(x, params.B[0], params.S[0], params.dmax[0], mode="clb")
    transport = Damaging(SerialTransport(dev.simulation.pty))
    with open_transport(transport, "soc-damaged", timeout=4.0) as damaged:
        damaged.configure(params)
        base = transport.writes
        transport.plan = {base + 1: "corrupt", base + 3: "truncate", base + 5: "noise", base + 6: "split",
                          base + 8: "corrupt"}
        assert np.array_equal(damaged.hccs(x), expected)
        assert damaged.link.retried >= 3
        # More garbage than the UART's receive FIFO holds, then a new host: HELLO resynchronises.
        transport.inner.write(rng.integers(0, 256, 3000, dtype=np.uint8).tobytes())
    with open_transport(SerialTransport(dev.simulation.pty), "soc-after-garbage", timeout=10.0) as host:
        host.configure(params)
        assert np.array_equal(host.hccs(x), expected)
        # A unit whose probabilities are not read: TILE_TIMEOUT; the late ones are dropped, not taken for the next.
        dev.simulation.hold(True)
        dev.simulation.cycles()  # the bench reads its commands in order: the hold is on once this answers
        with pytest.raises(DeviceError, match="TILE_TIMEOUT"):
            host.hccs(x[:1])
        dev.simulation.hold(False)
        assert np.array_equal(host.hccs(x[1:]), expected[1:])


def test_hccs_soc_build_errors_name_the_board_key(tmp_path):
    cfg = boards.load("icebreaker")
    with pytest.raises(BoardError, match=r"icebreaker.yaml: key 'soc.code_kib': got 4 KiB, the firmware overflowed"):
        build_firmware(cfg.with_soc({"code_kib": 4}), 24e6, tmp_path / "small")
    with pytest.raises(BoardError, match=r"key 'hccs_lanes': got 4, expected 1 for soc.peripheral: hccs_unit"):
        soc_section(cfg.with_overrides({"hccs_lanes": 4}))
    with pytest.raises(BoardError, match=r"key 'soc.data_kib': got 32, expected a multiple of 64 with data_ram: spram"):
        soc_section(cfg.with_soc({"data_kib": 32}))
    with pytest.raises(BoardError, match=r"key 'soc.data_ram': got 'spram', expected 'block' on LFE5U-85F"):
        soc_section(boards.load("ulx3s_85f").with_soc({"data_ram": "spram"}))
    board = tmp_path / "other_peripheral.yaml"
    board.write_text("extends: icebreaker\nsoc:\n  peripheral: decode_unit\n")
    with pytest.raises(BoardError, match=r"key 'soc.peripheral': got 'decode_unit', expected one of tile_array, "
                                         r"hccs_unit"):
        boards.load(str(board))
