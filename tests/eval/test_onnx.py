"""ONNX: the all-MiniLM-L6-v2 exporter against the numpy forward pass, and `somatile capture` on that graph
(issue 26)."""

import numpy as np
import pytest

from somatile.model.minilm import MiniLM
from somatile.eval.onnx_minilm import batch_inputs, export_minilm

# Different lengths, so that a batch of them pads and the graph's key mask takes part.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention at the edge: a softmax without exp, calibrated per head on real logits.",
    "Hi",
]


def cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def minilm():
    return MiniLM.load()


@pytest.fixture(scope="module")
def minilm_onnx(minilm, tmp_path_factory):
    return export_minilm(tmp_path_factory.mktemp("onnx") / "minilm.onnx", minilm)


def run_graph(path, inputs):
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def test_exported_minilm_matches_the_numpy_pass(minilm, minilm_onnx):
    # The graph runs in float32 (unit roundoff 6e-8), the numpy pass in float64. Measured: hidden states within
    # a relative 3e-7 of the reference, cosines within 5e-13 of 1. 0.999999 (the bar) leaves orders of
    # magnitude for rounding and still fails on any wrong operator (a tanh GELU, a wrong LayerNorm eps or a
    # missing bias each cost 1e-5 or more).
    out = run_graph(minilm_onnx, batch_inputs(minilm, SENTENCES))
    emb_cos = cosine(out["sentence_embedding"], minilm.embed(SENTENCES))
    assert emb_cos.min() >= 0.999999, emb_cos
    for b, sentence in enumerate(SENTENCES):
        ref = minilm.hidden_states(minilm.encode(sentence))
        token_cos = cosine(out["last_hidden_state"][b, :len(ref)], ref)
        assert token_cos.min() >= 0.999999, (b, token_cos.min())


def test_padding_does_not_change_a_sentence(minilm, minilm_onnx):
    # Alone or padded in a batch, the real tokens see the same keys: the additive mask removes the padding.
    alone = run_graph(minilm_onnx, batch_inputs(minilm, SENTENCES[2:]))["sentence_embedding"][0]
    padded = run_graph(minilm_onnx, batch_inputs(minilm, SENTENCES))["sentence_embedding"][2]
    assert cosine(alone, padded) >= 0.999999


def numpy_layers(minilm, sentence):
    """Per layer the numpy pass's logits (H, T, T) and values (H, T, D) of one sentence."""
    logits, values = {}, {}
    minilm.hidden_states(minilm.encode(sentence), logits_hook=lambda i, x, m: logits.__setitem__(i, x),
                         values_hook=lambda i, v: values.__setitem__(i, v))
    return logits, values


def test_capture_gives_the_numpy_logits_and_the_padding_mask(minilm, minilm_onnx):
    # Float32 graph against the float64 pass: measured max |difference| at most 9.2e-7 of the layer's largest
    # |logit| (about 8 float32 ulps after six layers). The bound 1e-5 of the largest (about 80 ulps) stays
    # within float32 rounding and fails on any real change of the scores (a wrong scale costs 1e-1).
    from somatile.eval.onnx_capture import capture
    inputs = batch_inputs(minilm, SENTENCES)
    T = inputs["input_ids"].shape[1]
    opset, layers = capture(minilm_onnx, inputs)
    assert opset == 17 and len(layers) == minilm.n_layers
    assert all("values" not in layer for layer in layers), "a batch of 3 has no single set of values"
    for b, sentence in enumerate(SENTENCES):
        n = len(minilm.encode(sentence))
        ref_logits, _ = numpy_layers(minilm, sentence)
        for i, layer in enumerate(layers):
            assert layer["logits"].dtype == np.float32 and layer["logits"].shape == (minilm.n_heads, 3 * T, T)
            rows = slice(b * T, b * T + n)
            mask = layer["mask"][:, rows]
            assert mask[:, :, :n].all() and not mask[:, :, n:].any(), (b, i)
            ref = ref_logits[i]
            err = np.abs(layer["logits"][:, rows, :n] - ref).max()
            assert err <= 1e-5 * np.abs(ref).max(), (b, i, err, np.abs(ref).max())


