"""The C++ stream harness (sim/stream.py, sim/stream_tb.cpp) on the HCCS unit and the tile: bounded runs
bit-exact with the model and cycle-exact with the formulas, and the comparisons of sim/regress.py able to fail
(a corrupted expected value is reported with its row or token)."""

import dataclasses

import numpy as np
import pytest

from somatile.hw import regmap
from somatile.hw.hccs import HCCSConfig, expected_cycles, in_beat_layout
from somatile.hw.tile import expected_decode_cycles
from somatile.sim import regress, run_hccs, run_soma, stream
from tests.hw.test_hccs import per_head_params
from tests.hw.test_tile import SMALL as SMALL_TILE

UNIT = {"lanes": 4, "heads": 4, "n_max": 16, "out_type": "int16"}
MODE_OUT = [("div", "uint8"), ("div", "int16"), ("clb", "uint8"), ("clb", "int16")]


@pytest.fixture(scope="module")
def hccs_sim():
    return run_hccs.harness_build(UNIT)


@pytest.fixture(scope="module")
def tile_sim():
    return run_soma.harness_build(SMALL_TILE)


def hccs_rows(rng, rows, cols):
    x, mask = run_hccs.regression_rows(rng, rows, cols)
    return x, mask, rng.integers(0, UNIT["heads"], rows), *per_head_params(rng, UNIT["heads"], cols)


def test_payload_pack_round_trips_signed_arrays_and_bit_masks(rng):
    fields = stream.payload_fields(in_beat_layout(HCCSConfig(**UNIT)))
    values = {"data": rng.integers(-128, 128, (50, 4)), "mask": rng.random((50, 4)) < 0.5,
              "first": rng.integers(0, 2, 50), "last": rng.integers(0, 2, 50), "head": rng.integers(0, 4, 50)}
    raw = stream.pack(fields, values)
    assert raw.shape == (50, fields.nbytes)
    back = stream.unpack(fields, raw)
    assert np.array_equal(back["data"], values["data"])
    assert np.array_equal(back["mask"], stream.bits_value(values["mask"]))
    for name in ("first", "last", "head"):
        assert np.array_equal(back[name], values[name])


@pytest.mark.parametrize("cols", [16, 13, 1])
def test_hccs_rows_are_bit_exact_and_cycle_exact(hccs_sim, rng, cols):
    x, mask, heads, B, S, dmax = hccs_rows(rng, 3000, cols)
    run = run_hccs.simulate_harness(hccs_sim, x, heads, B, S, dmax, modes=["div"] * 4, outs=["int16"] * 4, mask=mask,
                                unit=UNIT)
    assert run.ok, (run.mismatches[:3], run.framing_errors[:3])
    assert np.array_equal(run.out, run.expected)
    assert run.status == {"overflow": 0, "framing": 0, "bad_head": 0}
    assert run.cycles == expected_cycles(HCCSConfig(**UNIT), len(x), cols, mode="div", out="int16")


def test_hccs_rows_are_bit_exact_under_idles_and_backpressure(hccs_sim, rng):
    x, mask, heads, B, S, dmax = hccs_rows(rng, 3000, 16)
    modes, outs = zip(*MODE_OUT)
    run = run_hccs.simulate_harness(hccs_sim, x, heads, B, S, dmax, modes=modes, outs=outs, mask=mask, unit=UNIT,
                                idle=0.3, backpressure=0.4, seed=5)
    assert run.ok, (run.mismatches[:3], run.framing_errors[:3])
    # Stalls only add cycles: more than the fastest head's mode would take at full rate.
    assert run.cycles > min(expected_cycles(HCCSConfig(**UNIT), len(x), 16, mode=m, out=o) for m, o in MODE_OUT)


def test_hccs_comparison_reports_a_corrupted_expected_value_with_its_row(hccs_sim, rng):
    x, mask, heads, B, S, dmax = hccs_rows(rng, 2000, 16)
    options = dict(modes=["div"] * 4, outs=["int16"] * 4, mask=mask, unit=UNIT)
    expected = run_hccs.simulate_harness(hccs_sim, x, heads, B, S, dmax, **options).expected.copy()
    row = 1234
    column = int(np.flatnonzero(mask[row])[0])
    expected[row, column] += 1
    run = run_hccs.simulate_harness(hccs_sim, x, heads, B, S, dmax, expected=expected, **options)
    assert not run.ok
    assert len(run.mismatches) == 1
    assert run.mismatches[0].startswith(f"row {row} (head {heads[row]}): 1 element(s) differ: [{column}]")


def decode_job(tile_sim, tokens, traffic=(0.0, 0.0), reference="spec"):
    return {"params": dataclasses.asdict(SMALL_TILE), "tokens": tokens, "seed": [3, 1], "measure_every": 10,
            "reference": reference, "build": tile_sim, "idle": traffic[0], "backpressure": traffic[1]}


def exact_decode_run(params, job) -> tuple[int, int, int]:
    """Run a full-rate decode job on ``params``: bit-exact, cycle-exact, no timeout, error output low. Returns
    its port cycles and the formula's per frame on its own and behind another DECODE frame."""
    result = run_soma.decode_job(dict(job, params=dataclasses.asdict(params)))
    assert result["mismatches"] == 0, result["first"]
    assert result["cycles_ok"] and not result["timeout"] and result["error"] == 0
    assert result["cycles"] == result["expected_cycles"]
    rng = np.random.default_rng(job["seed"])
    configs = [run_soma.random_config(rng, params) for _ in range(params.heads)]
    return (result["cycles"], expected_decode_cycles(params, configs) + run_soma.FRAME_SLICE_CYCLES,
            expected_decode_cycles(params, configs, behind=True))


