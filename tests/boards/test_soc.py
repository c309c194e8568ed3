"""The SoC (hw/soc.py): PicoRV32 running the cross-built firmware, UART, tile array, all in Verilator with the
UART bridged to a pty; the unchanged serial driver talks to it (sim://?top=soc).

The tile is the small one of DEMO_QUERY (tests/host/test_device_sim.py uses the same), so the model builds
in about a minute and streams in seconds. Every result is compared with emu:// (the golden tile model
behind the Python reference firmware) exactly.
"""

import numpy as np
import pytest

import somatile.host
from somatile import boards
from somatile.boards.config import BoardError
from somatile.boards.soc import build_firmware, soc_section, uart_divider
from somatile.host import protocol
from somatile.host.device import DeviceError
from somatile.host.device_cli import DEMO_QUERY, stream_device, stream_through
from somatile.host.transport_serial import SerialTransport
from somatile.host.tile_driver import open_transport
from somatile.hw import regmap
from somatile.model import soma
from tests.damaging import Damaging

SOC_URL = f"sim://?{DEMO_QUERY}&top=soc"


@pytest.fixture(scope="module")
def dev():
    with somatile.host.open(SOC_URL) as device:
        yield device


def config(info):
    return soma.SomaConfig(n_heads=info.heads, head_dim=info.head_dim, ring=info.ring, sinks=info.sinks,
                           integer=True, normaliser="hccs_int", alpha=0.1, alpha_mult=5, alpha_shift=3)


def test_the_soc_answers_decode_hccs_and_state_bit_for_bit_like_emu(dev, rng):
    emu = stream_through(f"emu://?{DEMO_QUERY}", tokens=24, seed=5)  # ring 8 + 2 sinks: wraps twice
    soc = stream_device(dev, tokens=24, seed=5)
    assert soc["info"].board == "sim" and soc["info"].max_payload == boards.load("sim").soc["max_payload"]
    assert np.array_equal(emu["decode"], soc["decode"]) and np.array_equal(emu["hccs"], soc["hccs"])
    assert all(np.array_equal(emu["state"][n], soc["state"][n]) for n in emu["state"])
    state = dict(soc["state"])
    ring_k = rng.integers(-128, 128, state["ring_k"].shape).astype(np.int8)
    dev.load_state({**state, "ring_k": ring_k, "write_pos": np.int32(3), "step": np.int32(70000)})
    back = dev.read_state()
    assert np.array_equal(back["ring_k"], ring_k) and int(back["step"]) == 70000 and int(back["write_pos"]) == 3


def test_the_host_driver_recovers_from_damaged_frames_and_line_noise_on_the_simulated_uart(dev, rng):
    info = dev.info()
    cfg = config(info)
    q, k, v = (rng.integers(-128, 128, (5, info.heads, info.head_dim)).astype(np.int8) for _ in range(3))
    transport = Damaging(SerialTransport(dev.simulation.pty))
    with open_transport(transport, "soc-damaged", timeout=4.0) as damaged:
        damaged.configure(cfg)
        damaged.reset()
        base = transport.writes
        transport.plan = {base + 1: "corrupt", base + 3: "truncate", base + 5: "noise", base + 6: "split",
                          base + 7: "corrupt"}
        out = damaged.decode(q, k, v)
        assert damaged.link.retried >= 3
    assert np.array_equal(out, soma.prefill(cfg, q, k, v)[0])


def test_a_stalled_tile_is_a_timeout_error_and_its_late_answer_is_not_taken_for_the_next(dev, rng):
    info = dev.info()
    cfg = config(info)
    q, k, v = (rng.integers(-128, 128, (3, info.heads, info.head_dim)).astype(np.int8) for _ in range(3))
    # A new host link (HELLO resynchronises the sequence after the other tests' links).
    with open_transport(SerialTransport(dev.simulation.pty), "soc-stalled", timeout=20.0) as host:
        host.configure(cfg)
        host.reset()
        dev.simulation.hold(True)
        dev.simulation.cycles()  # the bench reads its commands in order: the hold is on once this answers
        with pytest.raises(DeviceError, match="TILE_TIMEOUT"):
            host.decode(q[:1], k[:1], v[:1])
        dev.simulation.hold(False)
        # The stalled token's answer arrives late and is dropped; its state update happened, so the outputs
        # are those of the whole sequence, the first of which was never returned.
        out = host.decode(q[1:], k[1:], v[1:])
    assert np.array_equal(out, soma.prefill(cfg, q, k, v)[0][1:])


def test_a_reset_mid_frame_loses_the_frame_and_the_state_and_a_new_hello_works(dev, rng):
    info = dev.info()
    cfg = config(info)
    # Past the sinks, so that the ring holds keys whatever the tests before left in the state.
    tokens = info.sinks + 2
    q, k, v = (rng.integers(-128, 128, (tokens, info.heads, info.head_dim)).astype(np.int8) for _ in range(3))
    transport = SerialTransport(dev.simulation.pty)
    with open_transport(transport, "soc-before-reset", timeout=4.0) as host:
        host.configure(cfg)
        host.decode(q, k, v)
        assert np.any(host.read_state()["ring_k"])
        # Half a frame, then the board's reset button; the rest of the frame never comes.
        transport.write(protocol.encode_frame(regmap.API_LEVEL, protocol.Opcode.TILE, 1, bytes(64))[:30])
        dev.simulation.reset()
    with open_transport(SerialTransport(dev.simulation.pty), "soc-after-reset", timeout=4.0) as host:
        assert not np.any(host.read_state()["ring_k"])  # the tiles came out of reset cleared
        host.configure(cfg)
        assert np.array_equal(host.decode(q, k, v), soma.prefill(cfg, q, k, v)[0])


def test_soc_build_errors_name_the_board_key(tmp_path):
    cfg = boards.load("sim")
    with pytest.raises(BoardError, match=r"soc\.data_kib.*max_payload"):
        build_firmware(cfg.with_soc({"data_kib": 16}), 100e6, tmp_path / "small")
    with pytest.raises(BoardError, match=r"soc\.baud"):
        uart_divider(cfg.with_soc({"baud": 40_000_000}), 100e6)
    with pytest.raises(BoardError, match=r"key 'soc\.cpu_mhz': got -1, expected 0 or a positive clock in MHz"):
        cfg.with_soc({"cpu_mhz": -1})
    with pytest.raises(BoardError, match=r"key 'soc\.cpu_mhz': got 12, expected 0 or clock_mhz = 24 on iCE40UP5K"):
        soc_section(boards.load("icebreaker").with_soc({"cpu_mhz": 12}))
    board = tmp_path / "other_cpu.yaml"
    board.write_text("extends: sim\nsoc:\n  cpu: vexriscv\n")
    with pytest.raises(BoardError, match=r"other_cpu.yaml: key 'soc.cpu': got 'vexriscv', expected one of picorv32"):
        boards.load(str(board))
    versal = tmp_path / "versal_soc.yaml"
    versal.write_text("extends: vck190\nsoc:\n  cpu: picorv32\n")
    with pytest.raises(BoardError, match=r"key 'soc': only boards of kind sim or fpga"):
        boards.load(str(versal))
