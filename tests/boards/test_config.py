"""Board YAMLs load into a validated config; bad files and overrides are rejected with a precise message."""

import dataclasses
import textwrap

import pytest

import somatile.boards as boards
from somatile.boards import BoardError
from somatile.boards.config import SECTION_DEFAULTS


def test_every_board_loads_and_default_comes_first():
    found = boards.names()
    assert found[0] == boards.DEFAULT_BOARD == "sim"
    assert {"sim", "ulx3s_85f", "icebreaker", "vck190", "vek280"} <= set(found)
    assert "base" not in found and "versal_base" not in found
    for name in found:
        cfg = boards.load(name)
        assert cfg.name == name and cfg.chain[0].name == "base.yaml" and cfg.chain[-1] == cfg.source


def test_config_is_frozen():
    cfg = boards.load("sim")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lanes = 16


def test_fpga_boards_state_the_part():
    ulx3s = boards.load("ulx3s_85f")
    assert (ulx3s.fpga["family"], ulx3s.fpga["device"], ulx3s.fpga["speed_grade"]) == ("ecp5", "LFE5U-85F", "6")
    assert boards.load("icebreaker").fpga["device"] == "iCE40UP5K"
    assert boards.load("sim").fpga is None


@pytest.mark.parametrize("name, macs, memory, tiles, ports, clock", [
    ("vck190", 128, 32 * 1024, 400, 2, 1250.0),
    ("vek280", 256, 64 * 1024, 304, 1, 1000.0),
])
def test_versal_boards_carry_the_ai_engine_tile_facts(name, macs, memory, tiles, ports, clock):
    cfg = boards.load(name)
    aie = cfg.aie
    assert (aie["int8_macs_per_cycle"], aie["data_memory_bytes"], aie["tiles"]) == (macs, memory, tiles)
    assert (aie["stream_ports_in"], aie["stream_port_bits"], aie["clock_mhz"]) == (ports, 32, clock)
    assert aie["array_columns"] * aie["array_rows"] == tiles
    # The PL tile mirrors the AI Engine tile's memory and stream port; its MAC lanes match head_dim 64.
    assert (cfg.local_memory_bytes, cfg.stream_width) == (memory, aie["stream_port_bits"])
    assert cfg.lanes <= macs


def test_kwargs_come_from_the_config():
    cfg = boards.load("ulx3s_85f")
    assert cfg.hccs_kwargs() == {"lanes": cfg.hccs_lanes, "n_max": cfg.n_max, "heads": cfg.heads,
                                 "out_type": cfg.hccs_out}
    assert cfg.array_kwargs()["n_tiles"] == cfg.n_tiles
    assert cfg.total_heads == cfg.n_tiles * cfg.heads
    from somatile.hw.regmap import TileParams
    assert TileParams.from_board(cfg) == TileParams(**cfg.array_kwargs())


def test_override_is_validated_and_recorded():
    cfg = boards.load("ulx3s_85f", boards.parse_assignments(["lanes=16", "clock_mhz=125.5"]))
    assert (cfg.lanes, cfg.clock_mhz) == (16, 125.5)
    assert dict(cfg.overrides) == {"lanes": 16, "clock_mhz": 125.5}
    assert boards.load("ulx3s_85f").lanes == 8


@pytest.mark.parametrize("item, message", [
    ("lanes=12", "key 'lanes': got 12, expected a power of two"),
    ("lanes=eight", "key 'lanes': got 'eight' (str), expected an integer"),
    ("lanes=true", "expected an integer"),
    ("hccs_out=int8", "key 'hccs_out': got 'int8', expected one of uint8, int16"),
    ("clock_mhz=-5", "key 'clock_mhz': got -5, expected a positive finite number"),
    ("bogus=1", "unknown or fixed parameter 'bogus'"),
    ("kind=fpga", "unknown or fixed parameter 'kind'"),
    ("lanes", "expected KEY=VALUE"),
    ("n_max=8", "key 'n_max'"),
    ("head_dim=24", "key 'head_dim'"),
    ("profile=int4", "key 'profile': got 'int4', expected one of paper, wide"),
    ("fpga.seed=1", "board sim has no section 'fpga'"),
])
def test_bad_override_names_key_value_and_expectation(item, message):
    with pytest.raises(BoardError, match="--set") as exc:
        boards.load("sim", boards.parse_assignments([item]))
    assert message in str(exc.value)