@pytest.mark.parametrize("reference", ["spec", "emu"])
def test_decode_tokens_are_bit_exact_and_cycle_exact(tile_sim, reference):
    cycles, alone, behind = exact_decode_run(SMALL_TILE, decode_job(tile_sim, 40, reference=reference))
    # A CYCLES_LAST read after every 10th token: tokens 0, 10, 20 and 30 on their own (behind a CONFIGURE_HEAD
    # or a REG_READ), the other 36 behind a DECODE frame, taken in while it computed (SMALL_TILE has the room).
    assert regmap.ahead_bytes(SMALL_TILE) > 0 and behind < alone
    assert cycles == 4 * alone + 36 * behind


def test_a_tile_without_room_for_a_second_qkv_area_is_cycle_exact_back_to_back():
    """SMALL_TILE with a longer ring in 2 KiB: the heads' state and the staging area fit, a second q, k, v area
    does not, so a DECODE frame behind another takes its payload only once that one's heads are done (the
    other branch of the tile's check and of ``decode_frame_phases``)."""
    params = dataclasses.replace(SMALL_TILE, ring=9, local_memory_bytes=2048)
    assert regmap.ahead_bytes(params) == 0
    cycles, alone, behind = exact_decode_run(params, decode_job(run_soma.harness_build(params), 12))
    assert cycles == 2 * alone + 10 * behind   # tokens 0 and 10 on their own


def test_decode_tokens_are_bit_exact_under_idles_and_backpressure(tile_sim):
    result = run_soma.decode_job(decode_job(tile_sim, 30, regress.RANDOM_TRAFFIC))
    assert result["mismatches"] == 0, result["first"]
    assert result["cycles_ok"] and result["cycles"] > result["expected_cycles"]


def test_a_long_sequence_of_every_head_option_is_bit_exact_and_cycle_exact(tile_sim):
    """1,000 tokens of the four heads of tests/hw/test_soma.py (every normaliser, HCCS mode, write order, field
    source and gating), the ring wrapped over 80 times: every response equals the spec's and every measured
    CYCLES_LAST equals ``expected_decode_cycles`` (answered by the formula in the stimulus)."""
    from tests.hw.test_soma import configs_for

    params, tokens = SMALL_TILE, 1000
    rng = np.random.default_rng(tokens)
    configs = configs_for(params, rng)
    assert [c.normaliser for c in configs] == ["hccs_int", "exp_int", "hccs_int", "exp_int"]
    q, k, v = run_soma.sequence(rng, tokens, params.heads, params.head_dim)
    stimulus = run_soma.decode_stimulus(params, configs, q, k, v, measure_every=128)
    beats, _ = run_soma.frame_beats(tile_sim, stimulus.frames, params.stream_bytes)
    expected_beats = sum(len(r) for r in stimulus.responses) // params.stream_bytes
    got = tile_sim.fields(tile_sim.output, stream.run(tile_sim, beats, expected_beats).out)
    assert tokens > 10 * params.slots
    assert run_soma.compare_responses(stimulus, got["m_axis_tdata"], got["m_axis_tlast"][:, 0], exact_cycles=True,
                                      beat_bytes=params.stream_bytes) == (0, [], True)
    outputs = b"".join(stimulus.responses[f][regmap.HEADER_BYTES:] for f in stimulus.decode_frames)
    assert len(np.unique(np.frombuffer(outputs, np.int8))) > 20     # not trivially constant


def test_the_spec_answers_are_the_golden_tile_model_s(rng):
    configs = [run_soma.random_config(rng, SMALL_TILE) for _ in range(SMALL_TILE.heads)]
    q, k, v = run_soma.sequence(rng, 25, SMALL_TILE.heads, SMALL_TILE.head_dim)
    spec, emu = (run_soma.decode_stimulus(SMALL_TILE, configs, q, k, v, measure_every=7, reference=reference)
                 for reference in ("spec", "emu"))
    assert spec.frames == emu.frames
    assert spec.responses == emu.responses


def test_decode_comparison_reports_a_corrupted_response_with_its_token(tile_sim, rng):
    params = SMALL_TILE
    configs = [run_soma.random_config(rng, params) for _ in range(params.heads)]
    q, k, v = run_soma.sequence(rng, 20, params.heads, params.head_dim)
    stimulus = run_soma.decode_stimulus(params, configs, q, k, v, measure_every=5)
    beats, _ = run_soma.frame_beats(tile_sim, stimulus.frames, params.stream_bytes)
    expected_beats = sum(len(r) for r in stimulus.responses) // params.stream_bytes
    got = tile_sim.fields(tile_sim.output, stream.run(tile_sim, beats, expected_beats).out)
    args = (got["m_axis_tdata"], got["m_axis_tlast"][:, 0])
    assert run_soma.compare_responses(stimulus, *args, exact_cycles=True, beat_bytes=params.stream_bytes) == \
        (0, [], True)
    token = 13
    frame = int(stimulus.decode_frames[token])
    response = bytearray(stimulus.responses[frame])
    response[16 + 5] ^= 1
    corrupted = dataclasses.replace(stimulus, responses=stimulus.responses[:frame] + [bytes(response)]
                                    + stimulus.responses[frame + 1:])
    count, lines, cycles_ok = run_soma.compare_responses(corrupted, *args, exact_cycles=True,
                                                        beat_bytes=params.stream_bytes)
    assert (count, cycles_ok) == (1, True)
    assert lines[0].startswith(f"token {token} (frame {frame}, opcode ")
    assert "first at byte 21 (payload byte 5)" in lines[0]
