"""`somatile build --top aie`: the aie4ml project of a calibrated parameter file, read back and checked against
the file head by head; each bad input is a one-line error naming the head, the key or the rule."""

import importlib.metadata
import json
import re
import time

import numpy as np
import pytest
import yaml

import somatile.boards as boards
from somatile.boards import aie
from somatile.host.cli import main as cli
from somatile.model import aie_exp
from somatile.model.hccs import hccs_int
from somatile.model.params import HccsParams

VERSAL_BOARDS = [n for n in boards.names() if boards.load(n).kind == "versal"]
GENERATIONS = {"vck190": "AIE", "vek280": "AIE-ML"}


def params_file(tmp_path, name="params.yaml", **changes):
    """Four heads at cols 64: three calibrated (one near each limit of aie4ml's rules), one fallback."""
    d = {"format": "somatile-hccs-params", "version": 1, "cols": 64, "mode": "div", "out": "uint8",
         "B": [255, 511, 64, 200], "S": [6, 1, 0, 3], "dmax": [40, 127, 0, 64], "fallback": [False, False, False, True],
         "scale": [0.1, 0.05, 0.2, 0.0731], "fallback_exp": "aie4ml"}
    d.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def read_parameters_h(project):
    """Per head (through app.cpp's top_graph<...> order and top_graph.h's instance names): the integers and
    flags of its kernel's struct in src/parameters.h."""
    text = (project / "src" / "parameters.h").read_text()
    structs = {m.group(1): m.group(2) for m in re.finditer(r"^struct (L\d+Cfg) \{\n(.*?)^\};", text, re.M | re.S)}
    order = re.search(r"top_graph<([^>]*)> dut;", (project / "app.cpp").read_text()).group(1).replace(" ", "")
    instances = re.findall(r"softmax_hccs_graph<Cfg(\d+)>\s+softmax_h(\d+)_aie;",
                           (project / "src" / "top_graph.h").read_text())
    cfg_names = order.split(",")
    heads = {}
    for slot, head in instances:
        body = structs[cfg_names[int(slot) - 1]]

        def scalar(name):
            return re.search(rf"\b{name} = (-?\w+|\"\w+\");", body).group(1)

        def array(name, ctype):
            values = re.search(rf"static inline {ctype} {name}\[CAS_NUM\] = \{{([^}}]*)\}}", body).group(1)
            return [int(v) for v in values.split(",")]

        heads[int(head)] = {"B": array("B", "int16_t"), "S": array("S", "int8_t"), "Dmax": array("Dmax", "uint8_t"),
                            "cas_num": int(scalar("CAS_NUM")), "rows": int(scalar("ROWS")),
                            "cols": int(scalar("COLS")), "use_clb": scalar("USE_CLB") == "true",
                            "approx_exp": scalar("APPROX_EXP") == "true", "exp_kq": int(scalar("EXP_KQ")),
                            "tiled": scalar("LAYOUT_TILED") == "true",
                            "exp_poly": [int(scalar(n)) for n in ("EXP_A2", "EXP_B1", "EXP_C0", "EXP_ZF")],
                            "rounding": scalar("ROUNDING_TOKEN"), "saturation": scalar("SATURATION_TOKEN"),
                            "output_t": re.search(r"using output_t = (\w+);", body).group(1)}
    return heads


def kernel_choice(project):
    """Per head: aie4ml's execution record (variant, approximation, layout) in aie_pipeline.json."""
    pipeline = json.loads((project / "aie_pipeline.json").read_text())
    return {int(re.fullmatch(r"softmax_h(\d+)_aie", e["node"]).group(1)): e for e in pipeline["execution"]}


