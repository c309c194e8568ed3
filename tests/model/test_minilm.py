"""all-MiniLM-L6-v2 numpy forward: reference embeddings, pluggable normaliser, bad input."""

from pathlib import Path

import numpy as np
import pytest

from somatile.model.minilm import MiniLM, softmax

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "minilm_reference.npz"


@pytest.fixture(scope="module")
def model():
    return MiniLM.load()


@pytest.fixture(scope="module")
def reference():
    data = np.load(FIXTURE)
    return [str(s) for s in data["sentences"]], data["embeddings"].astype(np.float64)


def test_embeddings_match_sentence_transformers(model, reference):
    # The fixture holds float32 sentence-transformers (torch CPU) embeddings; this pass runs in float64.
    # Cosine >= 0.99999 is the bar; float32 rounding of the reference alone costs ~1e-12.
    sentences, ref = reference
    assert len(model.encode(sentences[-1])) == 256, "the last fixture sentence must exercise truncation"
    emb = model.embed(sentences)
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    cosines = np.sum(emb * ref, axis=1)
    assert cosines.min() >= 0.99999, cosines
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0)


def test_normaliser_is_called_per_layer_and_changes_the_result(model, reference):
    sentences = reference[0][:2]
    seen = []

    def recording(layer, logits, mask):
        seen.append((layer, logits.shape, mask.shape))
        return softmax(layer, logits, mask)

    def uniform(layer, logits, mask):
        return np.broadcast_to(mask / mask.sum(-1, keepdims=True), logits.shape)

    base = model.embed(sentences)
    assert np.array_equal(model.embed(sentences, normaliser=recording), base)
    T = len(model.encode(sentences[0]))
    assert [s for s in seen[:6]] == [(i, (12, T, T), (T, T)) for i in range(6)]
    flat = model.embed(sentences, normaliser=uniform)
    assert np.sum(flat * base, axis=1).max() < 0.99


def test_logits_hook_sees_scaled_logits(model):
    got = {}
    model.embed(["It is a truth universally acknowledged."],
                logits_hook=lambda n, layer, logits, mask: got.setdefault(layer, logits.copy()))
    assert sorted(got) == list(range(6))
    # realdata.md: layer 0 head 2 attends to the previous token with logits far above the other heads.
    spread = [float(np.ptp(got[0][h], axis=-1).mean()) for h in range(12)]
    assert int(np.argmax(spread)) == 2


def test_bad_input_is_named(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        MiniLM(tmp_path)
    with pytest.raises(ValueError, match="normaliser of layer 0"):
        model.embed(["a short sentence"], normaliser=lambda layer, logits, mask: logits[..., :1])
    with pytest.raises(TypeError, match="sentence"):
        model.encode(3)
