"""`somatile eval onnx`: the graph cut against onnxruntime, the integer normalisers on the MiniLM export, the
calibration split and the perplexity of a synthetic causal LM (issue 26)."""

import json

import numpy as np
import pytest

from somatile.eval import text as textmod
from somatile.eval.onnx_eval import SOFTMAX_TOLERANCE
from somatile.eval.onnx_minilm import batch_inputs, export_minilm
from somatile.host.cli import main
from somatile.model.minilm import MiniLM

from tests.eval.test_onnx import tiny_decoder


@pytest.fixture(scope="module")
def minilm():
    return MiniLM.load()


@pytest.fixture(scope="module")
def minilm_files(minilm, tmp_path_factory):
    """The MiniLM export and two disjoint inputs files: 12 evaluation and 4 calibration sentences of the
    committed text (the harness's sentence pool, different lengths, so that padding takes part)."""
    folder = tmp_path_factory.mktemp("onnx_eval")
    pool = [s for s in textmod.sentences(textmod.load_text(), 16)]
    np.savez(folder / "eval.npz", **batch_inputs(minilm, pool[:12]))
    np.savez(folder / "cal.npz", **batch_inputs(minilm, pool[12:]))
    return export_minilm(folder / "minilm.onnx", minilm), folder / "eval.npz", folder / "cal.npz"


def run_eval(args, out):
    assert main(["eval", "onnx", "--out", str(out)] + args) == 0
    return json.loads((out / "results.json").read_text())


def test_minilm_through_the_cut(minilm_files, tmp_path):
    model, eval_npz, cal_npz = minilm_files
    r = run_eval(["--onnx", str(model), "--inputs", str(eval_npz), "--calibrate-inputs", str(cal_npz),
                  "--variants", "softmax", "wide_exp", "int_exp", "--cols", "128"], tmp_path / "out")
    assert r["n_eval"] == 12 and r["n_calibration"] == 4 and r["layers"] == 6 and r["heads"] == 12
    # Exact softmax through the cut reproduces onnxruntime's run within SOFTMAX_TOLERANCE of the largest |value|
    # (measured 6.4e-7 on last_hidden_state, 6.1e-7 on sentence_embedding: float64 softmax rounded to float32).
    for name, check in r["softmax_check"].items():
        assert check["max_abs_diff"] <= SOFTMAX_TOLERANCE * check["max_abs"], (name, check)
    assert r["variants"]["softmax"]["outputs"]["sentence_embedding"]["cos_min"] >= 1 - 1e-9
    # docs/results.md: on 256 sentences the wide integer exp gives a mean cosine 1.000000 (its target >= 0.999)
    # and the paper profile's integer exp 0.998390; the harness's own test holds the latter to > 0.99.
    wide = r["variants"]["wide_exp"]["outputs"]
    assert wide["sentence_embedding"]["cos_mean"] >= 0.999, wide
    assert wide["last_hidden_state"]["pooled_cos_mean"] >= 0.999, wide
    assert r["variants"]["int_exp"]["outputs"]["sentence_embedding"]["cos_mean"] > 0.99
    assert "| wide_exp | sentence_embedding |" in (tmp_path / "out" / "results.md").read_text()