def check_project(project, params, printed):
    """Every head of the generated project against the parameter file; returns the manifest's result."""
    heads, choice = read_parameters_h(project), kernel_choice(project)
    manifest = json.loads((project / "manifest.json").read_text())
    result = manifest["result"]
    tiled = result["layout"] == "tiled"  # else the note printed says why the tiled layout was refused
    assert tiled or "aie4ml's tiled layout refused it" in printed
    assert sorted(heads) == sorted(choice) == list(range(params.heads))
    for h in range(params.heads):
        got, kernel = heads[h], choice[h]
        # aie4ml may split a head's rows over several tiles (CAS_NUM kernels of ROWS rows each).
        assert (got["rows"] * got["cas_num"], got["cols"], got["output_t"]) == (
            aie.DEFAULT_ROWS, params.cols, f"{params.out}_t")
        assert got["tiled"] == tiled and kernel["config"]["layout"] == result["layout"]
        assert got["exp_poly"] == [aie_exp.EXP_A2, aie_exp.EXP_B1, aie_exp.EXP_C0, aie_exp.EXP_ZF]
        approximation = "exp" if params.fallback[h] else "hccs"
        assert kernel["variant_id"] == f"softmax.{approximation}.i8{'.tiled' if tiled else ''}.v1"
        assert kernel["config"]["approximation"] == approximation and got["approx_exp"] == params.fallback[h]
        if params.fallback[h]:
            assert got["B"] == got["S"] == got["Dmax"] == [0] * got["cas_num"]
            assert got["exp_kq"] == aie_exp.exp_kq_from_scale(params.scale)[h] == kernel["config"]["exp_kq"]
        else:
            n = got["cas_num"]
            assert (got["B"], got["S"], got["Dmax"]) == ([int(params.B[h])] * n, [int(params.S[h])] * n,
                                                         [int(params.dmax[h])] * n)
            assert got["use_clb"] == (params.mode == "clb") == kernel["config"]["use_clb"]
    assert result["aie4ml"]["version"] == importlib.metadata.version("aie4ml") == "0.2.1"
    assert result["vendor_tools_run"] is False
    assert {"Makefile", "app.cpp", "aie_pipeline.json", "src/parameters.h", "data/logits.npz"} <= set(manifest["files"])
    assert sorted(p.name for p in (project / "data").glob("ifm_c*.txt"))
    check_expected_outputs(project, heads, params)
    return result


@pytest.mark.parametrize("mode", ["div", "clb"])
@pytest.mark.parametrize("board", VERSAL_BOARDS)
def test_generated_project_holds_every_heads_integers_from_the_yaml(tmp_path, capsys, board, mode):
    path = params_file(tmp_path, mode=mode)
    started = time.perf_counter()
    assert cli(["build", "--board", board, "--top", "aie", "--params", str(path), "--out", str(tmp_path)]) == 0
    assert time.perf_counter() - started < 60
    printed = capsys.readouterr().out
    assert "Vitis compiles and runs this project; it is not run here" in printed and "`make all`" in printed
    result = check_project(tmp_path / board / "aie", HccsParams.from_yaml(path), printed)
    assert result["aie4ml"]["generation"] == GENERATIONS[board]
    assert result["aie4ml"]["platform"] == f"xilinx_{board}_base"


