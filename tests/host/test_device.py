"""The device API: the same tensors through every backend available here, compared exactly with the model
and with each other; state transfer; errors that name what is wrong."""

import dataclasses

import numpy as np
import pytest

import somatile.host
from somatile.host.device import DeviceError, DeviceTimeout
from somatile.host.tile_driver import TileDevice
from somatile.model import hccs, soma
from somatile.model.params import HccsParams

HEADS, HEAD_DIM, RING, SINKS = 2, 64, 64, 4  # the "sim" board


def config(**overrides):
    base = dict(n_heads=HEADS, head_dim=HEAD_DIM, ring=RING, sinks=SINKS, integer=True, normaliser="hccs_int",
                alpha=0.1, alpha_mult=5, alpha_shift=3, score_shift=(5, 6), out_shift=(7, 8))
    base.update(overrides)
    return soma.SomaConfig(**base)


def tokens(rng, steps):
    return tuple(rng.integers(-128, 128, (steps, HEADS, HEAD_DIM)).astype(np.int8) for _ in range(3))


@pytest.fixture(scope="module")
def firmware_urls():
    """The C firmware's host build over TCP and over a pty (serial://), on golden tile models."""
    from somatile.host.emu import board_params, start_tile_server
    from somatile.host.transport_firmware import FirmwareProcess

    params, _ = board_params("sim")
    tiles = start_tile_server(params)
    with FirmwareProcess(tiles, link="tcp") as tcp, FirmwareProcess(tiles, link="pty") as pty:
        yield [tcp.url, pty.url]


def test_emu_decode_matches_the_model_through_ring_wraparound(rng):
    cfg = config()
    q, k, v = tokens(rng, RING + SINKS + 20)
    with somatile.host.open("emu://") as dev:
        dev.configure(cfg)
        out = dev.decode(q, k, v)
        state = dev.read_state()
    ref, ref_state = soma.prefill(cfg, q, k, v)
    assert out.dtype == np.int8 and np.array_equal(out, ref)
    for name, value in ref_state.to_arrays().items():
        assert np.array_equal(state[name], value), name


def test_emu_state_moves_between_devices_and_decoding_continues_exactly(rng):
    cfg = config(normaliser="exp_int", field_source="keys")
    q, k, v = tokens(rng, 90)
    ref, _ = soma.prefill(cfg, q, k, v)
    with somatile.host.open("emu://") as first, somatile.host.open("emu://?board=sim") as second:
        first.configure(cfg)
        second.configure(cfg)
        head = first.decode(q[:70], k[:70], v[:70])
        second.load_state(first.read_state())
        tail = second.decode(q[70:], k[70:], v[70:])
        assert np.array_equal(np.concatenate([head, tail]), ref)
        second.reset()
        assert all(not np.any(a) for a in second.read_state().values())
        assert np.array_equal(second.decode(q[:5], k[:5], v[:5]), ref[:5])


def test_emu_hccs_matches_hccs_int_per_head_with_chunking(rng, tmp_path):
    params = HccsParams(B=np.array([452, 400]), S=np.array([14, 9]), dmax=np.array([32, 40]),
                        fallback=np.array([False, False]), scale=np.array([0.1, 0.1]), cols=70)
    params.to_yaml(tmp_path / "hccs.yaml")
    x = rng.integers(-128, 128, (100, 70)).astype(np.int8)  # 100 rows of 80 padded bytes: 17 commands
    with somatile.host.open("emu://") as dev:
        dev.configure(str(tmp_path / "hccs.yaml"))
        for head in range(HEADS):
            want = hccs.hccs_int(x, int(params.B[head]), int(params.S[head]), int(params.dmax[head]))
            assert np.array_equal(dev.hccs(x, head=head), want)
        assert np.array_equal(dev.hccs(x[0], head=1), hccs.hccs_int(x[:1], 400, 9, 40)[0])