def test_a_section_key_is_overridden_validated_and_recorded():
    """``SECTION.KEY`` replaces one key of a section (the seed sweep of a board's place and route)."""
    from somatile.boards import build
    cfg = boards.load("ulx3s_85f", boards.parse_assignments(["fpga.seed=7", "soc.cpu_mhz=70"]))
    assert (cfg.fpga["seed"], cfg.soc["cpu_mhz"], dict(cfg.overrides)) == (7, 70.0, {"fpga.seed": 7,
                                                                                   "soc.cpu_mhz": 70.0})
    board = boards.load("ulx3s_85f")
    # the rest kept
    assert board.fpga["seed"] == {"tile": 1, "array": 2, "soc": 3} and cfg.fpga["tile_placer"] == "static"
    assert board.fpga["timing_margin_pct"] == {"tile": 5, "array": 5, "soc": 3}
    assert build.build_dir_name(cfg, "array") == "array-fpga.seed7-soc.cpu_mhz70.0"
    for top in ("hccs", "array", "soc"):
        assert "seed 7" in build.toolchain_options(cfg, top)["nextpnr_opts"].split(" --"), top
    assert "seed 1" in build.toolchain_options(board, "tile")["nextpnr_opts"].split(" --")  # the board's tile seed
    assert "--seed" not in build.toolchain_options(board, "hccs")["nextpnr_opts"]  # and none for the HCCS unit
    for item, message in (("fpga.seed=-1", "key 'fpga.seed': got -1, expected an integer from 0"),
                          ("fpga.sed=1", "unknown key 'sed' of section 'fpga'; expected one of: platform"),
                          ("aie.tiles=4", "board ulx3s_85f has no section 'aie'; its sections: fpga, soc"),
                          ("soc.baud=fast", "key 'soc.baud': got 'fast' (str), expected an integer"),
                          ("fpga.tile_nextpnr_opts=--seed 3", "other than --seed (set fpga.seed instead)")):
        with pytest.raises(BoardError, match="--set") as exc:
            boards.load("ulx3s_85f", boards.parse_assignments([item]))
        assert message in str(exc.value), item


def test_a_seed_per_top_reaches_only_that_tops_nextpnr(tmp_path):
    """``fpga.seed`` as a mapping: each top placed from its own seed (the one a sweep found), the others from
    nextpnr's own start; an override ``fpga.seed=N`` still sets every top's."""
    from somatile.boards import build
    cfg = boards.load(_write(tmp_path, "mine", "extends: ulx3s_85f\nfpga: {seed: {soc: 5, array: 2}}\n"))
    options = {top: build.toolchain_options(cfg, top)["nextpnr_opts"].split(" --") for top in ("tile", "array", "soc")}
    assert ("seed 5" in options["soc"], "seed 2" in options["array"]) == (True, True)
    assert not any(o.startswith("seed") for o in options["tile"])
    assert cfg.with_overrides({"fpga.seed": 9}).nextpnr_seed("tile") == 9


def test_versal_memory_must_match_the_ai_engine_tile():
    with pytest.raises(BoardError, match="local_memory_bytes.*aie.data_memory_bytes = 32768"):
        boards.load("vck190", {"local_memory_bytes": 65536})