def test_a_hybrid_calibrated_for_the_ai_engine_predicts_its_bits_and_becomes_its_project(tmp_path, capsys, rng):
    """calibrate --fallback-exp aie4ml: the file names aie4ml's exp; on the host it predicts aie_exp's bits on the
    fallback heads and HCCS's on the others, and the project built from it holds that choice per head."""
    path = tmp_path / "calibrated.yaml"
    assert cli(["calibrate", "--profile", "paper", "--cols", "64", "--heads", "4", "--threshold", "0.16",
                "--fallback-exp", "aie4ml", "-o", str(path)]) == 0
    assert "fallback_exp: aie4ml" in path.read_text()
    params = HccsParams.from_yaml(path)
    assert params.fallback.any() and not params.fallback.all()  # both kernels in one project
    x = rng.integers(-128, 128, (params.heads, 40, params.cols), dtype=np.int8)
    y = params.apply_int(x)
    for h in range(params.heads):
        want = (aie_exp.aie_exp_softmax(x[h], params.exp_kq[h]) if params.fallback[h] else
                hccs_int(x[h], params.B[h], params.S[h], params.dmax[h], mode=params.mode))
        assert np.array_equal(y[h], want), h
    assert np.array_equal(aie_exp.predict_aie(params, x), y)
    capsys.readouterr()
    assert cli(["build", "--board", "vek280", "--top", "aie", "--params", str(path), "--out", str(tmp_path)]) == 0
    project = tmp_path / "vek280" / "aie"
    check_project(project, params, capsys.readouterr().out)
    kernels = {h: k["config"]["approximation"] for h, k in kernel_choice(project).items()}
    assert kernels == {h: "exp" if params.fallback[h] else "hccs" for h in range(params.heads)}
    manifest = json.loads((project / "manifest.json").read_text())
    assert manifest["result"]["params"]["fallback_exp"] == "aie4ml"


@pytest.mark.parametrize("fallback_exp", [None, "somatile"])
def test_fallback_heads_on_somatiles_exp_are_refused_naming_the_key(tmp_path, capsys, fallback_exp):
    """The AI Engine has only aie4ml's exp: a file whose fallback heads name somatile's (or leave the default)
    would predict bits the project does not return."""
    path = params_file(tmp_path, fallback_exp=fallback_exp)
    if fallback_exp is None:
        text = yaml.safe_load(path.read_text())
        del text["fallback_exp"]
        path.write_text(yaml.safe_dump(text, sort_keys=False))
    assert cli(["build", "--board", "vek280", "--top", "aie", "--params", str(path), "--out", str(tmp_path)]) == 2
    line = one_line_error(capsys)
    assert f"{path}: key 'fallback_exp': 'somatile' for fallback heads [3]" in line
    assert "the AI Engine cannot run somatile's integer exp" in line and "--fallback-exp aie4ml" in line
    # Without fallback heads the choice does not matter.
    path = params_file(tmp_path, fallback_exp="somatile", fallback=[False] * 4)
    assert cli(["build", "--board", "vek280", "--top", "aie", "--params", str(path), "--out", str(tmp_path)]) == 0


def check_expected_outputs(project, heads, params):
    """data/expected.npz against the model run with the integers read back from parameters.h."""
    logits, expected = np.load(project / "data" / "logits.npz"), np.load(project / "data" / "expected.npz")
    assert sorted(logits) == [f"logits_h{h}" for h in range(params.heads)]
    for h, got in heads.items():
        x = logits[f"logits_h{h}"]
        assert x.shape == (aie.ITERATIONS, aie.DEFAULT_ROWS, params.cols) and x.dtype == np.int8
        assert got["rounding"] == '"floor"' and got["saturation"] == '"saturate"'
        if got["approx_exp"]:
            want = aie_exp.aie_exp_softmax(x, got["exp_kq"], out=params.out)
        else:
            want = hccs_int(x, got["B"][0], got["S"][0], got["Dmax"][0], mode="clb" if got["use_clb"] else "div",
                            out=params.out)
        assert np.array_equal(expected[f"probs_h{h}"], want)


def test_an_int16_file_gets_int16_kernels(tmp_path, capsys):
    path = params_file(tmp_path, out="int16", fallback=[False] * 4)
    assert cli(["build", "--board", "vek280", "--top", "aie", "--params", str(path), "--out", str(tmp_path)]) == 0
    check_project(tmp_path / "vek280" / "aie", HccsParams.from_yaml(path), capsys.readouterr().out)