def test_every_backend_here_gives_identical_bytes(rng, firmware_urls):
    cfg = config(include_self=False, recency_int=(1, 2))
    q, k, v = tokens(rng, 75)
    x = rng.integers(-128, 128, (40, RING + SINKS)).astype(np.int8)  # the row length cfg derives HCCS for
    results = {}
    for url in ["emu://"] + firmware_urls:
        with somatile.host.open(url) as dev:
            assert dev.info().board == "sim" and dev.info().heads == HEADS
            dev.configure(cfg)
            results[url] = (dev.decode(q, k, v), dev.read_state(), dev.hccs(x, head=1))
    ref, ref_state = soma.prefill(cfg, q, k, v)
    for url, (out, state, probs) in results.items():
        assert np.array_equal(out, ref), url
        assert all(np.array_equal(state[n], a) for n, a in ref_state.to_arrays().items()), url
        assert np.array_equal(probs, results["emu://"][2]), url


def test_device_errors_name_the_command_and_code_and_the_device_keeps_working(rng, firmware_urls):
    q, k, v = tokens(rng, 3)
    with somatile.host.open("emu://") as dev:  # fresh tiles: no head configured yet
        with pytest.raises(DeviceError, match="DECODE: NOT_CONFIGURED") as info:
            dev.decode(q, k, v)
        assert info.value.command == "DECODE"
    from somatile.hw import regmap

    bad_block = [200 if p.name == "score_shift" else p.default for p in regmap.HEAD_PARAMS]  # takes 0..47
    for url in ["emu://", firmware_urls[0]]:
        with somatile.host.open(url) as dev:
            with pytest.raises(DeviceError, match="CONFIGURE.*TILE_REFUSED.*BAD_ARGUMENT"):
                dev.configure_head(0, bad_block)  # past the host's own check: the device refuses it too
            dev.configure(config())
            dev.reset()
            assert np.array_equal(dev.decode(q, k, v), soma.prefill(config(), q, k, v)[0])


def test_a_tile_command_with_any_count_byte_leaves_every_backend_in_step(rng, firmware_urls):
    # Issue 24: HCCS with count 74 raised IndexError in the tile model: emu:// leaked it and lost its
    # sequence, the firmware's tile server died. The count byte of HCCS is ignored, as by the RTL.
    from somatile.hw.regmap import Opcode

    q, k, v = tokens(rng, 2)
    x = rng.integers(-128, 128, (1, 64)).astype(np.int8)
    for url in ["emu://", firmware_urls[0]]:
        with somatile.host.open(url) as dev:
            dev.configure(config())
            dev.reset()
            answers = {count: dev.tile_command(0, Opcode.HCCS, 0, count, x.tobytes(), 1, 64).payload
                       for count in (0, 74, 255)}
            assert len(set(answers.values())) == 1
            assert np.array_equal(dev.decode(q, k, v), soma.prefill(config(), q, k, v)[0])


def test_bad_arguments_are_refused_with_the_tensor_named():
    with somatile.host.open("emu://") as dev:
        with pytest.raises(ValueError, match="tensor q: expected trailing shape"):
            dev.decode(np.zeros((2, 32), np.int8), np.zeros((2, 64), np.int8), np.zeros((2, 64), np.int8))
        with pytest.raises(TypeError, match="tensor x: expected int8 values"):
            dev.hccs(np.zeros((2, 8), np.float32))
        with pytest.raises(ValueError, match="tensor x: values outside int8"):
            dev.hccs(np.full((2, 8), 300))
        with pytest.raises(ValueError, match="rows of 300 elements; the device takes 1..256"):
            dev.hccs(np.zeros((2, 300), np.int8))
        with pytest.raises(ValueError, match="mask is not supported"):
            dev.hccs(np.zeros((2, 8), np.int8), mask=np.ones((2, 8), bool))
        with pytest.raises(ValueError, match="unknown head parameter 'gama'"):
            dev.configure({"gama": 3})
        with pytest.raises(ValueError, match="SomaConfig.ring = 32: this device has 64"):
            dev.configure(config(ring=32))