def test_overlapping_calibration_is_refused(minilm, minilm_files, tmp_path, capsys):
    model, eval_npz, _ = minilm_files
    # One evaluation sentence, padded to another length: the same row for the check.
    pool = textmod.sentences(textmod.load_text(), 16)
    overlap = tmp_path / "overlap.npz"
    np.savez(overlap, **batch_inputs(minilm, [pool[13], pool[3]]))
    code = main(["eval", "onnx", "--onnx", str(model), "--inputs", str(eval_npz), "--calibrate-inputs",
                 str(overlap), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "overlap.npz: row 1 is row 3 of the evaluation inputs" in err, err


def word_tokenizer(path, words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]"] + words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def test_causal_lm_perplexity(tmp_path):
    pytest.importorskip("tokenizers", reason="--tokenizer needs the tokenizers package (the MiniLM wheel's)")
    rng = np.random.default_rng(5)
    text = textmod.load_text()[:3000]
    words = sorted(set(textmod.sentences(text, None)[0].split() + text.split()[:150]))
    tokenizer = word_tokenizer(tmp_path / "tokenizer.json", words)
    (tmp_path / "text.txt").write_text(text)
    C, heads, D, V = 16, 2, 8, len(words) + 1
    weights = [tuple((rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)
                     for shape in ((C, heads * D), (C, D), (C, D), (heads * D, C))) for _ in range(2)]
    lm = (rng.normal(size=(V, C)).astype(np.float32), (rng.normal(size=(C, V)) / (2 * np.sqrt(C))).astype(np.float32))
    model = tiny_decoder(tmp_path / "lm.onnx", weights, heads=heads, head_dim=D, lm=lm)
    r = run_eval(["--onnx", str(model), "--text", str(tmp_path / "text.txt"), "--tokenizer", str(tokenizer),
                  "--window", "24", "--calibration-rows", "4", "--variants", "softmax", "wide_exp", "hccs"],
                 tmp_path / "out")
    out = {k: v["outputs"]["logits"] for k, v in r["variants"].items()}
    ref = out["softmax"]["reference_perplexity"]
    assert np.isfinite(ref) and ref > 1 and abs(out["softmax"]["perplexity"] / ref - 1) < 1e-6, out["softmax"]
    # The wide integer exp against softmax: docs/results.md's target for SmolLM2 is <= 1.02x.
    assert abs(out["wide_exp"]["perplexity"] / ref - 1) <= 0.02, out["wide_exp"]
    assert out["wide_exp"]["top1_agreement"] > out["hccs"]["top1_agreement"] - 1e-12
    assert out["hccs"]["perplexity"] != ref   # HCCS is a different normaliser: it must move the result
    # The same windows as arrays: --causal gives the perplexity without --window.
    from somatile.eval.onnx_capture import text_inputs
    import onnx
    np.savez(tmp_path / "windows.npz", **text_inputs(onnx.load(str(model)), tmp_path / "text.txt", tokenizer, window=24))
    again = run_eval(["--onnx", str(model), "--inputs", str(tmp_path / "windows.npz"), "--causal",
                      "--calibration-rows", "4", "--variants", "softmax"], tmp_path / "again")
    assert again["variants"]["softmax"]["outputs"]["logits"]["reference_perplexity"] == ref


def test_same_cosines_as_the_numpy_harness(minilm, minilm_files):
    # somatile eval minilm's own calibration and normalisers through the cut give, against onnxruntime's run,
    # the cosines the numpy forward pass gives with the same normaliser against its float64 softmax.
    import onnx
    import onnxruntime as ort

    from somatile.eval.minilm import (MINILM_COLS, calibrate_minilm, collect_minilm_logits, embedding_agreement,
                                      minilm_normalisers)
    from somatile.eval.onnx_capture import find_attention
    from somatile.eval.onnx_eval import SoftmaxCut, by_mask_blocks
    model_path, _, _ = minilm_files
    pool = textmod.sentences(textmod.load_text(), 9)
    eval_sents, cal_sents = pool[:6], pool[6:]
    normalisers = minilm_normalisers(calibrate_minilm(collect_minilm_logits(minilm, cal_sents, MINILM_COLS)),
                                     MINILM_COLS)
    model = onnx.load(str(model_path))
    cut = SoftmaxCut(model, find_attention(model))
    inputs = batch_inputs(minilm, eval_sents)   # padded: the cut's per-item key blocks take part
    onnx_ref = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(
        ["sentence_embedding"], inputs)[0]
    numpy_ref = minilm.embed(eval_sents)
    for name in ("integer exp everywhere", "float HCCS"):
        f = normalisers[name]
        ours = embedding_agreement(onnx_ref, cut.run(inputs, lambda layer, scores: by_mask_blocks(f, layer, scores))
                                   ["sentence_embedding"])["cosines"]
        harness = embedding_agreement(numpy_ref, minilm.embed(eval_sents, normaliser=f))["cosines"]
        # Float32 graph against the float64 pass: measured at most 1.6e-6 apart (8 sentences, integer exp);
        # an int8 logit rounded the other way in one head moves a cosine by about that much, a misplaced block
        # or a key left in by 1e-3 and more.
        assert np.abs(np.array(ours) - harness).max() <= 1e-5, (name, ours, harness)


def parallel_attention(path):
    """Two attention branches whose scores (x and 2 x) are both computed before the first Softmax:
    out = softmax(x) @ v + softmax(2 x) @ v, inputs x (2, 3, 4, 5) and v (2, 3, 5, 2)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"], name="scores2"),
             helper.make_node("Identity", ["x"], ["x1"], name="scores1"),
             helper.make_node("Softmax", ["x1"], ["p1"], name="softmax1", axis=-1),
             helper.make_node("MatMul", ["p1", "v"], ["o1"], name="ctx1"),
             helper.make_node("Softmax", ["x2"], ["p2"], name="softmax2", axis=-1),
             helper.make_node("MatMul", ["p2", "v"], ["o2"], name="ctx2"),
             helper.make_node("Add", ["o1", "o2"], ["out"], name="out")]
    graph = helper.make_graph(
        nodes, "parallel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5]),
                            helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 3, 5, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.float32(2), "two")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_cut_when_scores_come_before_an_earlier_softmax(tmp_path):
    # The second layer's scores are computed in the first segment: the cut must keep them until its Softmax.
    import onnx
    import onnxruntime as ort

    from somatile.eval.onnx_capture import find_attention
    from somatile.eval.onnx_eval import SoftmaxCut, by_mask_blocks, float_softmax
    path = parallel_attention(tmp_path / "parallel.onnx")
    rng = np.random.default_rng(2)
    inputs = {"x": rng.normal(size=(2, 3, 4, 5)).astype(np.float32), "v": rng.normal(size=(2, 3, 5, 2)).astype(np.float32)}
    inputs["x"][1, :, :, 3:] = -np.inf   # item 1 attends over its first 3 keys only
    model = onnx.load(str(path))
    out = SoftmaxCut(model, find_attention(model)).run(
        inputs, lambda layer, scores: by_mask_blocks(float_softmax, layer, scores))["out"]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["out"], inputs)[0]
    # Float64 softmax rounded to float32 against onnxruntime's float32 (outputs of size ~2): a few ulps.
    assert np.abs(out - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("extra, expected", [
    (["--variants", "softmax", "int8"], "--variants: unknown 'int8'"),
    (["--calibration-rows", "2"], "--calibration-rows: expected 1..1 of the 2 rows"),
    (["--calibration-rows", "1", "--calibrate-inputs", "CAL"], "does not go with --calibrate-inputs"),
])
def test_bad_eval_options(tmp_path, capsys, extra, expected):
    path = parallel_attention(tmp_path / "parallel.onnx")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.zeros((2, 3, 4, 5), np.float32), v=np.zeros((2, 3, 5, 2), np.float32))
    extra = [str(inputs) if e == "CAL" else e for e in extra]
    code = main(["eval", "onnx", "--onnx", str(path), "--inputs", str(inputs), "--out", str(tmp_path / "o")] + extra)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and expected in err, err