def test_a_row_count_the_tiled_layout_refuses_falls_back_to_linear_and_says_so(tmp_path, capsys):
    path = params_file(tmp_path)
    assert cli(["build", "--board", "vck190", "--top", "aie", "--params", str(path), "--rows", "6",
                "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "rows=6: aie4ml's tiled layout refused it" in printed and "4-row microtile bands" in printed
    assert 'generated with "layout": "linear" instead' in printed
    project = tmp_path / "vck190" / "aie"
    heads, choice = read_parameters_h(project), kernel_choice(project)
    assert all(not h["tiled"] and h["rows"] * h["cas_num"] == 6 for h in heads.values())
    assert {c["variant_id"] for c in choice.values()} == {"softmax.hccs.i8.v1", "softmax.exp.i8.v1"}
    assert json.loads((project / "manifest.json").read_text())["result"]["layout"] == "linear"


def one_line_error(capsys):
    # The build jobs' progress bar shares stderr: its frames end in "]" and are redrawn after carriage returns.
    text = re.sub(r"builds: [^\]]*\]", "", capsys.readouterr().err)
    err = [line for line in re.split(r"[\r\n]", text) if line.strip()]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("board", ["sim", "ulx3s_85f"])
def test_a_board_without_an_ai_engine_is_refused_naming_its_kind(tmp_path, capsys, board):
    path = params_file(tmp_path)
    assert cli(["build", "--board", board, "--top", "aie", "--params", str(path), "--out", str(tmp_path / "o")]) == 2
    line = one_line_error(capsys)
    assert f"board {board}" in line and "key 'kind'" in line and "of kind 'versal'" in line
    assert not (tmp_path / "o").exists()


def test_a_versal_part_aie4ml_does_not_know_is_refused_naming_the_key(tmp_path, capsys):
    board = tmp_path / "other_versal.yaml"
    board.write_text(f"extends: {boards.load('vck190').source}\naie:\n  part: xcvm1802-vsva2197-2MP-e-S\n")
    assert cli(["build", "--board", str(board), "--top", "aie", "--params", str(params_file(tmp_path)),
                "--out", str(tmp_path / "o")]) == 2
    line = one_line_error(capsys)
    assert "key 'aie.part'" in line and "xcvm1802-vsva2197-2MP-e-S" in line and "xilinx_vck190_base" in line


def test_the_aie_top_needs_a_parameter_file(tmp_path, capsys):
    assert cli(["build", "--board", "vck190", "--top", "aie", "--out", str(tmp_path)]) == 2
    assert "--top aie: expected --params FILE" in one_line_error(capsys)


@pytest.mark.parametrize("changes, message", [
    ({"B": [255, 40, 64, 200], "S": [6, 1, 0, 3], "dmax": [40, 40, 0, 64], "allow_zero_floor": True},
     "head 1 (B=40, S=1, dmax=40, cols=64): aie4ml refuses it: HCCS Softmax requires cols * (B - S*Dmax) >= 256"),
    ({"out": "int16"}, "head 3: key 'out': 'int16' with a fallback head"),
    ({"profile": "wide", "normaliser": "hccs", "B": [4096] * 4, "S": [256] * 4, "dmax": [4096] * 4,
      "fallback_exp": "somatile"},
     "key 'profile': the parameters are for profile 'wide', expected 'paper'"),
])
def test_parameters_aie4ml_refuses_are_one_line_naming_the_head_and_rule(tmp_path, capsys, changes, message):
    path = params_file(tmp_path, **changes)
    assert cli(["build", "--board", "vek280", "--top", "aie", "--params", str(path), "--out", str(tmp_path / "o")]) == 2
    line = one_line_error(capsys)
    assert str(path) in line and message in line


def test_a_fallback_scale_beyond_the_exp_kernels_range_names_the_head(tmp_path, capsys):
    path = params_file(tmp_path, scale=[0.5, 0.05, 0.2, 0.5])
    assert cli(["build", "--board", "vck190", "--top", "aie", "--params", str(path), "--out", str(tmp_path)]) == 2
    line = one_line_error(capsys)
    assert f"{path}: scale: head 3 scale 0.5 gives KQ = 185, outside 1..128" in line


def test_rows_neither_layout_takes_name_both_refusals(tmp_path, capsys):
    path = params_file(tmp_path, cols=48, B=[255, 511, 64, 200], S=[6, 1, 0, 3], dmax=[40, 100, 0, 64])
    assert cli(["build", "--board", "vek280", "--top", "aie", "--params", str(path), "--rows", "6",
                "--out", str(tmp_path)]) == 1
    line = one_line_error(capsys)
    assert "aie4ml cannot build the normaliser for rows=6: the tiled layout refused it (" in line
    assert "4-row microtile bands" in line and "the linear layout too: " in line
    assert "softmax axis length 48 must be a multiple of vec_size=32" in line


def test_cost_rows_put_aie4mls_estimate_beside_the_pl_unit_in_the_reports(tmp_path):
    path = params_file(tmp_path, mode="clb", fallback=[False, False, True, True])
    report = tmp_path / "summary.md"
    assert cli(["build", "--board", "vek280", "--top", "aie", "--params", str(path), "--out", str(tmp_path),
                "--report", str(report)]) == 0
    project = tmp_path / "vek280" / "aie"
    cost = json.loads((project / "manifest.json").read_text())["result"]["cost"]
    assert [row["head"] for row in cost] == [0, 1, 2, 3]
    for row in cost:
        assert row["aie_cycles_per_row"] == round(row["aie_cycles"] / aie.DEFAULT_ROWS, 1)
        assert (row["pl_cycles"] is None) == (row["head"] >= 2)  # the PL HCCS unit has no exponential
    # aie4ml's source gives 545 cycles measured for a 16x64 int8 CLB HCCS call on one AIE-ML tile.
    hccs = [row for row in cost if row["kernel"] == "softmax.hccs.i8.tiled.v1" and row["aie_tiles"] == 1]
    assert hccs and all(abs(row["aie_cycles"] - 545) <= 0.1 * 545 for row in hccs)
    assert all(row["pl_cycles"] > 0 and row["pl_elements_per_cycle"] <= boards.load("vek280").hccs_lanes
               for row in cost[:2])
    for text in ((project / "report.md").read_text(), report.read_text()):
        assert "| head | node | aie4ml kernel | AIE tiles |" in text
        assert all(f"| {h} | softmax_h{h}_aie | softmax." in text for h in range(4))


@pytest.mark.parametrize("board", VERSAL_BOARDS)
def test_the_processing_system_firmware_cross_builds_for_the_cortex_r5f(tmp_path, board):
    """make -C firmware versal: the core with hal/versal/ for the RPU, warnings as errors (the Makefile's WARN),
    an ARM hard-float image whose sections land in the ATCM, the BTCM and the on-chip memory."""
    import shutil
    import subprocess

    assert shutil.which("arm-none-eabi-gcc"), ("Debian's gcc-arm-none-eabi and libnewlib-arm-none-eabi build the "
                                               "Versal firmware: apt-get install gcc-arm-none-eabi "
                                               "libnewlib-arm-none-eabi (.ci/run does)")
    from somatile.host.transport_firmware import firmware_make

    build = tmp_path / "fw"
    made = firmware_make("versal", f"BOARD={board}", f"BUILD={build}")
    assert made.returncode == 0, made.stderr[-3000:]
    elf = build / "versal" / "firmware.elf"
    header = subprocess.run(["arm-none-eabi-readelf", "-h", str(elf)], check=True, capture_output=True,
                            text=True).stdout
    assert "Machine:                           ARM" in header and "hard-float ABI" in header
    sections = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in
                re.finditer(r"^(\.\w+)\s+(\d+)\s+(\d+)$", (build / "versal" / "size.txt").read_text(), re.M)}
    regions = {".vectors": (0, 64 << 10), ".text": (0, 64 << 10), ".rodata": (0, 64 << 10),
               ".bss": (0x20000, 0x30000), ".dma": (0xFFFC0000, 0xFFFF0000)}
    for name, (lo, hi) in regions.items():
        size, address = sections[name]
        assert lo <= address and address + size <= hi, f"{name} at {address:#x}+{size} outside {lo:#x}..{hi:#x}"
    assert sections[".vectors"][1] == 0 and sections[".text"][0] > 1000
    print(f"{board}: Cortex-R5F firmware {sum(sections[s][0] for s in ('.vectors', '.text', '.rodata'))} B code, "
          f"{sections['.bss'][0]} B data, {sections['.dma'][0]} B DMA buffers")


def test_the_near_field_of_a_decode_step_is_generated_for_the_calibrated_heads(tmp_path, capsys):
    board = "vek280"
    path = params_file(tmp_path)  # cols 64: sinks 4 + ring 60
    assert cli(["build", "--board", board, "--top", "aie-near", "--params", str(path), "--set", "ring=60",
                "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "The near field of one decode step on the AI Engine" in printed and "stay on the PL tile" in printed
    params = HccsParams.from_yaml(path)
    project = tmp_path / board / "aie-near-ring60"
    heads = read_parameters_h(project)
    calibrated = [h for h in range(params.heads) if not params.fallback[h]]
    assert sorted(heads) == calibrated  # the fallback head's near field stays on the PL tile
    for h in calibrated:
        n = heads[h]["cas_num"]
        assert (heads[h]["B"], heads[h]["S"], heads[h]["Dmax"]) == ([int(params.B[h])] * n,
                                                                    [int(params.S[h])] * n, [int(params.dmax[h])] * n)
        assert (heads[h]["rows"], heads[h]["cols"], heads[h]["output_t"]) == (1, 64, "int16_t")
    execution = json.loads((project / "aie_pipeline.json").read_text())["execution"]
    assert [(e["node"], e["op_type"]) for e in execution if e["node"].endswith("h0_aie")] == [
        ("qk_h0_aie", "matmul"), ("softmax_h0_aie", "softmax"), ("pv_h0_aie", "matmul")]
    inputs = np.load(project / "data" / "inputs.npz")
    assert inputs["kt_h0"].shape == (aie.ITERATIONS, boards.load(board).head_dim, 64)
    assert sorted(p.name for p in (project / "data").glob("ifm_c*.txt"))
    result = json.loads((project / "manifest.json").read_text())["result"]
    assert result["top"] == "aie-near" and result["slots"] == 64 and result["near_heads"] == calibrated
    assert result["head_dim"] == boards.load(board).head_dim
    assert {row["node"] for row in result["cost"]} == {f"{k}_h{h}_aie" for h in calibrated
                                                       for k in ("qk", "softmax", "pv")}


def test_a_near_field_whose_slots_are_not_the_calibrated_row_length_names_the_keys(tmp_path, capsys):
    path = params_file(tmp_path)
    assert cli(["build", "--board", "vek280", "--top", "aie-near", "--params", str(path), "--out", str(tmp_path)]) == 1
    line = one_line_error(capsys)
    assert "key 'cols': 64, the board vek280's near field has sinks + ring = 4 + 64 = 68 slots" in line
    assert "--set ring=60" in line


def test_aie4ml_cannot_chain_the_near_field_on_the_first_generation_ai_engine(tmp_path, capsys):
    # The scores leave q.K^T in another order than the Softmax reads; AIE-ML re-lays them out in a memory tile,
    # the VC1902 has none (aie4ml 0.2.1).
    path = params_file(tmp_path)
    assert cli(["build", "--board", "vck190", "--top", "aie-near", "--params", str(path), "--set", "ring=60",
                "--out", str(tmp_path)]) == 1
    line = one_line_error(capsys)
    assert "head 0: aie4ml cannot build the near field for rows=1" in line
    assert "cannot connect directly" in line and "the device has no memory tile" in line