def test_captured_layer_loads_and_calibrates(minilm, minilm_onnx, tmp_path, capsys):
    from somatile.host.cli import main
    from somatile.model.logits import load_npz
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, **batch_inputs(minilm, SENTENCES[1:2]))
    out = tmp_path / "capture"
    assert main(["capture", "--onnx", str(minilm_onnx), "--inputs", str(inputs), "--out", str(out)]) == 0
    index = __import__("json").loads((out / "index.json").read_text())
    assert [e["file"] for e in index["layers"]] == [f"layer{i}.npz" for i in range(minilm.n_layers)]
    assert all(e["has_values"] and e["head_dim"] == minilm.head_dim for e in index["layers"])
    ref_logits, ref_values = numpy_layers(minilm, SENTENCES[1])
    data = load_npz(out / "layer3.npz")
    assert data.mask.all() and data.values.shape == ref_values[3].shape
    # Float32 values against float64 (measured 9.0e-7 of the largest |value|); bound as for the logits.
    assert np.abs(data.values - ref_values[3]).max() <= 1e-5 * np.abs(ref_values[3]).max()
    params_file = tmp_path / "params.yaml"
    assert main(["calibrate", "--logits", str(out / "layer3.npz"), "-o", str(params_file)]) == 0
    text = capsys.readouterr().out
    assert "profile wide, pwl2, objective output" in text, text
    from somatile.model.params import HccsParams
    assert HccsParams.from_yaml(params_file, profile="wide").heads == minilm.n_heads


def tiny_attention(path, *, opset=17, axis=-1, consumer="MatMul"):
    """A one-layer attention graph: Softmax(scores) @ values, scores (1, 2, 3, 4) and values (1, 2, 4, 5)
    as graph inputs."""
    import onnx
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Softmax", ["scores"], ["probs"], name="attn_softmax", axis=axis),
             helper.make_node(consumer, ["probs", "values"] if consumer == "MatMul" else ["probs"], ["out"])]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, 3, 4]),
         helper.make_tensor_value_info("values", TensorProto.FLOAT, [1, 2, 4, 5])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def test_additive_mask_threshold(tmp_path):
    # -inf, float32 min, -1e9 and -2e4 are masks; -5e3 is a (very negative) logit that takes part.
    from somatile.eval.onnx_capture import capture
    scores = np.zeros((1, 2, 3, 4), np.float32)
    scores[0, 0, 0] = [-np.inf, np.finfo(np.float32).min, 1.5, -1e9]
    scores[0, 1, 2] = [-2e4, -5e3, 0.25, -1e4]
    values = np.arange(40, dtype=np.float32).reshape(1, 2, 4, 5)
    _, (layer,) = capture(tiny_attention(tmp_path / "tiny.onnx"), {"scores": scores, "values": values})
    expected = np.ones((2, 3, 4), bool)
    expected[0, 0] = [False, False, True, False]
    expected[1, 2] = [False, True, True, True]
    assert np.array_equal(layer["mask"], expected)
    assert np.array_equal(layer["logits"], np.where(expected, scores[0], 0))
    assert np.array_equal(layer["values"], values[0])


