"""`somatile capture`: the attention logits, mask and values of a user's ONNX transformer, in the files
`somatile compare` and `somatile calibrate` read (issue 26).

    somatile capture --onnx MODEL.onnx --inputs FILE.npz --out DIR
    somatile capture --onnx MODEL.onnx --text FILE --tokenizer tokenizer.json [--window N] --out DIR

**What counts as attention.** An ai.onnx ``Softmax`` whose axis is the last axis of its input (the key axis)
and whose output is the left operand of a ``MatMul`` (probabilities @ V). Its input is the score tensor
(B, H, R, N) as the model feeds it, scale and additive mask included; the ``MatMul``'s other operand is the
value tensor (B, H, N, D) or (B, 1, N, D) (one value head broadcast over all heads). Layers are numbered in
graph order. Fused attention operators (``Attention``, ``MultiHeadAttention``) hold no Softmax and are not
found; export the model without them.

**Inputs.** ``FILE.npz`` has one array per graph input, named like the input (initializers do not count),
with the input's dtype, rank and fixed dimensions; rows (axis 0) are batch items. Or ``--text FILE
--tokenizer tokenizer.json`` (a Hugging Face ``tokenizers`` file): :func:`text_inputs` builds ``input_ids``,
``attention_mask`` and, where the graph takes them, ``token_type_ids`` and ``position_ids``, one row per
sentence (or per ``--window`` tokens). onnxruntime runs ``--batch`` rows at a time (default 8); the layers are
joined along the batch axis.

**Masks.** A score below :data:`MASKED_BELOW` (-1e4), or not finite, is a masked key: additive masks put
-inf, float32 min, -1e9 or -1e4 there and a real logit that low would give a probability of exp(-1e4) = 0
anyway. Masked entries are written as logit 0 with mask False; unmasked entries are the graph's scores
unchanged (adding a mask of 0.0 is exact).

**Output layout** (one file per layer, plus one per layer and batch item when there is more than one):

- ``DIR/layer{i}.npz``: ``logits`` float32 (H, B*R, N) (the query rows of every batch item, item by item),
  ``mask`` bool (H, B*R, N) (True = the key takes part), and with a batch of one ``values`` float32 (H, N, D);
- with a batch of B > 1, ``DIR/layer{i}_item{b}.npz`` for b = 0..B-1: item b's ``logits`` (H, R, N), ``mask``
  and ``values`` (H, N, D) (each item attends over its own values, so each gets a file that `somatile
  compare` and `calibrate` read as it is, the attention-output objective included);
- ``DIR/index.json``: the model, the inputs, the opset and per layer its file and item files, the Softmax
  node, the score and value tensor names and H, rows, N, D, and whether ``layer{i}.npz`` holds values.

Rows of padded query positions are kept: the graph computes them and capture cannot tell them from real ones.
Supported opsets: ai.onnx :data:`MIN_OPSET` (Softmax over one axis; earlier opsets flatten the axes from
``axis`` on) up to the newest the installed ``onnx`` package defines (its checker and shape inference know
nothing newer). Errors are one line naming the file, node or input at fault.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

MIN_OPSET = 13
MASKED_BELOW = -1e4
"""Scores below this (or not finite) are masked keys: see the module docstring."""


def _onnx():
    try:
        import onnx
        import onnxruntime
    except ModuleNotFoundError as exc:
        raise ValueError(f"needs the Python package '{exc.name}'; install it with `pip install -e '.[onnx]'` "
                         f"(or `make test`, which sets up .venv)") from None
    return onnx, onnxruntime


def max_opset() -> int:
    """The newest ai.onnx opset the installed ``onnx`` package defines (the top of the supported range)."""
    return _onnx()[0].defs.onnx_opset_version()


def load_model(path):
    """The ``onnx.ModelProto`` at ``path`` (external data loaded), or ValueError naming the file when it is not
    an ONNX model or its ai.onnx opset is outside ``MIN_OPSET..max_opset()``."""
    onnx, _ = _onnx()
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (expected an ONNX model)")
    try:
        model = onnx.load(str(path))
    except Exception as exc:   # protobuf's DecodeError and friends have no common public base
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"{path}: not an ONNX model ({type(exc).__name__}: {reason})") from None
    # Protobuf parses many byte strings as a mostly empty message; a model has a graph and an opset.
    if not model.graph.node or not model.opset_import:
        raise ValueError(f"{path}: not an ONNX model (no graph nodes or no opset import)")
    opset = opset_of(model)
    if opset is None:
        raise ValueError(f"{path}: imports no ai.onnx opset (found domains "
                         f"{sorted(o.domain for o in model.opset_import)})")
    if not MIN_OPSET <= opset <= max_opset():
        raise ValueError(f"{path}: ai.onnx opset {opset} is outside the supported range {MIN_OPSET}..{max_opset()}")
    return model


def opset_of(model) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


@dataclasses.dataclass(frozen=True)
class AttentionSite:
    """One attention layer of a graph: its Softmax node and the score and value tensors around it."""

    softmax: str
    scores: str
    values: str


def find_attention(model, source: str = "model") -> list[AttentionSite]:
    """The attention Softmax nodes of ``model`` in graph order (module docstring); ValueError naming
    ``source`` and every rejected Softmax node (with why) when there is none."""
    onnx, _ = _onnx()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:   # shape inference is only used for ranks; running the graph checks them again
        inferred = model
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim)
             for vi in list(inferred.graph.value_info) + list(inferred.graph.input)
             if vi.type.tensor_type.HasField("shape")}
    left_of_matmul = {n.input[0]: n for n in model.graph.node if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")}
    sites, rejected = [], []
    for n in model.graph.node:
        if n.op_type != "Softmax" or n.domain not in ("", "ai.onnx"):
            continue
        label = n.name or n.output[0]
        axis = next((onnx.helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"), -1)
        rank = ranks.get(n.input[0])
        if not (axis == -1 or (rank is not None and axis == rank - 1)):
            rejected.append(f"Softmax '{label}' normalises axis {axis} of a rank-{rank} input, not the last "
                            f"(key) axis")
        elif n.output[0] not in left_of_matmul:
            rejected.append(f"Softmax '{label}' feeds no MatMul as its left operand (expected probs @ V)")
        else:
            sites.append(AttentionSite(label, n.input[0], left_of_matmul[n.output[0]].input[1]))
    if not sites:
        why = "; ".join(rejected) if rejected else "the graph has no Softmax node (fused attention is not supported)"
        raise ValueError(f"{source}: no attention Softmax over a key axis: {why}")
    return sites


def check_inputs(model, arrays: dict[str, np.ndarray], model_source: str, inputs_source: str) -> None:
    """ValueError naming the input when ``arrays`` miss a graph input, hold an array the graph does not take,
    or differ in dtype, rank or a fixed dimension."""
    onnx, _ = _onnx()
    init = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in init]
    names = [i.name for i in graph_inputs]
    for extra in sorted(set(arrays) - set(names)):
        raise ValueError(f"{inputs_source}: array '{extra}' is not an input of {model_source} (inputs: {names})")
    for vi in graph_inputs:
        t = vi.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        want = f"{dtype} {tuple(dims)}"
        if vi.name not in arrays:
            raise ValueError(f"{inputs_source}: missing input '{vi.name}' ({want}) of {model_source}")
        a = arrays[vi.name]
        if a.dtype != dtype:
            raise ValueError(f"{inputs_source}: input '{vi.name}' is {a.dtype}, expected {want}")
        if t.HasField("shape") and (a.ndim != len(dims) or any(
                isinstance(d, int) and d > 0 and d != s for d, s in zip(dims, a.shape))):
            raise ValueError(f"{inputs_source}: input '{vi.name}' has shape {a.shape}, expected {want}")


class AttentionRun:
    """The ONNX model at ``model_path`` under onnxruntime with every attention layer's score and value tensor as
    extra outputs (one session, built once). ValueError naming the file or node at fault."""

    def __init__(self, model_path):
        onnx, ort = _onnx()
        self.source = str(model_path)
        self.model = load_model(model_path)
        self.opset = opset_of(self.model)
        self.sites = find_attention(self.model, self.source)
        tapped = onnx.ModelProto()
        tapped.CopyFrom(self.model)
        existing = {o.name for o in tapped.graph.output}
        elem = {vi.name: vi.type.tensor_type.elem_type for vi in tapped.graph.value_info}
        self.wanted = list(dict.fromkeys(t for s in self.sites for t in (s.scores, s.values)))
        for name in self.wanted:
            if name not in existing:
                tapped.graph.output.append(
                    onnx.helper.make_tensor_value_info(name, elem.get(name, onnx.TensorProto.FLOAT), None))
        try:
            self.session = ort.InferenceSession(tapped.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception as exc:   # onnxruntime raises its own exception classes, one per failure kind
            raise ValueError(f"{model_path}: onnxruntime cannot load it: {str(exc).strip().splitlines()[0]}") from None

    def __call__(self, inputs: dict[str, np.ndarray], inputs_source: str = "inputs"):
        """Per layer (scores (B, H, R, N), values (B, H or 1, N, D)) on ``inputs``."""
        check_inputs(self.model, inputs, self.source, inputs_source)
        try:
            results = dict(zip(self.wanted, self.session.run(self.wanted, inputs)))
        except Exception as exc:   # as above
            raise ValueError(f"{self.source}: onnxruntime failed on {inputs_source}: "
                             f"{str(exc).strip().splitlines()[0]}") from None
        raw = []
        for s in self.sites:
            scores, values = results[s.scores], results[s.values]
            check_layer_shapes(s, scores, values, self.source)
            raw.append((scores, values))
        return raw

    def batches(self, inputs: dict[str, np.ndarray], batch: int, inputs_source: str = "inputs"):
        """Per layer (scores, values) on ``inputs`` run ``batch`` rows at a time, joined along the batch axis
        (a value tensor shared by the batch is repeated per item)."""
        joined = [([], []) for _ in self.sites]
        for part in split_rows(inputs, batch):
            for (scores, values), (all_scores, all_values) in zip(self(part, inputs_source), joined):
                all_scores.append(scores)
                all_values.append(np.broadcast_to(values, (scores.shape[0],) + values.shape[1:]))
        return [(np.concatenate(s), np.concatenate(v)) for s, v in joined]


def capture(model_path, inputs: dict[str, np.ndarray], *, inputs_source: str = "inputs",
            batch: int | None = None) -> tuple[int, list[dict]]:
    """Run the ONNX model at ``model_path`` on ``inputs`` (``batch`` rows at a time; default all at once);
    returns its ai.onnx opset and per attention layer a dict with ``logits``, ``mask`` and ``values`` (batch of
    one) or ``items`` (per batch item ``logits``, ``mask``, ``values``) in the layout of the module docstring,
    plus ``site`` (:class:`AttentionSite`). ValueError naming the file, node or input at fault."""
    run = AttentionRun(model_path)
    rows = len(next(iter(inputs.values()))) if inputs else 1
    raw = run.batches(inputs, batch or max(rows, 1), inputs_source)
    return run.opset, [_layer_arrays(s, scores, values) for s, (scores, values) in zip(run.sites, raw)]


def key_mask(scores: np.ndarray) -> np.ndarray:
    """True where a score takes part: finite and not below :data:`MASKED_BELOW`."""
    return np.isfinite(scores) & (scores >= MASKED_BELOW)


def check_layer_shapes(site: AttentionSite, scores: np.ndarray, values: np.ndarray, source: str) -> None:
    if scores.ndim != 4:
        raise ValueError(f"{source}: Softmax '{site.softmax}' input '{site.scores}' has shape {scores.shape}, "
                         f"expected (batch, heads, rows, keys)")
    B, H, R, N = scores.shape
    if values.ndim != 4 or values.shape[0] not in (1, B) or values.shape[1] not in (1, H) or values.shape[2] != N:
        raise ValueError(f"{source}: value tensor '{site.values}' of Softmax '{site.softmax}' has shape "
                         f"{values.shape}, expected ({B}, {H} or 1, {N}, D)")


def item_blocks(scores: np.ndarray, values: np.ndarray):
    """Per batch item (logits float32 (H, R, N) with masked scores 0, mask bool (H, R, N), values float32
    (H, N, D)): one sequence's attention, the block ``calibrate_wide`` and the per-item files read."""
    B, H, R, N = scores.shape
    mask = key_mask(scores)
    logits = np.where(mask, scores, 0).astype(np.float32)
    for b in range(B):
        v = values[b if values.shape[0] == B else 0]
        yield logits[b], mask[b], np.ascontiguousarray(np.broadcast_to(v, (H, N, v.shape[2])), dtype=np.float32)


