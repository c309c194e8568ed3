"""Longer randomised sweeps of the integer Metal kernels against the model (marked slow: `make test-all`).

Each case draws its shapes, parameters, masks, thread order and marker byte from a seeded generator, so a
failure names a reproducible case."""

import numpy as np
import pytest

from somatile.host import metal_backend
from somatile.model import hccs, intexp, soma

pytestmark = pytest.mark.slow
ORDERS = ("forward", "reverse", "random")


def emulated(rng, api):
    return metal_backend.make_runner(api, emulate=True, order=ORDERS[rng.integers(3)], seed=int(rng.integers(1 << 30)),
                                     marker=int(rng.integers(256)))


def random_hccs_params(rng, heads, cols):
    params = []
    while len(params) < heads:
        b = int(rng.integers(1, hccs.MAX_ROW_MASS // cols + 1))
        s, d = int(rng.integers(0, 128)), int(rng.integers(0, 128))
        if b - s * d >= 0 and cols * (b - s * d) >= hccs.MIN_FLOOR_MASS:
            params.append((b, s, d))
    return [list(p) for p in zip(*params)]


@pytest.mark.parametrize("case", range(200))
def test_normaliser_sweep(case):
    rng = np.random.default_rng(1000 + case)
    heads, rows, cols = int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 700))
    x = rng.integers(-128, 128, (heads, rows, cols)).astype(np.int8)
    if rng.random() < 0.3:  # narrow ranges make ties and clipped rows likely
        x = (x // 64).astype(np.int8)
    mask = rng.random(x.shape) < rng.random() if rng.random() < 0.5 else None
    runner = emulated(rng, ("mlx", "pyobjc")[case % 2])
    out = ("uint8", "int16")[int(rng.integers(2))]
    B, S, D = random_hccs_params(rng, heads, cols)
    mode = ("div", "clb")[int(rng.integers(2))]
    assert np.array_equal(metal_backend.hccs(runner, x, B, S, D, mode=mode, out=out, mask=mask),
                          hccs.hccs_int(x, B, S, D, mode=mode, out=out, mask=mask))
    mult = rng.integers(1, 65536, heads)
    assert np.array_equal(metal_backend.intexp(runner, x, mult, out=out, mask=mask),
                          intexp.intexp_softmax(x, mult, out=out, mask=mask))


@pytest.mark.parametrize("case", range(100))
def test_soma_sweep(case):
    rng = np.random.default_rng(2000 + case)
    kv = int(rng.integers(1, 3))
    ring = int(rng.integers(1, 40))
    gated = rng.random() < 0.4
    cfg = soma.SomaConfig.preset(
        "gated_field" if gated else "default", integer=True, profile="paper", n_heads=kv * int(rng.integers(1, 4)), n_kv_heads=kv,
        head_dim=int(rng.integers(1, 48)), ring=ring, sinks=int(rng.integers(0, ring + 1)),
        include_self=bool(rng.random() < 0.5), alpha=float(rng.random()),
        field_source="values" if gated or rng.random() < 0.5 else "keys",
        normaliser=("hccs_int", "exp_int")[int(rng.integers(2))],
        hccs_mode=("div", "clb")[int(rng.integers(2))], recency=float(rng.random() * 0.2))
    T = int(rng.integers(1, 2 * (cfg.slots + 2)))
    q = rng.integers(-128, 128, (T, cfg.n_heads, cfg.head_dim)).astype(np.int8)
    k, v = (rng.integers(-128, 128, (T, cfg.n_kv_heads, cfg.head_dim)).astype(np.int8) for _ in range(2))
    expected, expected_state = soma.prefill(cfg, q, k, v)
    got, state = metal_backend.soma_prefill(emulated(rng, ("mlx", "pyobjc")[case % 2]), cfg, q, k, v)
    assert np.array_equal(got, expected)
    for (name, a), b in zip(state.to_arrays().items(), expected_state.to_arrays().values()):
        assert np.array_equal(a, b), name
