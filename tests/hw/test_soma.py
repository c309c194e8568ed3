"""The Soma decode unit in the tile RTL (Verilator through cocotb): long token sequences bit-exact against
the integer model (sim/tb_soma.py checks every output element against ``soma.prefill``), and O(1) decode:
cycles per token at sequence position 128 and at 65,536 (state loaded through LOAD_STATE) identical and equal
to ``expected_decode_cycles``."""

import numpy as np
import pytest

from somatile.hw import tile_model
from somatile.hw.tile import expected_decode_cycles
from somatile.model import soma
from somatile.sim import run_soma
from tests.hw.test_tile import SMALL, WIDE


# Per head: normaliser, HCCS mode, write order, field source, gating; together every option of the model.
HEAD_OPTIONS = [
    dict(normaliser="hccs_int", hccs_mode="div", include_self=True, gating="query"),
    dict(normaliser="exp_int", include_self=False, gating="none", field_source="keys"),
    dict(normaliser="hccs_int", hccs_mode="clb", include_self=False, gating="none", field_source="values"),
    dict(normaliser="exp_int", include_self=True, gating="query"),
]


def configs_for(params, rng):
    out = []
    for h in range(params.heads):
        options = dict(HEAD_OPTIONS[h % len(HEAD_OPTIONS)])
        mode = options.pop("hccs_mode", "div")
        out.append(run_soma.random_config(rng, params, **options).replace(hccs_mode=mode))
    return out


@pytest.mark.parametrize("params, tokens", [(SMALL, 1000), pytest.param(WIDE, 400, marks=pytest.mark.slow)],
                         ids=["small", "wide"])
def test_long_sequences_are_bit_exact(params, tokens, rng):
    configs = configs_for(params, rng)
    q, k, v = run_soma.sequence(rng, tokens, params.heads, params.head_dim)
    result = run_soma.run_decode(params, q, k, v, [tile_model.head_values(c) for c in configs], measure=[128],
                                 seed=tokens)
    assert int(result.outputs["mismatches"]) == 0
    assert result.outputs["out"].shape == q.shape
    # The ring wrapped many times and the outputs are not trivially constant.
    assert tokens > 10 * (params.ring + params.sinks)
    assert len(np.unique(result.outputs["out"])) > 20
    assert list(result.outputs["cycles"]) == [expected_decode_cycles(params, configs)]


def far_state(params, cfg, rng, position):
    """A full state at sequence ``position``: ring and sinks filled, random contents, a random field."""
    state = soma.SomaState.empty(cfg)
    q, k, v = run_soma.sequence(rng, params.slots + 7, 1, params.head_dim)
    soma.prefill(cfg, q, k, v, state=state)
    arrays = state.to_arrays()
    arrays["step"] = np.int32(position)
    arrays["write_pos"] = np.int32(int(rng.integers(params.ring)))
    return bytes(tile_model.arrays_to_state(params, arrays))


def test_cycles_per_token_at_position_65536_equal_those_at_128(rng):
    """Position 128 is measured in test_long_sequences_are_bit_exact; both equal the same formula."""
    params = SMALL
    configs = configs_for(params, rng)
    values = [tile_model.head_values(c) for c in configs]
    q, k, v = run_soma.sequence(rng, 20, params.heads, params.head_dim)
    states = np.stack([np.frombuffer(far_state(params, c, rng, 65536), np.uint8) for c in configs])
    far = run_soma.run_decode(params, q, k, v, values, states, measure=[0, 10], seed=4)
    expected = expected_decode_cycles(params, configs)
    assert list(far.outputs["cycles"]) == [expected, expected]
    assert int(far.outputs["mismatches"]) == 0
