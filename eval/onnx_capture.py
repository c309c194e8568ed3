"""`somatile capture`: the attention logits, mask and values of a user's ONNX transformer, in the files
`somatile compare` and `somatile calibrate` read (issue 26).

    somatile capture --onnx MODEL.onnx --inputs FILE.npz --out DIR

**What counts as attention.** An ai.onnx ``Softmax`` whose axis is the last axis of its input (the key axis)
and whose output is the left operand of a ``MatMul`` (probabilities @ V). Its input is the score tensor
(B, H, R, N) as the model feeds it, scale and additive mask included; the ``MatMul``'s other operand is the
value tensor (B, H, N, D) or (B, 1, N, D) (one value head broadcast over all heads). Layers are numbered in
graph order. Fused attention operators (``Attention``, ``MultiHeadAttention``) hold no Softmax and are not
found; export the model without them.

**Inputs.** ``FILE.npz`` has one array per graph input, named like the input (initializers do not count),
with the input's dtype, rank and fixed dimensions.

**Masks.** A score below :data:`MASKED_BELOW` (-1e4), or not finite, is a masked key: additive masks put
-inf, float32 min, -1e9 or -1e4 there and a real logit that low would give a probability of exp(-1e4) = 0
anyway. Masked entries are written as logit 0 with mask False; unmasked entries are the graph's scores
unchanged (adding a mask of 0.0 is exact).

**Output layout** (one file per layer):

- ``DIR/layer{i}.npz``: ``logits`` float32 (H, B*R, N) (the query rows of every batch item, item by item),
  ``mask`` bool (H, B*R, N) (True = the key takes part), and with a batch of one ``values`` float32 (H, N, D)
  (the items of a larger batch have different values, and the file holds one set: capture one sequence per
  run to calibrate on the attention output);
- ``DIR/index.json``: the model, the inputs file, the opset and per layer its file, the Softmax node, the
  score and value tensor names and H, rows, N, D, and whether values were written.

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


def capture(model_path, inputs: dict[str, np.ndarray], *, inputs_source: str = "inputs") -> tuple[int, list[dict]]:
    """Run the ONNX model at ``model_path`` on ``inputs``; returns its ai.onnx opset and per attention layer a
    dict with ``logits``, ``mask`` and (batch of one) ``values`` in the layout of the module docstring, plus
    ``site`` (:class:`AttentionSite`). ValueError naming the file, node or input at fault."""
    onnx, ort = _onnx()
    model = load_model(model_path)
    sites = find_attention(model, str(model_path))
    check_inputs(model, inputs, str(model_path), inputs_source)
    existing = {o.name for o in model.graph.output}
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    wanted = list(dict.fromkeys(t for s in sites for t in (s.scores, s.values)))
    for name in wanted:
        if name not in existing:
            model.graph.output.append(
                onnx.helper.make_tensor_value_info(name, elem.get(name, onnx.TensorProto.FLOAT), None))
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        results = dict(zip(wanted, session.run(wanted, inputs)))
    except Exception as exc:   # onnxruntime raises its own exception classes, one per failure kind
        raise ValueError(f"{model_path}: onnxruntime failed on {inputs_source}: "
                         f"{str(exc).strip().splitlines()[0]}") from None
    return opset_of(model), [_layer_arrays(s, results[s.scores], results[s.values], str(model_path)) for s in sites]


def _layer_arrays(site: AttentionSite, scores: np.ndarray, values: np.ndarray, source: str) -> dict:
    if scores.ndim != 4:
        raise ValueError(f"{source}: Softmax '{site.softmax}' input '{site.scores}' has shape {scores.shape}, "
                         f"expected (batch, heads, rows, keys)")
    B, H, R, N = scores.shape
    if values.ndim != 4 or values.shape[0] not in (1, B) or values.shape[1] not in (1, H) or values.shape[2] != N:
        raise ValueError(f"{source}: value tensor '{site.values}' of Softmax '{site.softmax}' has shape "
                         f"{values.shape}, expected ({B}, {H} or 1, {N}, D)")
    scores = scores.astype(np.float32)
    mask = np.isfinite(scores) & (scores >= MASKED_BELOW)
    logits = np.where(mask, scores, np.float32(0))
    out = {"site": site,
           "logits": np.ascontiguousarray(logits.transpose(1, 0, 2, 3).reshape(H, B * R, N)),
           "mask": np.ascontiguousarray(mask.transpose(1, 0, 2, 3).reshape(H, B * R, N))}
    if B == 1:
        out["values"] = np.ascontiguousarray(np.broadcast_to(values[0], (H, N, values.shape[3])), dtype=np.float32)
    return out


def write_capture(layers: list[dict], out_dir, *, model_path, inputs_path, opset: int) -> list[Path]:
    """Write ``layer{i}.npz`` per layer and ``index.json`` into ``out_dir``; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, entries = [], []
    for i, layer in enumerate(layers):
        path = out_dir / f"layer{i}.npz"
        np.savez(path, **{k: v for k, v in layer.items() if k != "site"})
        H, rows, N = layer["logits"].shape
        site = layer["site"]
        entries.append({"layer": i, "file": path.name, "softmax": site.softmax, "scores": site.scores,
                        "values": site.values, "heads": H, "rows": rows, "keys": N,
                        "head_dim": int(layer["values"].shape[2]) if "values" in layer else None,
                        "has_values": "values" in layer,
                        "masked_fraction": float(1.0 - layer["mask"].mean())})
        written.append(path)
    index = out_dir / "index.json"
    index.write_text(json.dumps({"model": str(model_path), "inputs": str(inputs_path), "opset": opset,
                                 "masked_below": MASKED_BELOW, "layers": entries}, indent=1) + "\n")
    return written + [index]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--onnx", metavar="MODEL.onnx", required=True, help="the transformer graph")
    parser.add_argument("--inputs", metavar="FILE.npz", required=True,
                        help="one array per graph input, named like the input")
    parser.add_argument("--out", metavar="DIR", default="build/capture",
                        help="layer{i}.npz per attention layer and index.json (default build/capture)")


def run(args: argparse.Namespace) -> int:
    from somatile.model.files import read_npz
    try:
        if not Path(args.inputs).is_file():
            raise ValueError(f"{args.inputs}: no such file (expected an .npz with one array per graph input)")
        inputs = read_npz(args.inputs, "--inputs")
        opset, layers = capture(args.onnx, inputs, inputs_source=args.inputs)
        written = write_capture(layers, args.out, model_path=args.onnx, inputs_path=args.inputs, opset=opset)
    except (TypeError, ValueError) as exc:
        print(f"somatile capture: {exc}")
        return 2
    H, rows, N = layers[0]["logits"].shape
    print(f"captured {len(layers)} attention layers of {args.onnx} ({H} heads, {rows} rows, {N} keys"
          f"{'' if 'values' in layers[0] else '; no values: batch > 1'})")
    print(f"wrote {written[0].parent}/layer0..{len(layers) - 1}.npz, {written[-1]}")
    return 0
