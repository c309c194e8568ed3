"""`somatile compare`: the report's numbers, the files it writes, and its errors on bad input."""

import argparse
import re
import json

import numpy as np
import pytest

from somatile.model import compare, hccs, intexp, quant, synth
from somatile.model.logits import load_npz
from somatile.model.params import HccsParams


@pytest.fixture(scope="module")
def small_report():
    logits, mask, _ = synth.synthetic_logits(4, 150, 48, peaked=2, seed=1, padding=True)
    values = np.random.default_rng(2).normal(size=(4, 48, 8))
    return logits, mask, values, compare.compare(logits, mask, values)


def test_report_methods_and_metrics(small_report):
    logits, mask, values, report = small_report
    assert set(report["summary"]) == set(compare.METHODS)
    for ph in report["heads"]:
        m = ph["methods"]
        assert m["int8_div"]["rowsum_max"] <= 1.0 and m["hccs_float"]["rowsum_min"] > 1 - 1e-12
        assert m["intexp"]["rowsum_max"] <= 1.0
        for name in compare.METHODS:
            assert 0 <= m[name]["tv"] <= 1 and 0 <= m[name]["top1"] <= 1 and m[name]["out_err"] >= 0
    # clb divides by a power of two at or below the row sum: rows are not normalised.
    assert max(ph["methods"]["int8_clb"]["rowsum_max"] for ph in report["heads"]) > 1.2
    # The exponential keeps the peaked heads that the integer HCCS cannot follow.
    assert all(ph["methods"]["intexp"]["tv"] < ph["methods"]["int8_div"]["tv"] for ph in report["heads"][:2])


def test_report_outputs_are_the_kernels(small_report):
    logits, mask, _, report = small_report
    params = report["params"]
    xq = quant.quantize_logits(logits, params.scale, mask)
    div = hccs.hccs_int(xq, params.B, params.S, params.dmax, mask=mask)
    assert np.array_equal(report["outputs"]["int8_div"], div / 255.0)
    fb = params.fallback
    deployed = report["outputs"]["deployed"]
    assert np.array_equal(deployed[~fb], div[~fb] / 255.0)
    if fb.any():
        assert np.array_equal(deployed[fb], intexp.intexp_softmax(xq[fb], params.exp_mult[fb], mask=mask[fb]) / 255.0)
    q = hccs.softmax(logits, mask)
    tv = 0.5 * np.abs(report["outputs"]["int8_div"][0] - q[0]).sum(-1)
    rows = mask[0].any(-1)
    assert np.isclose(report["heads"][0]["methods"]["int8_div"]["tv"], tv[rows].mean(), rtol=1e-12)


def run_cli(argv):
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    return compare.run(parser.parse_args(argv))


@pytest.mark.parametrize("profile,method,normaliser", [("paper", "int8_div", "hccs"), ("wide", "wide_pwl2", "pwl2"),
                                                      ("wide", "wide_hccs", "hccs")])
