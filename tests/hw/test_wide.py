"""The wide profile's row normaliser (hw/wide.py) in the Amaranth simulator: each component against the numpy
spec of somatile.model.wide, the whole unit bit-exact on random, adversarial and masked rows of every
normaliser under input idles and output backpressure, and its measured cycles equal to ``expected_cycles``;
then the same unit in Verilator through cocotb (sim/tb_wide.py), on random, adversarial and MiniLM's own
attention logits, and the ``somatile sim hccs --profile wide`` command."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from somatile.hw import wide as hw_wide
from somatile.hw.wide import (ProbabilityLane, RowMax, RowReciprocal, WideConfig, WideNormaliser, WideWeight,
                              expected_cycles, reciprocal_cycles, streaming_row_beats)
from somatile.model import wide

NAMES = {wide.NORM_EXP: "exp", wide.NORM_HCCS: "hccs", wide.NORM_PWL2: "pwl2"}
# (code, B, S, dmax) per head: every normaliser, the clip inside and outside the row's spread.
HEADS = [(wide.NORM_EXP, 0, 0, 0), (wide.NORM_HCCS, 32768, 300, 20000), (wide.NORM_PWL2, 0, 256, 65535),
         (wide.NORM_PWL2, 0, 700, 5000), (wide.NORM_HCCS, 20000, 50, 3000)]


def simulate(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


def run_pipeline(dut, inputs: list[list[tuple]], latency: int, output):
    """Drive ``inputs`` (each a list of (port, value)) one per cycle into a free-running pipeline; ``output``
    read ``latency`` cycles after each."""
    got = []

    async def bench(ctx):
        for i in range(len(inputs) + latency):
            if i < len(inputs):
                for port, value in inputs[i]:
                    ctx.set(port, value)
            await ctx.tick()
            if i >= latency - 1 and len(got) < len(inputs):
                got.append(ctx.get(output))

    simulate(dut, bench)
    return np.array(got)


def test_the_weight_lane_is_the_spec_for_every_normaliser(rng):
    dut = WideWeight()
    ts = np.concatenate([rng.integers(0, 65536, 300), [0, 1, 127, 128, 255, 256, 4095, 4096, 20000, 65535]])
    cases = [(int(t), *h) for h in HEADS for t in ts]
    inputs = [[(dut.t, t), (dut.valid, 1), (dut.params.code, c), (dut.params.B, B), (dut.params.S, S),
               (dut.params.dmax, d)] for t, c, B, S, d in cases]
    got = run_pipeline(dut, inputs, WideWeight.LATENCY, dut.E)
    want = [int(wide.weights_spec(np.int64(t), c, np.int64(B), np.int64(S), np.int64(d))) for t, c, B, S, d in cases]
    assert np.array_equal(got, want)


def test_the_probability_lane_is_step_8(rng):
    dut = ProbabilityLane()
    E = np.concatenate([rng.integers(0, 32769, 200), [0, 1, 32768, 32768]])
    k = np.concatenate([rng.integers(-15, 16, 200), [-15, 15, -15, 15]])
    inv = np.concatenate([rng.integers(1 << 15, (1 << 16) + 1, 200), [65536, 32769, 65536, 32769]])
    inputs = [[(dut.E, int(e)), (dut.k, int(kk)), (dut.inv, int(i))] for e, kk, i in zip(E, k, inv)]
    got = run_pipeline(dut, inputs, ProbabilityLane.LATENCY, dut.p)
    s = 16 + k
    assert np.array_equal(got, np.minimum((E * inv + (1 << (s - 1))) >> s, 32768))


def test_the_row_max_takes_valid_lanes_and_restarts_at_first():
    dut = RowMax(4)
    beats = [([5, -7, 9, 2], 0b1011, 1), ([100, 3, -2, 0], 0b0001, 0), ([-32768] * 4, 0b1111, 1),
             ([32767, 0, 0, 0], 0b0000, 0), ([-1, -2, -3, -4], 0b0110, 1)]
    inputs = [[(dut.take, 1), (dut.first, f), (dut.mask, mask), *((dut.data[j], v) for j, v in enumerate(d))]
              for d, mask, f in beats]
    got = run_pipeline(dut, inputs, RowMax.latency(4), dut.row_max)
    assert got.tolist() == [5, 100, -32768, -32768, -2]


@pytest.mark.parametrize("div_bits", [1, 2, 3])
def test_the_reciprocal_is_steps_5_to_7_in_its_cycles(div_bits, rng):
    cfg = WideConfig(div_bits=div_bits)
    dut = RowReciprocal(cfg)
    totals = [0, 1, 2, 3, 32767, 32768, 32769, 65535, 65536, (1 << 31) - (1 << 15), (1 << 30) + 5]
    totals += rng.integers(1, 1 << 31, 20).tolist()
    results = []

    async def bench(ctx):
        for total in totals:
            ctx.set(dut.start, 1)
            ctx.set(dut.total, int(total))
            await ctx.tick()
            ctx.set(dut.start, 0)
            cycles = 1
            while not ctx.get(dut.done):
                await ctx.tick()
                cycles += 1
            results.append((ctx.get(dut.k), ctx.get(dut.inv), cycles))
            await ctx.tick()

    simulate(dut, bench)
    for total, (k, inv, cycles) in zip(totals, results):
        top = max(int(total), 1).bit_length() - 1
        T = total >> (top - 15) if top >= 15 else total << (15 - top)
        assert (k, inv) == (top - 15, (1 << 31) // T if total else 0), total
        assert cycles == reciprocal_cycles(cfg) + 1  # the start cycle, then the occupancy


def rows_for(rng, R, N, kind):
    """Rows of int16 logits with masks: "random" (the full int16 range), "spread" (a few bits), adversarial
    rows (constant extremes, one valid element, all masked)."""
    if kind == "random":
        x = rng.integers(-32768, 32768, (R, N))
    else:
        x = rng.integers(-600, 600, (R, N))
    mask = rng.random((R, N)) < 0.85
    if kind == "adversarial":
        x[0], x[1 % R] = -32768, 32767
        mask[2 % R] = False
        mask[3 % R] = False
        mask[3 % R, N // 2] = True
    return x.astype(np.int16), mask


def reference(x, mask, heads, params):
    out = np.zeros(x.shape, np.int64)
    for r in range(len(x)):
        code, B, S, dmax = params[heads[r]]
        out[r] = wide.wide_softmax(x[r:r + 1], NAMES[code], B, S, dmax, mask=mask[r:r + 1], impl="numpy")[0]
    return out


def stream(cfg, x, mask, heads, params, *, ready=1.0, idle=0.0, seed=0):
    """Rows through the unit in the Amaranth simulator; returns (rows out, cycles first beat in .. last out,
    status)."""
    dut = WideNormaliser(config=cfg)
    L, (R, N) = cfg.lanes, x.shape
    nb = -(-N // L)
    draws = np.random.default_rng(seed)
    out, span, status = [], {}, {}

    async def bench(ctx):
        for h, (code, B, S, dmax) in enumerate(params):
            ctx.set(dut.cfg.valid, 1)
            ctx.set(dut.cfg.payload.head, h)
            for name, value in zip(("code", "B", "S", "dmax"), (code, B, S, dmax)):
                ctx.set(getattr(dut.cfg.payload.params, name), value)
            await ctx.tick()
        ctx.set(dut.cfg.valid, 0)
        sent, cycle = 0, 0
        while len(out) < R * nb:
            r, b = divmod(sent, nb)
            driving = sent < R * nb and draws.random() >= idle
            ctx.set(dut.i.valid, int(driving))
            if driving:
                lanes = range(b * L, min((b + 1) * L, N))
                for j, col in enumerate(lanes):
                    ctx.set(dut.i.payload.data[j], int(x[r, col]))
                ctx.set(dut.i.payload.mask, sum(int(mask[r, col]) << j for j, col in enumerate(lanes)))
                ctx.set(dut.i.payload.first, int(b == 0))
                ctx.set(dut.i.payload.last, int(b == nb - 1))
                ctx.set(dut.i.payload.head, int(heads[r]))
            ctx.set(dut.o.ready, int(draws.random() < ready))
            *_, i_ok, o_ok, payload = await ctx.tick().sample(dut.i.valid & dut.i.ready, dut.o.valid & dut.o.ready,
                                                              dut.o.payload)
            if i_ok:
                span.setdefault("first", cycle)
                sent += 1
            if o_ok:
                out.append([payload.data[j] for j in range(L)])
                span["last"] = cycle
            cycle += 1
            assert cycle < 200 * R * nb + 2000, "the unit stopped"
        status.update({name: ctx.get(getattr(dut.status, name)) for name in ("overflow", "framing", "bad_head")})

    simulate(dut, bench)
    return np.array(out).reshape(R, nb * L)[:, :N], span["last"] - span["first"] + 1, status


@pytest.mark.parametrize("lanes, R, N, kind", [(1, 3, 9, "adversarial"), (2, 9, 13, "random"), (4, 10, 64, "spread"),
                                                (4, 9, 1, "spread"), (8, 6, 40, "adversarial"), (8, 9, 64, "random")])
def test_rows_are_bit_exact_and_take_the_expected_cycles(lanes, R, N, kind, rng):
    cfg = WideConfig(lanes=lanes, heads=len(HEADS), n_max=64)
    x, mask = rows_for(rng, R, N, kind)
    heads = rng.integers(0, len(HEADS), R)
    got, cycles, status = stream(cfg, x, mask, heads, HEADS)
    assert np.array_equal(got, reference(x, mask, heads, HEADS))
    assert cycles == expected_cycles(cfg, R, N)
    assert status == {"overflow": 0, "framing": 0, "bad_head": 0}


def test_idles_and_backpressure_lose_no_beat(rng):
    cfg = WideConfig(lanes=4, heads=len(HEADS), n_max=64, div_bits=3)
    x, mask = rows_for(rng, 11, 30, "adversarial")
    heads = rng.integers(0, len(HEADS), 11)
    got, _, _ = stream(cfg, x, mask, heads, HEADS, ready=0.4, idle=0.3, seed=4)
    assert np.array_equal(got, reference(x, mask, heads, HEADS))


def test_rows_of_the_documented_length_stream_at_one_beat_per_cycle():
    cfg = WideConfig(lanes=4, heads=1, n_max=1024)
    nb = streaming_row_beats(cfg)
    assert nb == hw_wide.bank_overhead(cfg)

    def period(beats):
        return (expected_cycles(cfg, 48, beats * 4) - expected_cycles(cfg, 40, beats * 4)) / 8

    assert period(nb) == nb and period(nb - 1) > nb - 1


def test_a_row_for_a_missing_head_outputs_zeros_and_is_flagged(rng):
    cfg = WideConfig(lanes=4, heads=3, n_max=16)  # head numbers 0..3 fit the head field; 3 is missing
    x, mask = rows_for(rng, 3, 10, "spread")
    got, _, status = stream(cfg, x, mask, np.array([0, 3, 1]), HEADS[:3])
    assert not got[1].any() and status["bad_head"] == 1
    assert np.array_equal(got[[0, 2]], reference(x[[0, 2]], mask[[0, 2]], [0, 1], HEADS[:3]))


@pytest.mark.parametrize("kwargs, message", [(dict(lanes=3), "lanes: expected one of"),
                                             (dict(n_max=30, lanes=4), r"n_max: expected a positive multiple of lanes \(4\) up"),
                                             (dict(div_bits=4), "div_bits: expected"),
                                             (dict(heads=0), "heads: expected")])
def test_bad_configuration_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WideConfig(**kwargs)


# Verilator (cocotb) runs of the same unit: sim/tb_wide.py through somatile.sim.run_hccs.simulate_wide. One
# unit serves every test (one Verilator build): MiniLM's 12 heads, rows up to 128.
RTL_UNIT = dict(lanes=4, heads=12, n_max=128)

def assert_bit_exact(run):
    assert not run.framing_errors, run.framing_errors[:3]
    assert not run.mismatches, run.mismatches[:3]
    assert run.status == {"overflow": 0, "framing": 0, "bad_head": 0}


def test_verilator_rows_of_every_normaliser_are_bit_exact_under_idles_and_backpressure(rng):
    from somatile.sim.run_hccs import simulate_wide

    unit = RTL_UNIT
    x, mask = rows_for(rng, 300, 100, "random")
    x2, mask2 = rows_for(rng, 100, 100, "adversarial")
    x, mask = np.concatenate([x, x2]), np.concatenate([mask, mask2])
    heads = rng.integers(0, len(HEADS), len(x))
    run = simulate_wide(x, heads, [NAMES[h[0]] for h in HEADS], *zip(*(h[1:] for h in HEADS)), mask=mask,
                        unit=unit, idle=0.2, backpressure=0.3, seed=3)
    assert_bit_exact(run)


def test_verilator_real_minilm_logits_with_the_eval_calibration_are_bit_exact_at_the_expected_cycles():
    """MiniLM's own attention logits (layer 1, the committed excerpt), pwl2 parameters calibrated per head on
    other sentences than the rows sent (fallback heads run the exp): back to back, bit-exact, exact cycles."""
    from somatile.eval import text
    from somatile.eval.minilm import collect_minilm_logits
    from somatile.model.calibrate import calibrate_wide_params
    from somatile.model.minilm import MiniLM
    from somatile.sim.run_hccs import simulate_wide

    cols = 64
    model = MiniLM.load()
    pool = [s for s in text.sentences(text.load_text(), None) if len(model.encode(s)) <= cols]
    calib_logits, calib_mask = collect_minilm_logits(model, pool[:16], cols)[1]
    params = calibrate_wide_params(calib_logits, calib_mask, normaliser="pwl2")
    logits, mask = collect_minilm_logits(model, pool[16:22], cols)[1]
    x = wide.logits_from_float(logits, mask)
    H, R, N = x.shape
    normalisers = ["exp" if f else "pwl2" for f in params.fallback]
    B, S, dmax = (np.where(params.fallback, 0, v) for v in (params.B, params.S, params.dmax))
    unit = RTL_UNIT
    assert H == unit["heads"] and N <= unit["n_max"]
    run = simulate_wide(x.reshape(H * R, N), np.repeat(np.arange(H), R), normalisers, B, S, dmax,
                        mask=mask.reshape(H * R, N), unit=unit)
    assert_bit_exact(run)
    assert run.cycles == expected_cycles(WideConfig(**unit), H * R, N)


def test_sim_command_runs_the_wide_unit_on_a_vectors_file(tmp_path, capsys, rng):
    from somatile.host.cli import main

    heads, n = RTL_UNIT["heads"], RTL_UNIT["n_max"]   # the unit the other Verilator tests built
    x = rng.integers(-4000, 4000, (heads, 3, n)).astype(np.int16)
    B, S, dmax = (rng.integers(lo, hi, heads) for lo, hi in ((30000, 32769), (100, 300), (8000, 9000)))
    np.savez(tmp_path / "v.npz", x=x, B=B, S=S, dmax=dmax)
    assert main(["sim", "hccs", "--profile", "wide", "--normaliser", "hccs", "--vectors", str(tmp_path / "v.npz")]) == 0
    out = capsys.readouterr().out
    assert f"rows: {3 * heads}, mismatching rows: 0, framing errors: 0" in out
    expected = expected_cycles(WideConfig(**RTL_UNIT), 3 * heads, n)
    assert f"cycles: measured {expected}, expected {expected} (1.000x)" in out
    np.savez(tmp_path / "w.npz", x=x.astype(np.int8), B=np.array([1, 1]), S=np.array([0, 0]), dmax=np.array([0, 0]))
    assert main(["sim", "hccs", "--profile", "wide", "--vectors", str(tmp_path / "w.npz")]) == 2
    err = capsys.readouterr().err
    assert "w.npz: 'x' must be int16 of shape (H, R, N)" in err and "(profile wide)" in err
