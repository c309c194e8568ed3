"""Bad input through the device API (issue 24): configure and load_state are all or nothing and refuse
values they cannot represent, naming the head, register or array; the device is unchanged afterwards."""

import numpy as np
import pytest

import somatile.host
from somatile.host.device import DeviceError
from somatile.host.emu import LoopbackTransport, ReferenceFirmware, board_params
from somatile.host.tile_driver import open_transport
from somatile.hw import regmap, tile_model
from somatile.model import soma
from tests.host.test_device import HEADS, config, tokens

@pytest.fixture(scope="module")
def firmware_url():
    from somatile.host.emu import start_tile_server
    from somatile.host.transport_firmware import FirmwareProcess

    with FirmwareProcess(start_tile_server(board_params("sim")[0])) as firmware:
        yield firmware.url


def head_registers(dev, head):
    return [dev.tile_command(0, regmap.Opcode.REG_READ, arg0=regmap.head_register(head, i)).result
            for i in range(len(regmap.HEAD_PARAMS))]


@pytest.mark.parametrize("where", ["emu", "firmware"])
def test_refused_configure_and_load_state_leave_every_head_as_it_was(rng, firmware_url, where):
    cfg = config()
    q, k, v = tokens(rng, 12)
    with somatile.host.open("emu://" if where == "emu" else firmware_url) as dev:
        dev.configure(cfg)
        dev.reset()
        dev.decode(q[:8], k[:8], v[:8])
        registers = [head_registers(dev, h) for h in range(HEADS)]
        state = dev.read_state()
        bad_states = {
            "'step': expected one integer in 0..2147483647": {**state, "step": np.int64(2 ** 31)},
            "array 'ring_k', head 1: values outside int8": {**state, "ring_k": np.concatenate(
                [state["ring_k"][:1], np.full_like(state["ring_k"][1:], 300, dtype=np.int32)])},
            "array 'field': expected integers, got dtype float64": {**state, "field": state["field"] + 0.5},
            r"array 'sink_v': expected shape \(2, 4, 64\)": {**state, "sink_v": state["sink_v"][:1]},
            "missing array 'fill'": {n: a for n, a in state.items() if n != "fill"},
            "unknown array 'ring'": {**state, "ring": state["ring_k"]},
        }
        for message, bad in bad_states.items():
            with pytest.raises(ValueError, match=message):
                dev.load_state(bad)
        B0 = registers[0][regmap.HEAD_INDEX["hccs_B"]]
        bad_configs = {
            r"head 1: register hccs_B = 100.9: expected an integer": {"hccs_B": [B0, 100.9]},
            "head 0: the tile refuses this parameter block: head parameter score_shift = 200": {"score_shift": 200},
            r"head 1: .*head parameter out_shift = 4294967296": {"out_shift": [7, 2 ** 32]},
            "head 0: .*head parameter alpha_mult = -1": {"alpha_mult": -1},
            "gating = 'sometimes': expected one of": {"gating": "sometimes"},
        }
        for message, bad in bad_configs.items():
            with pytest.raises(ValueError, match=message):
                dev.configure(bad)
        assert [head_registers(dev, h) for h in range(HEADS)] == registers
        after = dev.read_state()
        assert all(np.array_equal(after[n], state[n]) for n in state)
        assert np.array_equal(dev.decode(q[8:], k[8:], v[8:]), soma.prefill(cfg, q, k, v)[0][8:])


def refusing_device(refuse: set):
    """emu:// whose tile refuses CONFIGURE_HEAD and LOAD_STATE for head 1 while ``refuse`` holds "armed":
    a device that disagrees with the host's checks, for the host's roll-back."""
    params, name = board_params("sim")
    model = tile_model.TileModel(params)

    def port(frame: bytes) -> bytes:
        opcode, head = frame[1], frame[2]
        if "armed" in refuse and head == 1 and opcode in (regmap.Opcode.CONFIGURE_HEAD, regmap.Opcode.LOAD_STATE):
            return regmap.pack_response(opcode, head, regmap.ErrorCode.BAD_ARGUMENT, b"", 0)
        return model.command(frame)

    firmware = ReferenceFirmware(params, name, tiles=[port])
    return open_transport(LoopbackTransport(firmware.endpoint), "emu://refusing")


def test_a_head_the_device_refuses_rolls_the_heads_before_it_back(rng):
    refuse: set = set()
    q, k, v = tokens(rng, 6)
    with refusing_device(refuse) as dev:
        dev.configure(config())
        dev.decode(q[:3], k[:3], v[:3])
        registers, state = head_registers(dev, 0), dev.read_state()
        refuse.add("armed")
        with pytest.raises(DeviceError, match="CONFIGURE.*head 1 refused"):
            dev.configure(config(score_shift=(9, 9)))
        with pytest.raises(DeviceError, match="LOAD_STATE"):
            dev.load_state({**state, "ring_k": np.zeros_like(state["ring_k"])})
        refuse.clear()
        assert head_registers(dev, 0) == registers
        after = dev.read_state()
        assert all(np.array_equal(after[n], state[n]) for n in state)
        assert np.array_equal(dev.decode(q[3:], k[3:], v[3:]), soma.prefill(config(), q, k, v)[0][3:])


@pytest.mark.parametrize("where", ["emu", "firmware"])
def test_a_closed_device_refuses_every_call(rng, firmware_url, where):
    # Issue 24: emu:// went on working after close().
    q, k, v = tokens(rng, 1)
    dev = somatile.host.open("emu://" if where == "emu" else firmware_url)
    dev.configure(config())
    dev.close()
    for call in (lambda: dev.decode(q, k, v), dev.read_state, dev.reset, lambda: dev.configure(config()),
                 lambda: dev.hccs(q[0])):
        with pytest.raises(ValueError, match="the device is closed"):
            call()
    dev.close()  # closing twice is harmless


@pytest.mark.parametrize("url, options, message", [
    ("emu://", {"retries": -5}, "retries = -5: expected a non-negative integer"),
    ("emu://", {"retries": 1.5}, "retries = 1.5: expected a non-negative integer"),
    ("emu://?timeout=nan", {}, "timeout = nan: expected a positive finite number"),
    ("emu://", {"timeout": 0}, "timeout = 0: expected a positive finite number"),
    ("emu://?retries=many", {}, "option retries='many': expected an integer"),
])
def test_link_options_out_of_range_are_value_errors_not_timeouts(url, options, message):
    with pytest.raises(ValueError, match=message):
        somatile.host.open(url, **options)
