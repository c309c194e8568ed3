"""sim://: the tile RTL in Verilator behind the C firmware gives the same bytes as emu:// and the model.

The parameter set is the small tile of tests/hw/test_tile.py, so the Verilator build is shared with it.
"""

import numpy as np
import pytest

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
        with pytest.raises(ValueError, match="'write_pos': expected one integer in 0..7"):
            dev.load_state(dict(state, write_pos=np.int32(8)))  # the host refuses it before any head changes
        assert np.array_equal(dev.read_state()["ring_k"], ring_k)
        # Past the host's check the tile refuses it too (and clears that head, never half-loads it).
        from somatile.hw import regmap, tile_model

        params = dev.tile_params()
        bad = tile_model.arrays_to_state(params, {**{n: a[:1] if a.ndim else a for n, a in state.items()},
                                                  "write_pos": np.int32(8)})
        with pytest.raises(DeviceError) as info:
            dev.tile_command(0, regmap.Opcode.LOAD_STATE, 0, 0, bytes(bad))
        assert info.value.command == "LOAD_STATE" and info.value.code_name == "BAD_ARGUMENT"
        dev.reset()
        assert not np.any(dev.read_state()["ring_k"])
        again = stream_device(dev, tokens=24, seed=5)  # the device still works after the fault
        assert np.array_equal(again["decode"], emu["decode"])


def test_the_wide_tile_rtl_behind_the_firmware_agrees_with_emu():
    """sim:// of the wide profile (the demo's small tile of boards/sim_wide.yaml): the int16 decode outputs, the
    final state and the HCCS command's Q15 rows (the demo head's pwl2) equal emu://'s and the model's."""
    from somatile.host.device_cli import DEMO_WIDE_QUERY, agree

    result = agree([f"emu://?{DEMO_WIDE_QUERY}", f"sim://?{DEMO_WIDE_QUERY}"], tokens=24, seed=3)
    assert result["agree"], result["mismatches"]
    emu, sim = result["runs"]
    assert sim["info"].profile == "wide" and sim["decode"].dtype == np.int16
    assert len(np.unique(sim["decode"])) > 20 and sim["hccs"].dtype == np.uint16


def test_the_wide_tile_rtl_normalises_minilm_logits_with_their_calibration_like_the_spec():
    """MiniLM's own attention logits (layer 1, sentences of up to 32 tokens) as int16 rows through the wide
    tile's HCCS command behind the firmware, each head configured with pwl2 parameters calibrated on other
    sentences (fallback heads on the exp): equal to the wide spec and to emu://."""
    from somatile.eval import text
    from somatile.eval.minilm import collect_minilm_logits
    from somatile.host.device_cli import DEMO_WIDE_QUERY
    from somatile.model import wide
    from somatile.model.calibrate import calibrate_wide_params
    from somatile.model.minilm import MiniLM

    cols = 32  # the demo tile's n_max
    model = MiniLM.load()
    pool = [s for s in text.sentences(text.load_text(), None) if len(model.encode(s)) <= cols]
    calib, calib_mask = collect_minilm_logits(model, pool[:12], cols)[1]
    logits, mask = collect_minilm_logits(model, pool[12:16], cols)[1]
    heads = [0, 5]  # one broad and one sharp head of layer 1 onto the tile's two heads
    params = calibrate_wide_params(calib[heads], calib_mask[heads], normaliser="pwl2")
    x = wide.logits_from_float(logits[heads], mask[heads])
    with somatile.host.open(f"sim://?{DEMO_WIDE_QUERY}") as sim, \
            somatile.host.open(f"emu://?{DEMO_WIDE_QUERY}") as emu:
        for dev in (sim, emu):
            dev.configure(params)
        valid = mask[heads[0]].sum(axis=1)  # a sentence's rows: its tokens, then padding
        for h in range(2):
            name = "exp" if params.fallback[h] else "pwl2"
            for n in np.unique(valid):  # the HCCS command takes whole rows (no mask): a sentence at a time
                rows = np.ascontiguousarray(x[h][valid == n, :n])
                want = wide.wide_softmax(rows, name, int(params.B[h]), int(params.S[h]), int(params.dmax[h]),
                                         impl="numpy")
                assert np.array_equal(sim.hccs(rows, head=h), want), (h, n)
                assert np.array_equal(emu.hccs(rows, head=h), want), (h, n)
