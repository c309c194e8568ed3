"""SmolLM2-135M numpy forward: tokenizer, RoPE layout, attention plumbing, and the reference perplexity."""

import math

import numpy as np
import pytest

from somatile.model.smollm2 import (REFERENCE_PPL, CausalAttention, SmolLM2, perplexity, softmax_normaliser,
                                    window_starts)
from somatile.eval.text import REFERENCE_CHARS, load_text

REFERENCE_SCORED = 9480


@pytest.fixture(scope="module")
def model():
    return SmolLM2.load()


@pytest.fixture(scope="module")
def tokens(model):
    return model.encode(load_text()[:REFERENCE_CHARS])


def test_config_and_tokenizer(model, tokens):
    c = model.config
    assert (c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab) == \
        (30, 576, 9, 3, 64, 1536, 49152)
    assert len(tokens) == 9499
    text = load_text()[:REFERENCE_CHARS]
    assert model.tokenizer.decode(tokens.tolist()) == text
    # Digits are split one by one before the byte-level BPE.
    assert len(model.encode("2026")) == 4


def test_rope_rotates_adjacent_pairs(model):
    x = np.zeros((3, 1, 64), np.float32)
    x[:, 0, 0] = 1.0  # only the first pair (x[0], x[1]) is non-zero
    r = model.rope(x, np.arange(3))
    assert np.all(r[:, 0, 2:] == 0)
    assert np.allclose(r[:, 0, 0], np.cos(np.arange(3))) and np.allclose(r[:, 0, 1], np.sin(np.arange(3)))


def test_causal_attention_matches_a_loop(rng):
    T, H, Hkv, D = 5, 6, 2, 8
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    out = CausalAttention()(0, q, k, v)
    want = np.zeros_like(out)
    for t in range(T):
        for h in range(H):
            kv = h // (H // Hkv)
            z = k[:t + 1, kv] @ q[t, h] / math.sqrt(D)
            p = np.exp(z - z.max())
            want[t, h] = (p / p.sum()) @ v[:t + 1, kv]
    assert np.allclose(out, want, atol=1e-5)  # float32 rounding of a 5-token softmax


def test_window_protocol():
    assert window_starts(9499, 512) == list(range(0, 9499, 512))
    assert window_starts(1025, 512) == [0, 512]  # a trailing 1-token window scores nothing


def test_reference_perplexity(model, tokens):
    # The check: 27.774 within 0.5 % (float32 matmuls; measured 19 windows of 512).
    result = perplexity(model, tokens, 512)
    assert result.n_scored == REFERENCE_SCORED and result.n_windows == 19
    assert abs(result.value / REFERENCE_PPL - 1) < 0.005, result


def test_forward_hooks_and_bad_input(model, tokens):
    chunk = tokens[:16]
    seen = []
    attn = CausalAttention(logits_hook=lambda layer, logits, mask: seen.append((layer, logits.shape)))
    base = model.forward(chunk, attention=attn)
    assert [s[0] for s in seen] == list(range(30)) and seen[0][1] == (9, 16, 16)
    zeroed = model.forward(chunk, attn_out_hook=lambda layer, a: np.zeros_like(a))
    assert not np.allclose(zeroed, base)
    with pytest.raises(ValueError, match="tokens"):
        model.forward(np.array([0, 49152]))
    with pytest.raises(ValueError, match="attention output of layer 0"):
        model.forward(chunk, attention=lambda layer, q, k, v: q[:, :1])
    assert softmax_normaliser(0, np.zeros((1, 2, 2), np.float32), np.tril(np.ones((2, 2), bool)))[0, 0, 1] == 0