def bad_capture(capsys, model, inputs, tmp_path):
    from somatile.host.cli import main
    inputs_file = tmp_path / "in.npz"
    np.savez(inputs_file, **inputs)
    code = main(["capture", "--onnx", str(model), "--inputs", str(inputs_file), "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out.strip()
    assert code == 2 and len(out.splitlines()) == 1, out
    assert not (tmp_path / "o").exists()
    return out


TINY_INPUTS = {"scores": np.zeros((1, 2, 3, 4), np.float32), "values": np.zeros((1, 2, 4, 5), np.float32)}


def test_not_an_onnx_file(tmp_path, capsys):
    text = tmp_path / "model.onnx"
    text.write_text("this is not a model\n")
    out = bad_capture(capsys, text, TINY_INPUTS, tmp_path)
    assert str(text) in out and "not an ONNX model" in out, out
    noise = tmp_path / "noise.onnx"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    out = bad_capture(capsys, noise, TINY_INPUTS, tmp_path)
    assert str(noise) in out and "not an ONNX model" in out, out


@pytest.mark.parametrize("axis, consumer, why", [(1, "MatMul", "not the last (key) axis"),
                                                 (-1, "Identity", "feeds no MatMul")])
def test_no_softmax_over_a_key_axis(tmp_path, capsys, axis, consumer, why):
    model = tiny_attention(tmp_path / "tiny.onnx", axis=axis, consumer=consumer)
    inputs = TINY_INPUTS if consumer == "MatMul" else {"scores": TINY_INPUTS["scores"]}
    out = bad_capture(capsys, model, inputs, tmp_path)
    assert str(model) in out and "'attn_softmax'" in out and why in out, out


def test_opset_outside_the_supported_range(tmp_path, capsys):
    from somatile.eval.onnx_capture import MIN_OPSET, max_opset
    for opset in (MIN_OPSET - 1, max_opset() + 1):
        model = tiny_attention(tmp_path / f"opset{opset}.onnx", opset=opset)
        out = bad_capture(capsys, model, TINY_INPUTS, tmp_path)
        assert str(model) in out and f"opset {opset} is outside" in out, out


@pytest.mark.parametrize("change, expected", [
    (lambda d: d.pop("values"), "missing input 'values'"),
    (lambda d: d.update(extra=np.zeros(1)), "array 'extra' is not an input"),
    (lambda d: d.update(scores=d["scores"].astype(np.float64)), "input 'scores' is float64, expected float32"),
    (lambda d: d.update(scores=d["scores"][0]), "input 'scores' has shape (2, 3, 4)"),
    (lambda d: d.update(values=np.zeros((1, 2, 4, 6), np.float32)), "input 'values' has shape (1, 2, 4, 6)"),
])
def test_inputs_that_do_not_match(tmp_path, capsys, change, expected):
    inputs = dict(TINY_INPUTS)
    change(inputs)
    out = bad_capture(capsys, tiny_attention(tmp_path / "tiny.onnx"), inputs, tmp_path)
    assert expected in out and "in.npz" in out, out


def tiny_decoder(path, weights, *, heads, head_dim, lm=None):
    """A synthetic causal decoder: per layer x += softmax(where(causal, q k^T / sqrt(D), -inf)) v wo with one
    shared value head broadcast over ``heads`` query heads (multi-query attention). Input ``hidden`` float32
    (1, sequence, C); the causal mask is built in the graph (Trilu) at run time. With ``lm`` = (embedding
    (V, C), head (C, V)) a language model: input ``input_ids`` int64 (batch, sequence), output ``logits``
    (batch, sequence, V)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    x = node("Gather", [const("embedding", lm[0]), "input_ids"], "hidden") if lm else "hidden"
    n_seq = node("Gather", [node("Shape", [x], "shape"), const("one", np.int64(1))], "seq", axis=0)
    square = node("Concat", [node("Unsqueeze", [n_seq, const("ax0", np.array([0]))], "seq1"), "seq1"], "tt", axis=0)
    ones = node("ConstantOfShape", [square], "ones", value=numpy_helper.from_array(np.ones(1, np.float32)))
    causal = node("Cast", [node("Trilu", [ones], "lower", upper=0)], "causal", to=TensorProto.BOOL)
    for i, (wq, wk, wv, wo) in enumerate(weights):
        p = f"layer{i}/"
        q = node("Transpose", [node("Reshape", [node("MatMul", [x, const(p + "wq", wq)], p + "q"),
                                                const(p + "qs", np.array([0, 0, heads, head_dim]))], p + "q4")],
                 p + "q_bhtd", perm=[0, 2, 1, 3])
        k = node("Unsqueeze", [node("Transpose", [node("MatMul", [x, const(p + "wk", wk)], p + "k")], p + "k_t",
                                    perm=[0, 2, 1]), const(p + "ax1", np.array([1]))], p + "k_b1dt")
        v = node("Unsqueeze", [node("MatMul", [x, const(p + "wv", wv)], p + "v"), p + "ax1"], p + "v_b1td")
        scores = node("Mul", [node("MatMul", [q, k], p + "qk"), const(p + "scale", np.float32(head_dim ** -0.5))],
                      p + "scores")
        masked = node("Where", [causal, scores, const(p + "neg_inf", np.float32(-np.inf))], p + "scores_causal")
        ctx = node("MatMul", [node("Softmax", [masked], p + "probs", axis=-1), v], p + "ctx")
        ctx = node("Reshape", [node("Transpose", [ctx], p + "ctx_t", perm=[0, 2, 1, 3]),
                               const(p + "cs", np.array([0, 0, heads * head_dim]))], p + "ctx_flat")
        x = node("Add", [x, node("MatMul", [ctx, const(p + "wo", wo)], p + "o")], p + "x")
    C = weights[0][0].shape[0]
    if lm:
        node("MatMul", [x, const("lm_head", lm[1])], "logits")
        graph_io = ([helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
                    [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)])
    else:
        nodes.append(helper.make_node("Identity", [x], ["out"], name="out"))
        graph_io = ([helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "sequence", C])],
                    [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    graph = helper.make_graph(nodes, "tiny_decoder", *graph_io, initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_capture_of_a_causal_decoder(tmp_path):
    from somatile.eval.onnx_capture import capture
    rng = np.random.default_rng(3)
    T, C, heads, D = 7, 16, 4, 8
    weights = [tuple((rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)
                     for shape in ((C, heads * D), (C, D), (C, D), (heads * D, C))) for _ in range(2)]
    hidden = rng.normal(size=(1, T, C)).astype(np.float32)
    _, layers = capture(tiny_decoder(tmp_path / "decoder.onnx", weights, heads=heads, head_dim=D),
                        {"hidden": hidden})
    causal = np.tril(np.ones((T, T), bool))
    x = hidden[0].astype(np.float64)
    for (wq, wk, wv, wo), layer in zip(weights, layers):
        q = (x @ wq).reshape(T, heads, D).transpose(1, 0, 2)
        k, v = x @ wk, x @ wv
        logits = q @ k.T / np.sqrt(D)
        assert np.array_equal(layer["mask"], np.broadcast_to(causal, (heads, T, T)))
        # Float32 graph against this float64 reference, logits up to ~7: measured 1.3e-6 (logits) and 4.7e-7
        # (values); 1e-5 is about 20 float32 ulps at 7, and a wrong mask or scale would miss it by far.
        assert np.abs(layer["logits"] - np.where(causal, logits, 0)).max() <= 1e-5
        assert layer["values"].shape == (heads, T, D) and np.abs(layer["values"] - v).max() <= 1e-5
        p = np.exp(np.where(causal, logits - logits.max(axis=-1, keepdims=True), -np.inf))
        p /= p.sum(axis=-1, keepdims=True)
        x = x + (p @ v).transpose(1, 0, 2).reshape(T, heads * D) @ wo


def test_capture_from_text_in_batches(minilm, minilm_onnx, tmp_path):
    # --text with the model's own tokenizer.json gives the rows batch_inputs builds, run 2 at a time; a batch of
    # more than one writes a file per item whose values are that sequence's alone.
    from somatile.eval.text import load_text, sentences
    from somatile.host.cli import main
    from somatile.model.logits import load_npz
    chosen = sentences(load_text(), 3)
    (tmp_path / "text.txt").write_text("\n\n".join(chosen) + "\n")
    out = tmp_path / "capture"
    assert main(["capture", "--onnx", str(minilm_onnx), "--text", str(tmp_path / "text.txt"), "--tokenizer",
                 str(minilm.path / "tokenizer.json"), "--batch", "2", "--out", str(out)]) == 0
    inputs = batch_inputs(minilm, chosen)
    T = inputs["input_ids"].shape[1]
    index = __import__("json").loads((out / "index.json").read_text())
    assert index["layers"][0]["items"] == [f"layer0_item{b}.npz" for b in range(3)]
    whole = np.load(out / "layer2.npz")
    assert whole["logits"].shape == (minilm.n_heads, 3 * T, T) and "values" not in whole
    for b, sentence in enumerate(chosen):
        n = len(minilm.encode(sentence))
        _, ref_values = numpy_layers(minilm, sentence)
        item = load_npz(out / f"layer2_item{b}.npz")
        assert np.array_equal(item.logits, whole["logits"][:, b * T:(b + 1) * T])
        assert item.mask[:, :, :n].all() and not item.mask[:, :, n:].any()
        # Float32 against float64, as in test_captured_layer_loads_and_calibrates.
        assert np.abs(item.values[:, :n] - ref_values[2]).max() <= 1e-5 * np.abs(ref_values[2]).max()


def test_text_that_cannot_feed_the_graph(minilm_onnx, tmp_path, capsys):
    from somatile.host.cli import main
    from tokenizers import Tokenizer, models, pre_tokenizers
    text = tmp_path / "text.txt"
    text.write_text("Four words at least here.\n")
    big = Tokenizer(models.WordLevel({"[UNK]": 40000, "Four": 1}, unk_token="[UNK]"))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    big.save(str(tmp_path / "big.json"))

    def fails(model, *extra):
        code = main(["capture", "--onnx", str(model), "--text", str(text), *extra, "--out", str(tmp_path / "o")])
        out = capsys.readouterr().out.strip()
        assert code == 2 and len(out.splitlines()) == 1 and not (tmp_path / "o").exists(), out
        return out
    assert "also pass --tokenizer" in fails(minilm_onnx)
    assert "missing.json: no such file" in fails(minilm_onnx, "--tokenizer", str(tmp_path / "missing.json"))
    out = fails(minilm_onnx, "--tokenizer", str(tmp_path / "big.json"))
    assert "big.json: token id 40000 is outside the 30522-row embedding" in out, out
    out = fails(tiny_attention(tmp_path / "tiny.onnx"), "--tokenizer", str(tmp_path / "big.json"))
    assert "tiny.onnx: --text needs a graph input 'input_ids'" in out and "'scores'" in out, out
