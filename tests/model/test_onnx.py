"""ONNX: the all-MiniLM-L6-v2 exporter against the numpy forward pass, and `somatile capture` on that graph
(issue 26)."""

import numpy as np
import pytest

from somatile.model.minilm import MiniLM
from somatile.model.onnx_minilm import batch_inputs, export_minilm

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
