"""HCCS unit (hw/hccs.py) in Verilator through cocotb, bit-exact against hccs_int, cycles against
expected_cycles. Two builds in the default run (a small 4-lane unit whose 16 heads cycle through the four
mode/output pairs, and the boards' default 8-lane unit); wider lane counts under the slow marker."""

import dataclasses
import re
import shutil
import sys

import numpy as np
import pytest

from somatile.hw.hccs import (HCCS, HCCSConfig, expected_cycles, ingest_pipeline, reciprocal_cycles,
                              sum_pipeline)
from somatile.model import calibrate, quant, synth
from somatile.model.hccs import DMAX_MAX, MAX_ROW_MASS, MIN_FLOOR_MASS, S_MAX, hccs_int
from somatile.sim import runner
from somatile.sim.run_hccs import simulate
from somatile.sim.tb_hccs import make_job

MODE_OUT = [("div", "uint8"), ("div", "int16"), ("clb", "uint8"), ("clb", "int16")]
SMALL = {"lanes": 4, "heads": 16, "n_max": 16, "out_type": "int16"}
BOARD = {"lanes": 8, "heads": 2, "n_max": 256, "out_type": "uint8"}
CYCLE_TOLERANCE = 0.05


def legal_params(rng, cols: int, zero_floor: bool = False) -> tuple[int, int, int]:
    """(B, S, dmax) drawn over the whole range the model's rules allow for rows of ``cols`` elements."""
    floor_min = 0 if zero_floor else -(-MIN_FLOOR_MASS // cols)
    B = int(rng.integers(max(floor_min, 1), MAX_ROW_MASS // cols + 1))
    dmax = int(rng.integers(0, DMAX_MAX + 1))
    s_limit = S_MAX if dmax == 0 else min(S_MAX, (B - floor_min) // dmax)
    return B, int(rng.integers(0, s_limit + 1)), dmax


def per_head_params(rng, heads: int, cols: int):
    B, S, dmax = zip(*(legal_params(rng, cols) for _ in range(heads)))
    return list(B), list(S), list(dmax)


def assert_bit_exact(run):
    assert not run.framing_errors, run.framing_errors[:5]
    assert not run.mismatches, f"{len(run.mismatches)} rows differ: {run.mismatches[:5]}"
    assert np.array_equal(run.out, run.expected)


@pytest.mark.parametrize("cols,rows", [(16, 4000), (13, 6000), (1, 4000)])
def test_random_rows_are_bit_exact_under_idles_and_backpressure(rng, cols, rows):
    x = rng.integers(-128, 128, (rows, cols)).astype(np.int8)
    mask = rng.random((rows, cols)) < 0.75
    mask[::37] = False
    heads = rng.integers(0, SMALL["heads"], rows)
    B, S, dmax = per_head_params(rng, SMALL["heads"], cols)
    modes, outs = zip(*(MODE_OUT * 4))
    run = simulate(x, heads, B, S, dmax, modes=modes, outs=outs, mask=mask, unit=SMALL, idle=0.3,
                   backpressure=0.4, seed=cols)
    assert_bit_exact(run)
    assert run.status == {"overflow": 0, "framing": 0, "bad_head": 0}


def adversarial_rows(cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows that stress max, clipping and saturation, each once unmasked and once with masks."""
    ramp = np.arange(cols) * (255 // max(cols - 1, 1)) - 128
    rows = np.array([
        np.zeros(cols), np.full(cols, 127), np.full(cols, -128),
        np.r_[127, np.full(cols - 1, -128)], np.r_[np.full(cols - 1, -128), 127],
        np.where(np.arange(cols) % 2, -128, 127), ramp, ramp[::-1],
        np.r_[np.full(cols - 1, 5), 6], np.r_[-127, np.full(cols - 1, -128)],
    ]).astype(np.int8)
    masks = np.ones(rows.shape, bool)
    only_one = np.zeros(rows.shape, bool)
    only_one[np.arange(len(rows)), np.arange(len(rows)) % cols] = True  # one valid element: clb saturates
    none = np.zeros(rows.shape, bool)
    return np.concatenate([rows] * 3), np.concatenate([masks, only_one, none])


@pytest.mark.parametrize("zero_floor", [False, True], ids=["paper-rules", "seed-single-c"])
def test_adversarial_rows_and_edge_parameters_are_bit_exact(rng, zero_floor):
    cols = SMALL["n_max"]
    x, mask = adversarial_rows(cols)
    if zero_floor:
        # The seed's form S = 1, B = dmax = c (no floor): reciprocals up to 23 bits.
        B, S, dmax = [1, 2, 16, 127], [1, 1, 1, 1], [1, 2, 16, 127]
    else:
        b_max, floor_min = MAX_ROW_MASS // cols, -(-MIN_FLOOR_MASS // cols)
        B, S, dmax = [b_max, b_max, floor_min, 127 * 7 + floor_min], [0, 127, 0, 127], [0, 7, 127, 7]
    # Head 4*p + k runs parameter set p under mode/output pair k: every set under every pair in one run.
    copies, mask0 = 6, mask
    x = np.tile(x, (copies * 16, 1))
    mask = np.tile(mask, (copies * 16, 1))
    heads = (np.arange(len(x)) // len(mask0)) % 16
    modes, outs = zip(*(MODE_OUT * 4))
    run = simulate(x, heads, np.repeat(B, 4), np.repeat(S, 4), np.repeat(dmax, 4), modes=modes, outs=outs,
                   mask=mask, unit=SMALL, idle=0.1, backpressure=0.5, seed=int(zero_floor),
                   allow_zero_floor=zero_floor)
    assert_bit_exact(run)


def test_real_looking_logits_back_to_back_are_bit_exact_at_the_expected_cycles():
    rows, cols = 500, BOARD["n_max"]
    logits, mask, _ = synth.synthetic_logits(heads=2, rows=rows, cols=cols, padding=True, seed=11)
    params = calibrate.calibrate_params(logits, mask, mode="div")
    x = quant.quantize_logits(logits, params.scale, mask)
    heads = np.repeat([0, 1], rows)
    run = simulate(x.reshape(-1, cols), heads, params.B, params.S, params.dmax, modes=["div", "clb"],
                   outs=["uint8", "uint8"], mask=mask.reshape(-1, cols), unit=BOARD)
    assert_bit_exact(run)
    # Heads run one after the other; both modes reach one beat per cycle on 32-beat rows.
    config = HCCSConfig(**BOARD)
    expected = expected_cycles(config, 2 * rows, cols, mode="div")
    assert abs(run.cycles - expected) <= CYCLE_TOLERANCE * expected, (run.cycles, expected)
    assert run.cycles < 1.01 * 2 * rows * cols / config.lanes


@pytest.mark.parametrize("rows,cols,mode,bound", [
    (1000, 40, "div", "the div reciprocal (13 cycles) bounds 5-beat rows"),
    (400, BOARD["lanes"], "clb", "the lap of the four banks bounds one-beat clb rows"),
])
def test_short_rows_take_exactly_the_expected_cycles(rows, cols, mode, bound):
    rng = np.random.default_rng(40)
    x = rng.integers(-128, 128, (rows, cols)).astype(np.int8)
    B, S, dmax = per_head_params(rng, 2, cols)
    run = simulate(x, np.zeros(rows, int), B, S, dmax, modes=[mode, mode], outs=["uint8", "uint8"], unit=BOARD)
    assert_bit_exact(run)
    config = HCCSConfig(**BOARD)
    assert run.cycles == expected_cycles(config, rows, cols, mode=mode), bound
    assert run.cycles > rows * max(-(-cols // config.lanes), reciprocal_cycles(config, mode, "uint8")), bound


def test_expected_cycles_closed_form_period():
    config = HCCSConfig(lanes=8, n_max=256, div_bits=2)
    for beats, mode in ((32, "div"), (5, "div"), (1, "clb"), (2, "clb")):
        d = reciprocal_cycles(config, mode)
        # A lap of the four banks: ingest, sum, reciprocal, normalise, and the registered i.ready's cycle.
        period = max(beats, d, (3 * beats + d + sum_pipeline(config) + ingest_pipeline(config) + 1) / 4)
        n = beats * config.lanes
        measured = expected_cycles(config, 2001, n, mode=mode) - expected_cycles(config, 1001, n, mode=mode)
        assert measured == pytest.approx(1000 * period, rel=0.01), (beats, mode)


@pytest.mark.parametrize("kwargs,message", [
    ({"lanes": 3}, "lanes: expected one of"), ({"n_max": 12, "lanes": 8}, "n_max: expected a positive multiple"),
    ({"out_type": "float"}, "out_type: expected one of"), ({"div_bits": 5}, "div_bits: expected"),
    ({"heads": 0}, "heads: expected an integer"),
])
def test_bad_configuration_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HCCSConfig(**kwargs)


@pytest.mark.slow
def test_sixteen_lanes_take_the_expected_cycles_with_the_two_stage_sum_tree():
    """16 lanes: the sum stage's adder tree in two register stages (sum_pipeline 7, not 6); one-beat clb rows
    are bound by the lap of the four banks, which counts every sum-pipeline cycle."""
    unit = {"lanes": 16, "heads": 2, "n_max": 64, "out_type": "uint8"}
    config = HCCSConfig(**unit)
    assert sum_pipeline(config) == sum_pipeline(HCCSConfig(**BOARD)) + 1
    rng = np.random.default_rng(41)
    for rows, cols, mode in ((400, 16, "clb"), (300, 61, "div")):
        x = rng.integers(-128, 128, (rows, cols)).astype(np.int8)
        B, S, dmax = per_head_params(rng, 2, cols)
        run = simulate(x, np.zeros(rows, int), B, S, dmax, modes=[mode, mode], outs=["uint8", "uint8"], unit=unit)
        assert_bit_exact(run)
        assert run.cycles == expected_cycles(config, rows, cols, mode=mode), (rows, cols, mode)


@pytest.mark.slow
@pytest.mark.parametrize("lanes,n_max,out_type", [(1, 8, "uint8"), (16, 128, "int16"), (32, 256, "uint8")])
def test_lane_sweep_is_bit_exact(rng, lanes, n_max, out_type):
    unit = {"lanes": lanes, "heads": 4, "n_max": n_max, "out_type": out_type}
    for cols in (n_max, n_max - 3 if n_max > 3 else 1):
        rows = 2000
        x = rng.integers(-128, 128, (rows, cols)).astype(np.int8)
        mask = rng.random((rows, cols)) < 0.8
        B, S, dmax = per_head_params(rng, 4, cols)
        outs = [o if out_type == "int16" else "uint8" for _, o in MODE_OUT]
        run = simulate(x, rng.integers(0, 4, rows), B, S, dmax, modes=[m for m, _ in MODE_OUT], outs=outs,
                       mask=mask, unit=unit, idle=0.2, backpressure=0.3, seed=lanes)
        assert_bit_exact(run)


def run_beats(unit: dict, beats: dict, expect: int, B, S, dmax, modes, outs):
    """Raw beats through the unit (the ``hccs_beats`` cocotb test): output beat arrays and the status."""
    config = HCCSConfig(**unit)
    job = make_job(np.zeros((1, 1), np.int8), [0], B, S, dmax, modes=modes, outs=outs, lanes=config.lanes,
                   head_bits=config.head_bits, out_bits=config.out_bits)
    job.update({f"beat_{k}": np.asarray(v) for k, v in beats.items()}, expect=np.int64(expect))
    return runner.build_and_test(HCCS, dataclasses.asdict(config), "hccs", "somatile.sim.tb_hccs", "hccs_beats",
                                 inputs=job).outputs


def test_over_long_rows_and_bad_framing_are_flagged_and_the_unit_keeps_working(rng):
    lanes, n_max = SMALL["lanes"], SMALL["n_max"]
    B, S, dmax = per_head_params(rng, SMALL["heads"], n_max)
    modes, outs = zip(*(MODE_OUT * 4))
    long_row = rng.integers(-128, 128, n_max + 2 * lanes).astype(np.int8)   # two beats past the capacity
    plain_row = rng.integers(-128, 128, n_max).astype(np.int8)
    per_row = n_max // lanes
    data = np.concatenate([long_row, plain_row, plain_row]).reshape(-1, lanes)
    starts = np.cumsum([0, per_row + 2, per_row])
    first = np.isin(np.arange(len(data)), starts)
    first[starts[1]] = False                                                # the second row lacks `first`
    last = np.isin(np.arange(len(data)), starts[1:] - 1) | (np.arange(len(data)) == len(data) - 1)
    head = np.repeat([1, 2, 3], [per_row + 2, per_row, per_row])
    out = run_beats(SMALL, {"data": data, "mask": np.ones(data.shape, bool), "first": first, "last": last,
                            "head": head}, 3 * per_row, B, S, dmax, modes, outs)
    want = [hccs_int(row[None], B[h], S[h], dmax[h], mode=modes[h], out=outs[h])[0]
            for row, h in ((long_row[:n_max], 1), (plain_row, 2), (plain_row, 3))]
    assert np.array_equal(out["out_data"].reshape(3, n_max), np.array(want, np.int32))
    assert out["out_first"].tolist() == [k % per_row == 0 for k in range(3 * per_row)]
    assert out["out_head"].tolist() == [1] * per_row + [2] * per_row + [3] * per_row
    assert out["status_before"].tolist() == [1, 1, 0]          # overflow, framing, bad_head
    assert out["status_after"].tolist() == [0, 0, 0]


@pytest.mark.slow
def test_a_row_for_a_missing_head_outputs_zeros_and_is_flagged(rng):
    unit = {"lanes": 4, "heads": 3, "n_max": 8, "out_type": "uint8"}
    B, S, dmax = per_head_params(rng, 3, 8)
    data = rng.integers(-128, 128, (4, 4)).astype(np.int8)
    beats = {"data": data, "mask": np.ones(data.shape, bool), "first": np.array([1, 0, 1, 0], bool),
             "last": np.array([0, 1, 0, 1], bool), "head": np.array([3, 3, 2, 2])}
    out = run_beats(unit, beats, 4, B, S, dmax, ["div"] * 3, ["uint8"] * 3)
    assert not out["out_data"][:2].any()
    assert np.array_equal(out["out_data"][2:].reshape(-1), hccs_int(data[2:].reshape(1, -1), B[2], S[2], dmax[2])[0])
    assert out["status_before"].tolist() == [0, 0, 1]


def test_sim_command_checks_a_vectors_file_and_reports_cycles(tmp_path, capsys, rng):
    from somatile.host.cli import main
    cols = BOARD["n_max"]  # 2 heads x 256 columns at 8 lanes: the board unit's build
    B, S, dmax = per_head_params(rng, 2, cols)
    path = tmp_path / "vectors.npz"
    x = rng.integers(-128, 128, (2, 30, cols)).astype(np.int8)
    np.savez(path, x=x, mask=rng.random(x.shape) < 0.9, B=B, S=S, dmax=dmax)
    assert main(["sim", "hccs", "--vectors", str(path), "--lanes", "8"]) == 0
    printed = capsys.readouterr().out
    assert "rows: 60, mismatching rows: 0, framing errors: 0" in printed
    want = expected_cycles(HCCSConfig(**BOARD), 60, cols)
    assert f"cycles: measured {want}, expected {want} (1.000x)" in printed


@pytest.mark.parametrize("change,message", [
    ({"dmax": None}, "key 'dmax' is missing"), ({"x": np.zeros((2, 3, 8), np.int16)}, "'x' must be int8"),
    ({"B": np.array([1, 2, 3])}, "'B' must be integers of shape \\(2,\\)"),
    ({"B": np.array([32767, 10])}, "cols\\*B"),
])
def test_sim_command_names_what_is_wrong_in_a_vectors_file(tmp_path, capsys, change, message):
    from somatile.host.cli import main
    arrays = {"x": np.zeros((2, 3, 8), np.int8), "B": np.array([100, 100]), "S": np.array([1, 1]),
              "dmax": np.array([10, 10])}
    arrays.update(change)
    path = tmp_path / "bad.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    assert main(["sim", "hccs", "--vectors", str(path)]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_icarus_runs_the_same_unit_bit_exact(rng):
    if shutil.which("iverilog") is None:
        # .ci/run installs the Debian package on Linux, so there a missing Icarus is a broken set-up, not an option.
        message = "Icarus Verilog not installed (Debian: apt-get install iverilog; .ci/run installs it on Linux)"
        if sys.platform == "linux":
            pytest.fail(message)
        pytest.skip(message)
    cols, rows = 13, 300
    x = rng.integers(-128, 128, (rows, cols)).astype(np.int8)
    B, S, dmax = per_head_params(rng, SMALL["heads"], cols)
    modes, outs = zip(*(MODE_OUT * 4))
    run = simulate(x, rng.integers(0, SMALL["heads"], rows), B, S, dmax, modes=modes, outs=outs,
                   mask=rng.random(x.shape) < 0.8, unit=SMALL, idle=0.2, backpressure=0.3, simulator="icarus")
    assert_bit_exact(run)


def test_the_chunked_regression_gives_the_same_counts_serially_and_on_two_processes():
    from somatile.sim.run_hccs import regression

    serial = regression(240, cols=BOARD["n_max"], heads=BOARD["heads"], lanes=BOARD["lanes"], chunk=80, seed=5,
                        n_jobs=1)
    parallel = regression(240, cols=BOARD["n_max"], heads=BOARD["heads"], lanes=BOARD["lanes"], chunk=80, seed=5,
                          n_jobs=2)
    assert serial["rows"] == 240 and len(serial["chunks"]) == 3
    assert serial["mismatches"] == serial["framing"] == 0
    assert serial["cycles"] == serial["expected_cycles"]
    keys = ("rows", "mismatches", "framing", "cycles", "expected_cycles")
    assert [[c[k] for k in keys] for c in serial["chunks"]] == [[c[k] for k in keys] for c in parallel["chunks"]]
