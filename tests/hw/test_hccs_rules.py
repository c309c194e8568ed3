"""The HCCS rules unit (hw/hccs_rules.py) in the Amaranth simulator against the model's rule check
(somatile.model.hccs.check_params, on values inside the registers' ranges), one input set per cycle, the
answer LATENCY cycles later; the row length as a port and as a constant."""

import numpy as np
import pytest
from amaranth.hdl import unsigned
from amaranth.sim import Simulator

from somatile.hw.hccs_rules import LATENCY, HccsRules
from somatile.model import hccs


def model_ok(B, S, dmax, cols):
    try:
        hccs.check_params(B, S, dmax, cols)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("constant_cols", [None, 68])
def test_the_rules_unit_agrees_with_check_params_on_every_cycle(constant_cols):
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(400):
        s, dm = int(rng.integers(0, 128)), int(rng.integers(0, 128))
        # B near the edges the rules draw: around S*Dmax, around the masses' bounds.
        cols = constant_cols or int(rng.choice([1, 2, int(rng.integers(1, 300))]))
        edge = int(rng.choice([s * dm, -(-hccs.MIN_FLOOR_MASS // cols) + s * dm, hccs.MAX_ROW_MASS // cols]))
        b = int(np.clip(edge + rng.integers(-2, 3), 1, hccs.B_MAX))
        cases.append((b, s, dm, cols))
    dut = HccsRules(unsigned(15), unsigned(7), unsigned(7), constant_cols)
    seen = []

    async def bench(ctx):
        for cycle in range(len(cases) + LATENCY):
            if cycle < len(cases):
                b, s, dm, cols = cases[cycle]
                ctx.set(dut.B, b)
                ctx.set(dut.S, s)
                ctx.set(dut.dmax, dm)
                if constant_cols is None:
                    ctx.set(dut.cols, cols)
            await ctx.tick()
            seen.append(ctx.get(dut.ok))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    got = [bool(seen[i + LATENCY - 1]) for i in range(len(cases))]
    want = [model_ok(*c) for c in cases]
    assert got == want
    assert 0 < sum(want) < len(want)  # both answers occur
    if constant_cols is None:  # B >= 2^14 (the top bit of a 15-bit register) is valid over one column
        assert any(ok and c[0] >= 1 << 14 for ok, c in zip(want, cases))