def _write(tmp_path, name, text):
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("body, message", [
    ("extends: base\nlanes: 3\n", "key 'lanes': got 3, expected a power of two from 1 to 256"),
    ("extends: base\nstream_width: 48\n", "key 'stream_width': got 48, expected one of 32, 64, 128"),
    ("extends: base\nlaness: 8\n", "key 'laness': unknown"),
    ("extends: base\nkind: fpga\n", "key 'fpga': expected a mapping"),
    ("extends: base\nfpga: {platform: x}\n", "key 'fpga': only boards of kind 'fpga'"),
    ("extends: nowhere\n", "board 'nowhere': no such board file"),
    ("lanes: 8\n", "key 'description': missing"),
    ("- 1\n- 2\n", "expected a mapping of parameters at the top level"),
    ("lanes: [8\n", "not valid YAML"),
    ("extends: base\nkind: fpga\nfpga: {platform: 'amaranth_boards.ulx3s:ULX3S_85F_Platform', family: xilinx, "
     "device: d, speed_grade: '1', osc_mhz: 10}\n", "key 'fpga.family': got 'xilinx', expected one of ecp5, ice40"),
    ("extends: base\nkind: fpga\nfpga: {platform: 'amaranth_boards.ulx3s:ULX3S_85F_Platform', family: ecp5, "
     "device: d, speed_grade: '1'}\n", "key 'fpga.osc_mhz': missing"),
    ("extends: ulx3s_85f\nfpga: {router: router3}\n",
     "key 'fpga.router': got 'router3', expected one of router1, router2"),
    ("extends: ulx3s_85f\nfpga: {tile_router: 2}\n",
     "key 'fpga.tile_router': got 2 (int), expected a string"),
    ("extends: ulx3s_85f\nfpga: {tile_placer: sa}\n",
     "key 'fpga.tile_placer': got 'sa', expected one of heap, static"),
    ("extends: icebreaker\nfpga: {dsp_registers: packed}\n",
     "key 'fpga.dsp_registers': got 'packed', expected 'fabric' for family 'ice40'"),
    ("extends: ulx3s_85f\nfpga: {dsp_registers: inside}\n",
     "key 'fpga.dsp_registers': got 'inside', expected one of fabric, packed"),
    ("extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: '--seed 2; rm -r x'}\n",
     "key 'fpga.tile_nextpnr_opts': got '--seed 2; rm -r x', expected nextpnr options"),
    # options the build passes from keys of their own (nextpnr refuses an option given twice)
    ("extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: '--tmg-ripup --placer static'}\n",
     "key 'fpga.tile_nextpnr_opts': got '--tmg-ripup --placer static', expected nextpnr options other than "
     "--placer (set fpga.tile_placer instead)"),
    ("extends: ulx3s_85f\nfpga: {tile_opts_budget_s: 0}\n",
     "key 'fpga.tile_opts_budget_s': got 0, expected a positive finite number"),
    # Issue 24: strings that reach Tcl or a shell script are allow-listed, not scanned for bad characters.
    ("extends: vck190\naie: {part: 'xcvc1902 [exec touch pwned]'}\n",
     "key 'aie.part': got 'xcvc1902 [exec touch pwned]', expected a part name"),
    ("extends: ulx3s_85f\nfpga: {device: 'LFE5U-85F$(id)'}\n", "key 'fpga.device': got 'LFE5U-85F$(id)'"),
    ("extends: ulx3s_85f\nfpga: {speed_grade: '6 --pre-pack x.py'}\n", "key 'fpga.speed_grade'"),
    ("extends: ulx3s_85f\nfpga: {platform: 'os:system'}\n",
     "key 'fpga.platform': got 'os:system', expected an amaranth-boards platform class"),
    ("extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: '--seed 2 # and the rest'}\n",
     "key 'fpga.tile_nextpnr_opts': got '--seed 2 # and the rest', expected nextpnr options"),
    ("extends: ulx3s_85f\nfpga: {seed: {sock: 2}}\n",
     "key 'fpga.seed': got top 'sock', expected a mapping of tops (hccs, tile, array, soc) to integers"),
    ("extends: ulx3s_85f\nfpga: {seed: {soc: -2}}\n", "key 'fpga.seed.soc': got -2, expected an integer from 0"),
    ("extends: ulx3s_85f\nfpga: {seed: 1.5}\n",
     "key 'fpga.seed': got 1.5 (float), expected an integer or a mapping of tops"),
    ("extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: {tile: 3}}\n",
     "key 'fpga.tile_nextpnr_opts.tile': got 3 (int), expected a string"),
    ("extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: {array: '--tmg-ripup; id'}}\n",
     "key 'fpga.tile_nextpnr_opts.array': got '--tmg-ripup; id', expected nextpnr options"),
    ("extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: {tiles: ''}}\n",
     "key 'fpga.tile_nextpnr_opts': got top 'tiles', expected a mapping of tops (hccs, tile, array, soc) to "
     "strings"),
    ("extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: 2}\n",
     "key 'fpga.tile_nextpnr_opts': got 2 (int), expected a string or a mapping of tops"),
    ("extends: base\ndescription: \"two\\nlines\"\n", "key 'description': got 'two\\nlines'"),
    # and YAML that reads one way to the eye and another to the loader
    ("extends: base\nlanes: 8\nlanes: 16\n", "key 'lanes' given twice in one mapping"),
    ("extends: base\nabstract: yes\n", "'yes' is a boolean in YAML 1.1 and a string in YAML 1.2"),
    ("extends: base\nabstract: 'false'\n", "key 'abstract': got 'false', expected true or false"),
])
def test_bad_board_file_names_file_key_and_expectation(tmp_path, body, message):
    path = _write(tmp_path, "myboard", body)
    with pytest.raises(BoardError) as exc:
        boards.load(path)
    assert str(path) in str(exc.value) or "nowhere" in str(exc.value)
    assert message in str(exc.value)