def test_urls_are_checked():
    with pytest.raises(ValueError, match="unknown scheme 'usb'"):
        somatile.host.open("usb://x")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['speed'\]"):
        somatile.host.open("emu://?speed=3")
    with pytest.raises(ConnectionError, match="tcp://127.0.0.1:1: cannot connect"):
        somatile.host.open("tcp://127.0.0.1:1")
    with pytest.raises(ConnectionError, match="serial:///dev/nonexistent-port: cannot open"):
        somatile.host.open("serial:///dev/nonexistent-port")


def test_a_silent_device_raises_a_timeout_not_a_hang():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with pytest.raises(DeviceTimeout, match="HELLO"):
            somatile.host.open(f"tcp://127.0.0.1:{port}?timeout=0.2&retries=1")


def test_device_base_class_is_what_every_backend_implements():
    from somatile.host.device import Device

    assert issubclass(TileDevice, Device)
    assert not getattr(Device, "__abstractmethods__", set()) - {"info", "configure", "hccs", "decode",
                                                                  "read_state", "load_state", "reset"}


def test_configure_refuses_another_profile(tmp_path):
    """A tile built for the paper profile refuses wide-profile parameters (a SomaConfig or a calibrated YAML)
    before anything is sent, and the device keeps working."""
    from somatile.model.calibrate import calibrate_wide_params
    dev = somatile.host.open("emu://?board=sim")
    with pytest.raises(ValueError, match=r"configure: the parameters are for integer profile 'wide'; this device "
                                         r"\(sim\) was built for profile 'paper'"):
        dev.configure(config(profile="wide", normaliser="pwl2_int"))
    rng = np.random.default_rng(0)
    wide_params = calibrate_wide_params(rng.normal(0, 2, (HEADS, 40, RING + SINKS)), normaliser="pwl2")
    wide_params.to_yaml(tmp_path / "wide.yaml")
    with pytest.raises(ValueError, match="integer profile 'wide'"):
        dev.configure(tmp_path / "wide.yaml")
    dev.configure(config())
    q, k, v = tokens(rng, 3)
    assert np.array_equal(dev.decode(q, k, v), soma.prefill(config(), q, k, v)[0])


@pytest.mark.parametrize("normaliser", ["pwl2_int", "hccs_int", "exp_int"])
def test_a_wide_profile_tile_runs_the_wide_contract_and_refuses_the_papers(normaliser, tmp_path):
    """A board built for the wide profile (``profile: wide``): decode gives the int16 output of the wide
    integer spec, state read-back its state, the HCCS command the head's wide normaliser over int16 rows (Q15
    out); paper-profile parameters are refused."""
    from somatile.model import wide

    dev = somatile.host.open("emu://?board=sim_wide")
    assert dev.info().profile == "wide"
    with pytest.raises(ValueError, match="integer profile 'paper'; this device .sim_wide. was built for profile "
                                         "'wide'"):
        dev.configure(config())
    cfg = config(profile="wide", normaliser=normaliser, fallback=(False, True), recency_int=(300, 0))
    dev.configure(cfg)
    rng = np.random.default_rng(1)
    q, k, v = tokens(rng, RING + 7)  # past the ring's wrap-around
    out = dev.decode(q, k, v)
    want, state = soma.prefill(cfg, q, k, v)
    assert out.dtype == np.int16 and np.array_equal(out, want)
    got = dev.read_state()
    assert all(np.array_equal(got[name], value) for name, value in state.to_arrays().items())
    x = rng.integers(-32768, 32768, (5, RING + SINKS)).astype(np.int16)
    head = 0
    B, S, dmax = (getattr(cfg, f)[head] for f in ("hccs_B", "hccs_S", "hccs_dmax"))
    probs = dev.hccs(x, head=head)
    assert probs.dtype == np.uint16
    assert np.array_equal(probs, wide.wide_softmax(x, normaliser.removesuffix("_int"), B, S, dmax, impl="numpy"))
    with pytest.raises(ValueError, match="tensor x: values outside int16 range"):
        dev.hccs(np.full((1, 4), 40000), head=head)


