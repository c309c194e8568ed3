"""metal:// as a device: the same tensors through metal://?emulate=1 (both dispatch paths) and emu:// give
bit-identical answers, state and errors (the Metal tile runs the tile model's commands with its compute on
the kernels)."""

import numpy as np
import pytest

import somatile.host
from somatile.host.device import DeviceError
from somatile.model import soma


@pytest.fixture(params=["mlx", "pyobjc"])
def devices(request):
    metal = somatile.host.open(f"metal://?emulate=1&api={request.param}&order=random&seed=3")
    emu = somatile.host.open("emu://")
    yield metal, emu
    metal.close()
    emu.close()


def soma_config(info, **extra):
    return soma.SomaConfig.preset("gated_field", integer=True, profile="paper", n_heads=info.heads, head_dim=info.head_dim,
                                  ring=info.ring, sinks=info.sinks, **extra)


def test_decode_state_and_hccs_are_identical_to_emu(devices, rng):
    metal, emu = devices
    info = emu.info()
    assert (metal.info().heads, metal.info().head_dim, metal.info().ring) == (info.heads, info.head_dim, info.ring)
    T = info.ring + info.sinks + 6  # past the sinks and once round the ring
    q, k, v = (rng.integers(-128, 128, (T, info.heads, info.head_dim)).astype(np.int8) for _ in range(3))
    for device in devices:
        device.configure(soma_config(info))
    assert np.array_equal(metal.decode(q, k, v), emu.decode(q, k, v))
    state = metal.read_state()
    assert all(np.array_equal(state[name], value) for name, value in emu.read_state().items())

    for device in devices:
        device.configure({"hccs_B": 300, "hccs_S": [2, 3], "hccs_dmax": 50, "hccs_mode": "clb"})
    x = rng.integers(-128, 128, (9, 45)).astype(np.int8)
    assert np.array_equal(metal.hccs(x, head=1), emu.hccs(x, head=1))


def test_load_state_reset_and_errors_match_emu(devices, rng):
    metal, emu = devices
    info = emu.info()
    shape = (3, info.heads, info.head_dim)
    with pytest.raises(DeviceError, match="NOT_CONFIGURED"):
        metal.decode(*(np.zeros(shape, np.int8) for _ in range(3)))
    for device in devices:
        device.configure(soma_config(info, normaliser="exp_int"))
    q, k, v = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(3))
    emu.decode(q, k, v)
    metal.load_state(emu.read_state())
    q, k, v = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(3))
    assert np.array_equal(metal.decode(q, k, v), emu.decode(q, k, v))
    for device in devices:
        device.reset()
    assert np.array_equal(metal.decode(q, k, v), emu.decode(q, k, v))
    with pytest.raises(DeviceError, match="BAD_ARGUMENT"):
        metal.hccs(np.zeros((2, 200), np.int8), head=0)  # B is too large for rows of 200


def test_device_agree_with_tile_overrides():
    """`somatile device agree` over emu:// and metal:// with the demo's small tile (overrides as for emu://)."""
    from somatile.host import device_cli

    urls = [f"emu://?{device_cli.DEMO_QUERY}", f"metal://?emulate=1&api=pyobjc&{device_cli.DEMO_QUERY}"]
    result = device_cli.agree(urls, tokens=24, seed=5)
    assert result["agree"], result["mismatches"]


@pytest.mark.parametrize("api", ["mlx", "pyobjc"])
def test_the_wide_profile_on_metal_is_identical_to_emu(api):
    """metal://?emulate=1 and emu:// of the wide-profile board: the same int16 decode output, state and Q15
    HCCS rows (pwl2, the exp-free normaliser), equal to the numpy spec (`somatile device agree`)."""
    from somatile.host import device_cli

    query = device_cli.DEMO_QUERY.replace("board=sim&", "board=sim_wide&")
    result = device_cli.agree([f"emu://?{query}", f"metal://?emulate=1&api={api}&order=random&seed=4&{query}"],
                              tokens=20, seed=6)
    assert result["agree"], result["mismatches"]
    assert {run["info"].profile for run in result["runs"]} == {"wide"}
    assert all(run["decode"].dtype == np.int16 and run["hccs"].dtype == np.uint16 for run in result["runs"])