def test_a_board_file_name_that_tcl_or_a_shell_would_read_is_refused(tmp_path):
    path = _write(tmp_path, "my board[exec id]", "extends: base\n")
    with pytest.raises(BoardError, match=r"board name 'my board\[exec id\]' \(the file name\): expected"):
        boards.load(path)


def test_an_override_value_is_read_with_the_same_strict_yaml():
    with pytest.raises(BoardError, match="'on' is a boolean in YAML 1.1"):
        boards.parse_assignments(["lanes=on"])


def test_the_platform_must_be_a_platform_class_when_it_is_opened():
    from somatile.boards.build import open_platform

    cfg = boards.load("ulx3s_85f")
    cfg = dataclasses.replace(cfg, fpga={**cfg.fpga, "platform": "amaranth_boards.ulx3s:Resource"})
    with pytest.raises(BoardError, match="'amaranth_boards.ulx3s:Resource' is not a platform class"):
        open_platform(cfg)


def test_user_board_file_extends_a_shipped_board(tmp_path):
    path = _write(tmp_path, "mine", "extends: ulx3s_85f\ndescription: my ULX3S\nlanes: 4\nfpga: {osc_mhz: 25.0}\n")
    cfg = boards.load(path)
    assert (cfg.name, cfg.lanes, cfg.kind, cfg.fpga["family"]) == ("mine", 4, "fpga", "ecp5")
    assert cfg.fpga["router"] == boards.load("ulx3s_85f").fpga["router"]  # inherited key by key


def test_the_nextpnr_routers_default_to_router1_and_reach_the_build_script_of_their_top(tmp_path):
    from somatile.boards import build
    from somatile.boards.harness import ShiftHarness
    from somatile.boards.pll import pll_for
    ice = boards.load("icebreaker")  # its file leaves both keys out
    assert (ice.fpga["router"], ice.fpga["tile_router"]) == ("router1", "router1")
    cfg = boards.load(_write(tmp_path, "r2", "extends: icebreaker\nfpga: {tile_router: router2}\n"))
    assert (cfg.fpga["router"], cfg.fpga["tile_router"]) == ("router1", "router2")
    for top, router in (("hccs", "router1"), ("tile", "router2"), ("array", "router2")):
        options = build.toolchain_options(cfg, top)
        assert f"--router {router}" in options["nextpnr_opts"], top
        assert "--tmg-ripup" not in options["nextpnr_opts"]  # icebreaker sets no further options
    # The placer: nextpnr's default (heap) unless the board names another; the iCEBreaker names static.
    assert SECTION_DEFAULTS["fpga"]["tile_placer"] == "heap" and ice.fpga["tile_placer"] == "static"
    placed = boards.load(_write(tmp_path, "st", "extends: icebreaker\nfpga: {tile_placer: static}\n"))
    assert [("--placer static" in build.toolchain_options(placed, top)["nextpnr_opts"]) for top in
            ("hccs", "tile", "array", "soc")] == [False, True, True, True]
    # Further options per top: one string for every top but the HCCS unit, or a mapping of tops.
    every = boards.load(_write(tmp_path, "every", "extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: --tmg-ripup}\n"))
    assert [("--tmg-ripup" in build.toolchain_options(every, top)["nextpnr_opts"]) for top in
            ("hccs", "tile", "array", "soc")] == [False, True, True, True]
    some = boards.load(_write(tmp_path, "some",
                              "extends: ulx3s_85f\nfpga: {tile_nextpnr_opts: {array: --tmg-ripup}}\n"))
    assert [("--tmg-ripup" in build.toolchain_options(some, top)["nextpnr_opts"]) for top in
            ("hccs", "tile", "array", "soc")] == [False, False, True, False]
    assert not build.uses_tile_opts(some, "tile") and build.uses_tile_opts(some, "array")
    ulx3s = boards.load("ulx3s_85f")
    assert ulx3s.fpga["tile_opts_budget_s"] == 2700.0
    unit = build.make_unit(cfg, "hccs")
    plan = build.open_platform(cfg).prepare(ShiftHarness(unit, pll_for("ice40", 12.0, cfg.clock_mhz)), name="t",
                                            **build.toolchain_options(cfg, "tile"))
    script = plan.files["build_t.sh"]
    assert "--router router2" in script and "--timing-allow-fail" in script