def _layer_arrays(site: AttentionSite, scores: np.ndarray, values: np.ndarray) -> dict:
    items = list(item_blocks(scores, values))
    H, R, N = items[0][0].shape

    def batch_rows(arrays):
        return np.ascontiguousarray(np.stack(arrays, axis=1).reshape(H, len(items) * R, N))
    layer = {"site": site, "logits": batch_rows([x for x, _, _ in items]), "mask": batch_rows([m for _, m, _ in items])}
    if len(items) == 1:
        layer["values"] = items[0][2]
    else:
        layer["items"] = [{"logits": x, "mask": m, "values": v} for x, m, v in items]
    return layer


def graph_inputs(model) -> list[str]:
    """The names of the graph inputs that are not initializers (what a caller feeds)."""
    init = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in init]


def embedding_rows(model, input_name: str) -> int | None:
    """The row count of the initializer a ``Gather`` looks ``input_name`` up in (the vocabulary size)."""
    init = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] == input_name and n.input[0] in init:
            return int(init[n.input[0]].dims[0])
    return None


def load_tokenizer(path, *, max_tokens: int | None = None):
    """``tokenizers.Tokenizer.from_file(path)`` with padding off and truncation at ``max_tokens``; ValueError
    naming the file when it is missing or not a tokenizer, or when the package is not installed."""
    path = Path(path)
    try:
        from tokenizers import Tokenizer
    except ModuleNotFoundError:
        raise ValueError("--tokenizer needs the Python package 'tokenizers'; install it with "
                         "`pip install tokenizers`") from None
    if not path.is_file():
        raise ValueError(f"{path}: no such file (expected a Hugging Face tokenizer.json)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:   # tokenizers raises a bare Exception on a malformed file
        raise ValueError(f"{path}: not a tokenizer.json ({str(exc).strip().splitlines()[0]})") from None
    tokenizer.no_padding()
    if max_tokens is not None:
        tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


def text_inputs(model, text_path, tokenizer_path, *, max_tokens: int = 128, window: int | None = None,
                source: str = "model") -> dict[str, np.ndarray]:
    """The graph inputs of ``model`` for the UTF-8 text at ``text_path`` tokenised by ``tokenizer_path``.

    Rows are the text's sentences (:func:`somatile.eval.text.sentences`, truncated to ``max_tokens`` tokens,
    special tokens as the tokenizer adds them), or with ``window`` consecutive windows of ``window`` tokens of
    the whole text (a causal LM's protocol; a last partial window is dropped). Every row is padded at the end
    to the longest with the tokenizer's pad id (0 when it declares none): ``input_ids`` int64 (rows, T),
    ``attention_mask`` (1 = token, 0 = padding), ``token_type_ids`` (zeros) and ``position_ids`` (0..T-1) when
    the graph has those inputs. ValueError naming the input, file or node at fault."""
    from somatile.eval import text as textmod
    names = graph_inputs(model)
    if "input_ids" not in names:
        raise ValueError(f"{source}: --text needs a graph input 'input_ids' (the graph's inputs: {names})")
    known = {"input_ids", "attention_mask", "token_type_ids", "position_ids"}
    others = [n for n in names if n not in known]
    if others:
        raise ValueError(f"{source}: --text cannot build the graph input '{others[0]}' (it builds {sorted(known)}); "
                         f"pass --inputs FILE.npz instead")
    tokenizer = load_tokenizer(tokenizer_path, max_tokens=None if window else max_tokens)
    body = textmod.load_text(text_path)
    if window:
        ids = tokenizer.encode(body, add_special_tokens=False).ids
        rows = [ids[i:i + window] for i in range(0, len(ids) - window + 1, window)]
        if not rows:
            raise ValueError(f"{text_path}: {len(ids)} tokens, fewer than one --window of {window}")
    else:
        rows = [e.ids for e in tokenizer.encode_batch(textmod.sentences(body, None))]
        if not rows:
            raise ValueError(f"{text_path}: no sentence of 4 to 60 words")
    vocab = embedding_rows(model, "input_ids")
    top = max(max(r) for r in rows)
    if vocab is not None and top >= vocab:
        raise ValueError(f"{tokenizer_path}: token id {top} is outside the {vocab}-row embedding of {source}: "
                         f"the tokenizer does not match the model")
    pad = (tokenizer.padding or {}).get("pad_id", 0)
    T = max(len(r) for r in rows)
    out = {"input_ids": np.full((len(rows), T), pad, np.int64), "attention_mask": np.zeros((len(rows), T), np.int64)}
    for b, r in enumerate(rows):
        out["input_ids"][b, :len(r)] = r
        out["attention_mask"][b, :len(r)] = 1
    out["token_type_ids"] = np.zeros_like(out["input_ids"])
    out["position_ids"] = np.broadcast_to(np.arange(T, dtype=np.int64), (len(rows), T)).copy()
    return {k: v for k, v in out.items() if k in names}


def split_rows(inputs: dict[str, np.ndarray], size: int):
    """``inputs`` in slices of ``size`` rows (axis 0 of every array)."""
    rows = len(next(iter(inputs.values()))) if inputs else 1
    for start in range(0, max(rows, 1), size):
        yield {k: v[start:start + size] for k, v in inputs.items()}


def write_capture(layers: list[dict], out_dir, *, model_path, inputs_path, opset: int) -> list[Path]:
    """Write ``layer{i}.npz`` per layer (and ``layer{i}_item{b}.npz`` per batch item when the batch holds more
    than one) and ``index.json`` into ``out_dir``; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, entries = [], []
    for i, layer in enumerate(layers):
        path = out_dir / f"layer{i}.npz"
        np.savez(path, **{k: layer[k] for k in ("logits", "mask", "values") if k in layer})
        items = []
        for b, item in enumerate(layer.get("items", ())):
            items.append(out_dir / f"layer{i}_item{b}.npz")
            np.savez(items[-1], **item)
        H, rows, N = layer["logits"].shape
        values = layer["values"] if "values" in layer else layer["items"][0]["values"]
        site = layer["site"]
        entries.append({"layer": i, "file": path.name, "items": [p.name for p in items], "softmax": site.softmax,
                        "scores": site.scores, "values": site.values, "heads": H, "rows": rows, "keys": N,
                        "head_dim": int(values.shape[2]), "has_values": "values" in layer,
                        "masked_fraction": float(1.0 - layer["mask"].mean())})
        written += [path] + items
    index = out_dir / "index.json"
    index.write_text(json.dumps({"model": str(model_path), "inputs": str(inputs_path), "opset": opset,
                                 "masked_below": MASKED_BELOW, "layers": entries}, indent=1) + "\n")
    return written + [index]


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """--inputs, or --text with --tokenizer (and their options): shared with `somatile eval onnx`."""
    parser.add_argument("--inputs", metavar="FILE.npz", default=None,
                        help="one array per graph input, named like the input (rows on axis 0)")
    parser.add_argument("--text", metavar="FILE", default=None,
                        help="UTF-8 text, tokenised with --tokenizer into input_ids and attention_mask")
    parser.add_argument("--tokenizer", metavar="tokenizer.json", default=None,
                        help="a Hugging Face tokenizers file (Tokenizer.from_file)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="--text: truncate each sentence to this many tokens (default 128)")
    parser.add_argument("--window", type=int, default=None,
                        help="--text: rows are windows of this many tokens of the whole text (causal LMs)")
    parser.add_argument("--batch", type=int, default=8, help="rows per onnxruntime run (default 8)")


def read_inputs(args, model, source: str) -> tuple[dict[str, np.ndarray], str]:
    """The graph inputs that --inputs or --text/--tokenizer name, and how to name them in messages."""
    from somatile.model.files import read_npz
    if (args.inputs is None) == (args.text is None):
        raise ValueError("expected exactly one of --inputs FILE.npz and --text FILE --tokenizer tokenizer.json")
    if args.batch < 1:
        raise ValueError(f"--batch: expected at least 1, got {args.batch}")
    if args.text is not None:
        if args.tokenizer is None:
            raise ValueError("--text: also pass --tokenizer tokenizer.json (the model's own tokenizer)")
        if not Path(args.text).is_file():
            raise ValueError(f"{args.text}: no such file (expected a UTF-8 text for --text)")
        return (text_inputs(model, args.text, args.tokenizer, max_tokens=args.max_tokens, window=args.window,
                            source=source), f"{args.text} (tokenised by {args.tokenizer})")
    if not Path(args.inputs).is_file():
        raise ValueError(f"{args.inputs}: no such file (expected an .npz with one array per graph input)")
    return read_npz(args.inputs, "--inputs"), args.inputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--onnx", metavar="MODEL.onnx", required=True, help="the transformer graph")
    add_input_arguments(parser)
    parser.add_argument("--out", metavar="DIR", default="build/capture",
                        help="layer{i}.npz per attention layer and index.json (default build/capture)")


def run(args: argparse.Namespace) -> int:
    try:
        attention = AttentionRun(args.onnx)
        inputs, source = read_inputs(args, attention.model, args.onnx)
        raw = attention.batches(inputs, args.batch, source)
        layers = [_layer_arrays(s, scores, values) for s, (scores, values) in zip(attention.sites, raw)]
        written = write_capture(layers, args.out, model_path=args.onnx, inputs_path=source, opset=attention.opset)
    except (TypeError, ValueError, FileNotFoundError) as exc:
        print(f"somatile capture: {exc}")
        return 2
    H, rows, N = layers[0]["logits"].shape
    items = len(layers[0].get("items", ())) or 1
    print(f"captured {len(layers)} attention layers of {args.onnx} ({H} heads, {rows} rows of {items} batch "
          f"item{'s' if items > 1 else ''}, {N} keys)")
    print(f"wrote {written[0].parent}/layer0..{len(layers) - 1}.npz"
          f"{', layer{i}_item{b}.npz per batch item' if items > 1 else ''}, {written[-1]}")
    return 0
