"""sim://: the tile RTL in Verilator behind the C firmware gives the same bytes as emu:// and the model.

The parameter set is the small tile of tests/hw/test_tile.py, so the Verilator build is shared with it.
"""

import numpy as np

import somatile.host
from somatile.host.device import DeviceError
from somatile.host.device_cli import DEMO_QUERY, stream_device, stream_through


def test_sim_agrees_with_emu_and_moves_state_and_errors_through_the_firmware(rng):
    emu = stream_through(f"emu://?{DEMO_QUERY}", tokens=24, seed=5)  # ring 8 + 2 sinks: wraps twice
    with somatile.host.open(f"sim://?{DEMO_QUERY}") as dev:
        sim = stream_device(dev, tokens=24, seed=5)
        assert sim["info"].board == "sim" and sim["info"].head_dim == 16
        assert np.array_equal(emu["decode"], sim["decode"]) and np.array_equal(emu["hccs"], sim["hccs"])
        assert all(np.array_equal(emu["state"][n], sim["state"][n]) for n in emu["state"])

        state = dict(sim["state"])
        ring_k = rng.integers(-128, 128, state["ring_k"].shape).astype(np.int8)
        state.update(ring_k=ring_k, write_pos=np.int32(3), fill=np.int32(8), step=np.int32(65536))
        dev.load_state(state)
        back = dev.read_state()
        assert np.array_equal(back["ring_k"], ring_k) and int(back["step"]) == 65536
        try:
            dev.load_state(dict(state, write_pos=np.int32(8)))  # outside 0..ring-1: refused, head cleared
        except DeviceError as exc:
            assert exc.command == "LOAD_STATE" and exc.code_name == "BAD_ARGUMENT"
        else:
            raise AssertionError("LOAD_STATE with write_pos = ring was accepted")
        dev.reset()
        assert not np.any(dev.read_state()["ring_k"])
        again = stream_device(dev, tokens=24, seed=5)  # the device still works after the fault
        assert np.array_equal(again["decode"], emu["decode"])