def test_cli_on_an_npz_writes_json_plots_and_params(tmp_path, capsys, profile, method, normaliser):
    logits, mask, _ = synth.synthetic_logits(3, 80, 32, peaked=1, seed=4, padding=True)
    values = np.random.default_rng(0).normal(size=(3, 32, 4)).astype(np.float32)
    path = tmp_path / "in.npz"
    np.savez(path, logits=np.where(mask, logits, -np.inf).astype(np.float32), mask=mask, values=values)
    out = tmp_path / "out"
    extra = [] if profile == "wide" and normaliser == "pwl2" else ["--profile", profile, "--normaliser", normaliser]
    assert run_cli(["--logits", str(path), "--out", str(out), "--save-params", str(out / "p.yaml")] + extra) == 0
    text = capsys.readouterr().out
    assert method in text and "mean over heads" in text
    report = json.loads((out / "compare.json").read_text())
    assert len(report["heads"]) == 3 and "out_err" in report["summary"][method]
    assert report["profile"] == profile and report["normaliser"] == normaliser
    for png in ("tv_per_head.png", "row_sums.png", "example_rows.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    params = HccsParams.from_yaml(out / "p.yaml", profile=profile)
    assert params.heads == 3 and params.profile == profile and params.normaliser == normaliser
    other = "paper" if profile == "wide" else "wide"
    with pytest.raises(ValueError, match=f"key 'profile': the parameters are for profile '{profile}', "
                                         f"expected '{other}'"):
        HccsParams.from_yaml(out / "p.yaml", profile=other)
    if profile == "wide":
        # The wide integers on int16 logits stay within Q15 rounding and pwl2's 0.4 % per weight of the float
        # family they represent, so their distance from softmax is the family's; pwl2 is close to softmax.
        summary = report["summary"]
        assert abs(summary["deployed"]["tv"] - summary["deployed_float"]["tv"]) < 0.005
        if normaliser == "pwl2":
            assert summary["deployed"]["tv"] < 0.01


def test_cli_profile_errors(capsys):
    assert run_cli(["--rows", "20", "--profile", "paper", "--normaliser", "pwl2"]) == 2
    assert "--normaliser: expected 'hccs' in profile 'paper'" in capsys.readouterr().out
    assert run_cli(["--rows", "20", "--objective", "kl_seed"]) == 2
    assert "--objective: expected one of ('output', 'tv') in profile 'wide'" in capsys.readouterr().out


@pytest.mark.parametrize("arrays,message", [
    (dict(scores=np.zeros((2, 3, 4), np.float32)), "missing array 'logits'"),
    (dict(logits=np.zeros((3, 4), np.float32)), r"'logits' must be float or int8 \(H, R, N\)"),
    (dict(logits=np.zeros((2, 3, 4), np.int16)), r"'logits' must be float or int8 \(H, R, N\), got int16"),
    (dict(logits=np.zeros((2, 3, 4), np.int8)), r"int8 'logits' need 'scale' float \(2,\)"),
    (dict(logits=np.zeros((2, 3, 4), np.int8), scale=np.array([0.1, -1.0])), "'scale' must be finite and positive"),
    (dict(logits=np.zeros((2, 3, 4), np.float32), scale=np.ones(2)), "'scale' goes with int8 'logits' only"),
    (dict(logits=np.full((2, 3, 4), np.nan, np.float32)), "non-finite value nan"),
    (dict(logits=np.zeros((2, 3, 0), np.float32)), "rows are empty"),
    (dict(logits=np.zeros((2, 3, 4), np.float32), mask=np.ones((2, 3, 5), bool)), "mask: expected the shape"),
    (dict(logits=np.zeros((2, 3, 4), np.float32), values=np.zeros((2, 5, 8))), r"'values' must be float \(H, N, D\)"),
    (dict(logits=np.zeros((2, 3, 4), np.float32), extra=np.zeros(1)), "unknown array 'extra'"),
    (dict(logits=np.zeros((0, 3, 4), np.float32)), "'logits' has no heads"),
    (dict(logits=np.zeros((2, 3, 4), np.float32), mask=np.zeros((2, 3, 4), bool)), "'mask' is False everywhere"),
    (dict(logits=np.array([[[object()]]], object)), "not a readable .npz file"),
])
def test_cli_bad_input_names_file_and_array(tmp_path, capsys, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    assert run_cli(["--logits", str(path), "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    text = capsys.readouterr().out
    assert str(path) in text
    assert re.search(message, text), text


def test_cli_missing_file(tmp_path, capsys):
    assert run_cli(["--logits", str(tmp_path / "none.npz"), "--no-plots"]) == 2
    assert "no such file" in capsys.readouterr().out


def test_int8_logits_with_scale_calibrate_with_that_scale(tmp_path):
    """Quantised logits after QAT: the file's int8 values and scale are used as they are."""
    logits, _, _ = synth.synthetic_logits(3, 60, 32, peaked=1, seed=5)
    scale = np.array([0.11, 0.07, 0.05])
    xq = quant.quantize_logits(logits, scale)
    path = tmp_path / "q.npz"
    np.savez(path, logits=xq, scale=scale)
    data = load_npz(path)
    assert np.array_equal(data.scale, scale)
    report = compare.compare(data.logits, data.mask, scale=data.scale)
    params = report["params"]
    assert np.array_equal(params.scale, scale)
    div = hccs.hccs_int(xq, params.B, params.S, params.dmax)
    assert np.array_equal(report["outputs"]["int8_div"], div / 255.0)


def test_cli_refuses_an_npz_declaring_a_huge_array(tmp_path, capsys):
    """The size is read from the .npy header before anything is loaded: a 1 KB file declaring 10^12 floats."""
    import io
    import zipfile
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (1000, 1000, 1000000)})
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("logits.npy", header.getvalue() + b"\0" * 64)
    assert run_cli(["--logits", str(path), "--no-plots"]) == 2
    assert "declares shape (1000, 1000, 1000000)" in capsys.readouterr().out


def test_save_params_with_fallback_exp_aie4ml_writes_the_key_and_the_hybrid_runs_that_exp(tmp_path, capsys):
    """compare --fallback-exp aie4ml --save-params: the file names aie4ml's exp like calibrate's, compare's
    deployed hybrid is aie_exp's integers on the fallback heads and HCCS's on the others, and the saved file
    predicts the same integers."""
    from somatile.model.aie_exp import aie_exp_softmax

    logits, _, _ = synth.synthetic_logits(4, 80, 64, peaked=1, seed=3)
    path = tmp_path / "in.npz"
    np.savez(path, logits=logits.astype(np.float32))
    saved, out = tmp_path / "p.yaml", tmp_path / "out"
    argv = ["--logits", str(path), "--profile", "paper", "--threshold", "0.16", "--fallback-exp", "aie4ml",
            "--out", str(out), "--save-params", str(saved), "--no-plots"]
    assert run_cli(argv) == 0
    assert "fallback heads on aie4ml's integer exp" in capsys.readouterr().out
    assert "fallback_exp: aie4ml" in saved.read_text()
    params = HccsParams.from_yaml(saved)
    assert params.fallback_exp == "aie4ml" and params.fallback.any() and not params.fallback.all()
    summary = json.loads((out / "compare.json").read_text())
    assert summary["fallback_exp"] == summary["params"]["fallback_exp"] == "aie4ml"

    data = load_npz(path)
    report = compare.compare(data.logits, data.mask, scale=data.scale, threshold=0.16, fallback_exp="aie4ml")
    assert report["params"].to_dict() == params.to_dict()
    xq = quant.quantize_logits(data.logits, params.scale, data.mask)
    y = params.apply_int(xq)
    for h in range(params.heads):
        want = (aie_exp_softmax(xq[h], params.exp_kq[h]) if params.fallback[h] else
                hccs.hccs_int(xq[h], params.B[h], params.S[h], params.dmax[h], mode=params.mode))
        assert np.array_equal(y[h], want), h
    assert np.array_equal(report["outputs"]["deployed"], y / 255.0)
    fb = params.fallback
    # somatile's exp gives other integers on these heads: the file's choice is what makes the prediction.
    assert not np.array_equal(intexp.intexp_softmax(xq[fb], params.exp_mult[fb]), y[fb])
    default = compare.compare(data.logits, data.mask, scale=data.scale, threshold=0.16)
    assert default["fallback_exp"] == "somatile"
    assert np.array_equal(default["outputs"]["deployed"][fb],
                          intexp.intexp_softmax(xq[fb], params.exp_mult[fb]) / 255.0)


def test_a_bad_fallback_exp_is_one_line_naming_the_option_and_the_choices(capsys):
    from somatile.host.cli import main as cli

    with pytest.raises(SystemExit) as info:
        cli(["compare", "--rows", "20", "--fallback-exp", "intexp"])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "somatile compare: error: argument --fallback-exp: invalid choice: 'intexp' (choose from 'somatile', "
        "'aie4ml')")
    # aie4ml's kernel takes int8 logits: the wide profile (the default) refuses it before calibrating.
    assert run_cli(["--rows", "20", "--fallback-exp", "aie4ml", "--no-plots"]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["somatile compare: --fallback-exp aie4ml: needs --profile paper (aie4ml's exact-exp kernel "
                     "takes int8 logits)"]
    logits, _, _ = synth.synthetic_logits(2, 20, 16, seed=0)
    with pytest.raises(ValueError, match=r"^fallback_exp: expected one of \['somatile', 'aie4ml'\], got 'intexp'$"):
        compare.compare(logits, profile="paper", fallback_exp="intexp")
    with pytest.raises(ValueError, match="^fallback_exp: 'aie4ml' needs profile 'paper'"):
        compare.compare(logits, profile="wide", fallback_exp="aie4ml")