def test_the_c_firmware_serves_a_wide_profile_tile_byte_for_byte_like_emu():
    """The C firmware (host build, over TCP) in front of golden tile models of the wide-profile board answers
    decode, HCCS and state read-back exactly like emu:// of the same board."""
    from somatile.host.emu import board_params, start_tile_server
    from somatile.host.transport_firmware import FirmwareProcess

    params, _ = board_params("sim_wide")
    cfg = config(profile="wide", normaliser="pwl2_int", fallback=(True, False))
    rng = np.random.default_rng(2)
    q, k, v = tokens(rng, 12)
    x = rng.integers(-32768, 32768, (3, 50)).astype(np.int16)
    answers = []
    with FirmwareProcess(start_tile_server(params), board="sim_wide", link="tcp") as fw:
        for url in ("emu://?board=sim_wide", fw.url):
            with somatile.host.open(url) as dev:
                assert dev.info().profile == "wide" and dev.info().board == "sim_wide"
                dev.configure(cfg)
                answers.append((dev.decode(q, k, v), dev.read_state(), dev.hccs(x, head=1)))
    (out_a, state_a, p_a), (out_b, state_b, p_b) = answers
    assert out_a.dtype == out_b.dtype == np.int16 and np.array_equal(out_a, out_b)
    assert state_a.keys() == state_b.keys() and all(np.array_equal(state_a[n], state_b[n]) for n in state_a)
    assert p_a.dtype == p_b.dtype == np.uint16 and np.array_equal(p_a, p_b)


def test_configure_refuses_parameters_whose_fallback_heads_run_the_ai_engines_exp():
    """A params file calibrated for the AI Engine (fallback heads on aie4ml's exp) predicts other bits than the
    tile's integer exp would give: refused before anything is sent."""
    params = HccsParams(B=np.array([452, 400]), S=np.array([14, 9]), dmax=np.array([32, 40]),
                        fallback=np.array([False, True]), scale=np.array([0.1, 0.1]), cols=RING + SINKS,
                        fallback_exp="aie4ml")
    with somatile.host.open("emu://") as dev:
        with pytest.raises(ValueError, match=r"key 'fallback_exp': 'aie4ml' for fallback heads \[1\]"):
            dev.configure(params)
        dev.configure(dataclasses.replace(params, fallback_exp="somatile"))  # the tile's own exp: accepted


def test_a_wide_tile_takes_calibrated_wide_parameters_from_their_yaml(tmp_path):
    """`somatile calibrate --profile wide` output (HccsParams, pwl2, fallback heads on the exp) configures a
    wide tile: its HCCS command then gives the wide spec of each head's normaliser and parameters."""
    from somatile.model import wide
    from somatile.model.calibrate import calibrate_wide_params

    rng = np.random.default_rng(3)
    cols = RING + SINKS
    params = calibrate_wide_params(rng.normal(0, 2, (HEADS, 40, cols)), normaliser="pwl2")
    params.to_yaml(tmp_path / "wide.yaml")
    x = rng.integers(-3000, 3000, (6, cols)).astype(np.int16)
    with somatile.host.open("emu://?board=sim_wide") as dev:
        dev.configure(str(tmp_path / "wide.yaml"))
        for head in range(HEADS):
            name = "exp" if params.fallback[head] else "pwl2"
            want = wide.wide_softmax(x, name, int(params.B[head]), int(params.S[head]), int(params.dmax[head]),
                                     impl="numpy")
            assert np.array_equal(dev.hccs(x, head=head), want), head