def test_extends_cycle_is_reported(tmp_path):
    _write(tmp_path, "a", "extends: b\n")
    b = _write(tmp_path, "b", "extends: a\n")
    with pytest.raises(BoardError, match="cycle"):
        boards.load(b)


def test_packed_dsp_registers_put_the_packing_step_between_yosys_and_nextpnr(tmp_path):
    from somatile.boards import build
    from somatile.boards.harness import ShiftHarness
    from somatile.boards.pll import pll_for
    scripts = {}
    for value in ("packed", "fabric"):
        cfg = boards.load(_write(tmp_path, value, f"extends: ulx3s_85f\nfpga: {{dsp_registers: {value}}}\n"))
        unit = build.make_unit(cfg, "hccs")
        plan = build.open_platform(cfg).prepare(ShiftHarness(unit, pll_for("ecp5", 25.0, cfg.clock_mhz)),
                                                name="t", **build.toolchain_options(cfg, "hccs"))
        scripts[value] = plan.files["build_t.sh"].splitlines()
    step = [i for i, line in enumerate(scripts["packed"]) if "somatile.boards.dsp_pack t.json" in line]
    yosys = [i for i, line in enumerate(scripts["packed"]) if "$YOSYS" in line and "t.ys" in line]
    nextpnr = [i for i, line in enumerate(scripts["packed"]) if "$NEXTPNR_ECP5" in line and "--json t.json" in line]
    assert len(step) == 1 and yosys[0] < step[0] < nextpnr[0]
    assert not any("dsp_pack" in line for line in scripts["fabric"])
    assert boards.load("ulx3s_85f").fpga["dsp_registers"] == "packed"


def test_timing_margin_raises_the_clock_nextpnr_is_given(tmp_path):
    """``fpga.timing_margin_pct`` scales the oscillator's constraint in the LPF (nextpnr derives the PLL's
    outputs from it) for the tops it names, and leaves the others' at the board's frequency."""
    from somatile.boards import build
    from somatile.boards.harness import ShiftHarness
    from somatile.boards.pll import pll_for
    cfg = boards.load(_write(tmp_path, "margin", "extends: ulx3s_85f\nfpga: {timing_margin_pct: {soc: 4}}\n"))
    assert cfg.per_top("timing_margin_pct", "soc") == 4 and cfg.per_top("timing_margin_pct", "array") == 0
    unit = build.make_unit(cfg, "hccs")
    lpf = {}
    for pct in (0, cfg.per_top("timing_margin_pct", "soc")):
        plan = build.open_platform(cfg, pct).prepare(ShiftHarness(unit, pll_for("ecp5", 25.0, cfg.clock_mhz)),
                                                     name="t", **build.toolchain_options(cfg, "hccs"))
        lpf[pct] = [line for line in plan.files["t.lpf"].splitlines() if line.startswith("FREQUENCY")]
    assert lpf[0] == ['FREQUENCY PORT "clk25_0__io" 25000000.0 HZ;']
    assert lpf[4] == ['FREQUENCY PORT "clk25_0__io" 26000000.0 HZ;']
    with pytest.raises(boards.BoardError, match=r"key 'fpga.timing_margin_pct.soc': got 15, expected an integer "
                                                r"from 0 to 10"):
        boards.load(_write(tmp_path, "too_much", "extends: ulx3s_85f\nfpga: {timing_margin_pct: {soc: 15}}\n"))
