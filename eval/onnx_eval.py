"""`somatile eval onnx`: a user's ONNX transformer with every attention Softmax replaced by an integer
normaliser, and how the model's own outputs change (issue 26).

    somatile eval onnx --onnx MODEL.onnx --inputs FILE.npz [--calibrate-inputs FILE.npz] [--variants KEY ...]

**Mechanism: the graph is cut at each attention Softmax.** :class:`SoftmaxCut` splits the graph (in its
topological node order) into the segments between the Softmax nodes :func:`~somatile.eval.onnx_capture.
find_attention` finds, each segment one onnxruntime session; between two sessions the replacement normaliser
runs in numpy on the score tensor and its output is fed to the next segment as the Softmax's output. Chosen
over an onnxruntime custom operator (onnxruntime-extensions' PyOp) because the replacement is then exactly the
Python of ``somatile.model`` (numba kernels included) with the layer's per-head parameters, not a callback
behind an operator registered once per process and told its layer through node attributes; it needs no
package beyond ``onnx`` and ``onnxruntime``; and each segment is still optimised by onnxruntime. The price is
one copy of the tensors that cross a cut per layer, and no fusion across a Softmax (there is none to lose).
The ``softmax`` variant (exact float softmax through the cut) checks the mechanism against onnxruntime's own
run of the unmodified graph on every evaluation.

**Normalisers** are the ones `somatile eval minilm` evaluates, built by
:func:`somatile.eval.minilm.minilm_normalisers` from a :class:`~somatile.eval.minilm.MiniLMCalibration` of the
captured calibration logits (per layer, per head: float HCCS c, the int8 HCCS B, S, Dmax on quantised logits,
and the wide profile's pwl2 and HCCS parameters calibrated on the attention output); integer kernels see rows
padded to ``--cols`` keys (default: the longest key axis of the calibration and evaluation runs). Each variant
normalises, per batch item, the rows that share one key mask together over their unmasked keys (masked keys,
as in :mod:`~somatile.eval.onnx_capture`, get probability 0): a padding mask gives one block per item, a
causal mask one row per block.

**Calibration data never overlaps the evaluation data:** ``--calibrate-inputs FILE.npz`` (refused when one of
its rows equals an evaluation row, trailing zeros ignored so that padding does not hide a repeat), or the first
``--calibration-rows`` rows of the inputs (default a quarter, at least one), the rest evaluated.

**Reported** per graph output against the unmodified graph under onnxruntime: the cosine of each output vector
(last axis; tokens of padding excluded where the graph takes an ``attention_mask`` (B, T) and the output is
(B, T, C)), for such outputs the cosine of the mean over the attention mask (an encoder's pooled embedding),
top-1 agreement over the last axis for the outputs named by ``--top1`` (default: outputs whose name contains
"logits"), and with ``--causal`` or ``--window`` (token windows of ``--text``) the perplexity of the next
token from the output ``logits`` (padding, ``attention_mask`` 0, not scored). ``OUT/results.json`` and ``OUT/results.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from somatile.eval import onnx_capture as cap
from somatile.eval.report import machine, markdown_table, write_outputs

SOFTMAX = "softmax"
"""The exact float softmax through the cut: the check of the mechanism."""

SOFTMAX_TOLERANCE = 1e-5
"""Largest |difference| of the ``softmax`` variant from onnxruntime's run, relative to the output's largest
|value|: the cut computes the softmax in float64 and rounds it to float32 where onnxruntime computes it in
float32, a difference of about one float32 ulp per probability (6e-8 relative) that later layers carry on.
Compared where the outputs are compared (padded tokens left out: module docstring). Measured: at most 6.4e-7
on the MiniLM export (last_hidden_state, 16 and 49 sentences; sentence_embedding 6.3e-7), 4.7e-7 on the
synthetic causal LM of tests/eval/test_onnx_eval.py; 1e-5 leaves a factor 15. Padded query rows, which no
real token reads, differ more (4.6e-6 there). A wrong probability (a key left in, a row misplaced) moves the
outputs by 1e-3 or more."""


def variant_keys() -> dict[str, str]:
    """Variant key -> the name of its normaliser in :func:`~somatile.eval.minilm.minilm_normalisers`."""
    from somatile.eval.minilm import MINILM_FIELDS
    return {SOFTMAX: SOFTMAX, **{fields["key"]: name for name, fields in MINILM_FIELDS.items()}}


@dataclasses.dataclass
class _Segment:
    nodes: list
    inputs: list[str]
    outputs: list[str]
    session: object = None


def _node_reads(node) -> list[str]:
    """The tensors ``node`` reads, including names its subgraphs (If, Loop, Scan) take from the outer scope."""
    names = [n for n in node.input if n]
    for attr in node.attribute:
        for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            for inner in graph.node:
                names += [n for n in _node_reads(inner) if n not in defined]
                defined |= set(inner.output)
    return names


class SoftmaxCut:
    """The ONNX model ``model`` (a ModelProto) cut at the Softmax nodes of ``sites``: :meth:`run` executes the
    segments between them under onnxruntime and calls ``normalise(layer, scores)`` in place of each Softmax."""

    def __init__(self, model, sites, source: str = "model"):
        self.source = source
        self.sites = sites
        softmax_of = {s.scores: i for i, s in enumerate(sites)}
        self.cuts: list[tuple[str, str]] = []   # per layer (score tensor, probability tensor)
        groups: list[list] = [[]]
        for node in model.graph.node:
            if node.op_type == "Softmax" and node.domain in ("", "ai.onnx") and node.input[0] in softmax_of:
                self.cuts.append((node.input[0], node.output[0]))
                groups.append([])
            else:
                groups[-1].append(node)
        self.outputs = [o.name for o in model.graph.output]
        init = {t.name: t for t in model.graph.initializer}
        # The cuts read their score tensors too, which an earlier segment may compute.
        later_reads: set[str] = set(self.outputs) | {scores for scores, _ in self.cuts}
        self.segments: list[_Segment] = []
        for k in reversed(range(len(groups))):
            nodes = groups[k]
            produced = {o for n in nodes for o in n.output}
            reads = list(dict.fromkeys(r for n in nodes for r in _node_reads(n)))
            outputs = [o for n in nodes for o in n.output if o in later_reads]
            inputs = [r for r in reads if r not in produced and r not in init]
            self.segments.insert(0, _Segment(nodes, inputs, outputs))
            later_reads = (later_reads - produced) | set(inputs)
        self._init = init
        self._opsets = list(model.opset_import)
        self._ir = model.ir_version
        last_use = {name: k for k, seg in enumerate(self.segments) for name in seg.inputs}
        keep = set(self.outputs) | {scores for scores, _ in self.cuts}
        self.freed_after = [[n for n, last in last_use.items() if last == k and n not in keep]
                            for k in range(len(self.segments))]   # tensors no later segment reads

    def _session(self, k: int, env: dict):
        import onnxruntime as ort
        from onnx import helper
        seg = self.segments[k]
        if seg.session is None:
            used = {r for n in seg.nodes for r in _node_reads(n)}
            graph = helper.make_graph(
                seg.nodes, f"segment{k}",
                [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(env[n].dtype), None)
                 for n in seg.inputs],
                [_untyped_output(o) for o in seg.outputs],   # onnxruntime infers the output types
                initializer=[self._init[n] for n in self._init if n in used])
            model = helper.make_model(graph, opset_imports=self._opsets, ir_version=self._ir)
            try:
                seg.session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            except Exception as exc:   # onnxruntime raises its own exception classes
                where = f"before Softmax '{self.sites[k].softmax}'" if k < len(self.sites) else "after the last Softmax"
                raise ValueError(f"{self.source}: the graph segment {where} does not load in onnxruntime: "
                                 f"{str(exc).strip().splitlines()[0]}") from None
        return seg.session

    def run(self, inputs: dict[str, np.ndarray], normalise: Callable[[int, np.ndarray], np.ndarray]) -> dict:
        """The graph outputs on ``inputs`` with ``normalise(layer, scores (B, H, R, N))`` -> probabilities of the
        same shape and dtype in place of each attention Softmax."""
        env = dict(inputs)
        for k, seg in enumerate(self.segments):
            if seg.outputs:
                session = self._session(k, env)
                env.update(zip(seg.outputs, session.run(seg.outputs, {n: env[n] for n in seg.inputs})))
            for name in self.freed_after[k]:
                env.pop(name, None)
            if k < len(self.cuts):
                scores_name, probs_name = self.cuts[k]
                scores = env[scores_name]
                env[probs_name] = np.asarray(normalise(k, scores), dtype=scores.dtype)
        return {o: env[o] for o in self.outputs}


def _untyped_output(name: str):
    from onnx import ValueInfoProto
    vi = ValueInfoProto()
    vi.name = name
    return vi


def by_mask_blocks(normaliser: Callable, layer: int, scores: np.ndarray) -> np.ndarray:
    """``normaliser(layer, logits (H, r, n), mask)`` (the signature of ``minilm_normalisers``) applied to the
    score tensor (B, H, R, N) of one layer: per batch item, the rows that share a key mask form one block over
    their unmasked keys; masked keys and rows without a key get 0. ValueError when the mask differs between
    heads (the normalisers read one mask per row for all heads)."""
    B, H, R, N = scores.shape
    mask = cap.key_mask(scores)
    out = np.zeros(scores.shape)
    for b in range(B):
        if not (mask[b] == mask[b, :1]).all():
            raise ValueError(f"layer {layer}: the key mask of batch item {b} differs between heads (not supported)")
        patterns, group = np.unique(mask[b, 0], axis=0, return_inverse=True)
        for g, pattern in enumerate(patterns):
            keys = np.flatnonzero(pattern)
            if keys.size:
                rows = np.flatnonzero(group.ravel() == g)
                block = scores[b][:, rows[:, None], keys[None, :]].astype(np.float64)
                out[b][:, rows[:, None], keys[None, :]] = normaliser(layer, block, np.ones(block.shape, bool))
    return out


def float_softmax(layer, logits, mask):
    from somatile.model.hccs import softmax
    return softmax(logits, mask)


def calibration_data(raw, cols: int):
    """From the captured calibration layers (per layer (scores, values)): the per-layer (logits (H, R, cols),
    mask) rows and the per-layer, per-item (logits, mask, values) blocks that
    :func:`~somatile.eval.minilm.calibrate_minilm` reads. Rows without a key are dropped."""
    layer_logits, blocks = [], []
    for scores, values in raw:
        items = list(cap.item_blocks(scores, values))
        x = np.concatenate([x for x, _, _ in items], axis=1)
        m = np.concatenate([m for _, m, _ in items], axis=1)
        keep = m.any(axis=(0, 2))
        H, R, N = x.shape
        padded, pmask = np.zeros((H, int(keep.sum()), cols)), np.zeros((H, int(keep.sum()), cols), bool)
        padded[..., :N], pmask[..., :N] = x[:, keep], m[:, keep]
        layer_logits.append((padded, pmask))
        blocks.append([(x.astype(np.float64), m, v) for x, m, v in items])
    return layer_logits, blocks


def row_keys(inputs: dict[str, np.ndarray]) -> list[bytes]:
    """One key per row of ``inputs``: every array's row with trailing zeros removed, so that the same sequence
    padded to two lengths has one key."""
    rows = len(next(iter(inputs.values())))
    return [b"|".join(name.encode() + b":" + np.trim_zeros(np.ascontiguousarray(inputs[name][r]).ravel(), "b").tobytes()
                      for name in sorted(inputs)) for r in range(rows)]


def split_calibration(inputs, calibrate_inputs, calibration_rows: int | None, source: str, cal_source: str):
    """(calibration inputs, evaluation inputs): ``calibrate_inputs`` when given (ValueError naming the rows
    that repeat an evaluation row), else the first ``calibration_rows`` rows (default a quarter, at least one)
    of ``inputs``."""
    rows = len(next(iter(inputs.values())))
    if calibrate_inputs is not None:
        if calibration_rows is not None:
            raise ValueError("--calibration-rows splits --inputs; it does not go with --calibrate-inputs")
        evaluated = {k: r for r, k in enumerate(row_keys(inputs))}
        repeats = [(c, evaluated[k]) for c, k in enumerate(row_keys(calibrate_inputs)) if k in evaluated]
        if repeats:
            c, e = repeats[0]
            raise ValueError(f"{cal_source}: row {c} is row {e} of the evaluation inputs {source} ({len(repeats)} "
                             f"repeated rows): calibration data must not overlap the evaluation data")
        return calibrate_inputs, inputs
    n = max(1, rows // 4) if calibration_rows is None else calibration_rows
    if not 1 <= n < rows:
        raise ValueError(f"--calibration-rows: expected 1..{rows - 1} of the {rows} rows of {source}, got {n}")
    return {k: v[:n] for k, v in inputs.items()}, {k: v[n:] for k, v in inputs.items()}


def cosines(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Cosine of each vector (last axis) of ``out`` with its reference in ``ref``; 1 where both are zero."""
    ref = np.asarray(ref, np.float64).reshape(-1, ref.shape[-1] if ref.ndim else 1)
    out = np.asarray(out, np.float64).reshape(ref.shape)
    den = np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1)
    return np.where(den > 0, np.sum(ref * out, axis=1) / np.where(den > 0, den, 1), 1.0)


def perplexity(logits: np.ndarray, ids: np.ndarray, mask: np.ndarray | None) -> float:
    """exp of the mean negative log-likelihood of each next token (positions 1.. of every row) under ``logits``
    (B, T, V) of the positions before it; padded positions (``mask`` 0) are not scored."""
    x = logits[:, :-1].astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    nll = -np.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
    scored = np.ones(nll.shape, bool) if mask is None else mask[:, 1:].astype(bool)
    return float(np.exp(nll[scored].mean()))


def compare_outputs(ref: dict, out: dict, inputs: dict, top1: list[str], lm_output: str | None) -> dict:
    """Per graph output the cosines (and pooled cosines, top-1 agreement, perplexity: module docstring)."""
    attention = inputs.get("attention_mask")
    result = {}
    for name, r in ref.items():
        o = out[name]
        if r.dtype.kind != "f" or r.size == 0:
            continue
        m: dict = {}
        tokens = attention is not None and r.ndim == 3 and r.shape[:2] == attention.shape
        real = attention.astype(bool) if tokens else None
        r_real, o_real = (r[real], o[real]) if tokens else (r, o)
        cos = cosines(r_real, o_real)
        m.update(cos_mean=float(cos.mean()), cos_min=float(cos.min()),
                 max_abs_diff=float(np.abs(r_real.astype(np.float64) - o_real).max()),
                 max_abs=float(np.abs(r_real).max()))
        if tokens:
            w = attention[..., None].astype(np.float64)
            pooled = cosines((r * w).sum(1) / w.sum(1), (o * w).sum(1) / w.sum(1))
            m.update(pooled_cos_mean=float(pooled.mean()), pooled_cos_min=float(pooled.min()))
        if name in top1 and r.ndim >= 1 and r.shape[-1] > 1:
            agree = r.argmax(-1) == o.argmax(-1)
            m["top1_agreement"] = float((agree[real] if tokens else agree).mean())
        if name == lm_output and "input_ids" in inputs:
            m["perplexity"] = perplexity(o, inputs["input_ids"], attention)
            m["reference_perplexity"] = perplexity(r, inputs["input_ids"], attention)
        result[name] = m
    return result


def evaluate_onnx(args, command: str) -> dict:
    """The evaluation of `somatile eval onnx` (options ``args``, reproduced by ``command``)."""
    from somatile.eval.minilm import MINILM_FIELDS, calibrate_minilm, minilm_normalisers
    from somatile.model.files import read_npz

    t0 = time.time()
    keys = variant_keys()
    chosen = args.variants or list(keys)
    unknown = [v for v in chosen if v not in keys]
    if unknown:
        raise ValueError(f"--variants: unknown {unknown[0]!r}; expected keys of {list(keys)}")
    attention = cap.AttentionRun(args.onnx)   # a one-line message when onnx or onnxruntime is missing
    import onnxruntime as ort
    inputs, source = cap.read_inputs(args, attention.model, args.onnx)
    cal_inputs = None
    if args.calibrate_inputs is not None:
        if not Path(args.calibrate_inputs).is_file():
            raise ValueError(f"{args.calibrate_inputs}: no such file (expected an .npz like --inputs)")
        cal_inputs = read_npz(args.calibrate_inputs, "--calibrate-inputs")
    cal_inputs, eval_inputs = split_calibration(inputs, cal_inputs, args.calibration_rows, source,
                                                str(args.calibrate_inputs))
    cal_raw = attention.batches(cal_inputs, args.batch, args.calibrate_inputs or f"{source} (calibration rows)")
    session = ort.InferenceSession(attention.model.SerializeToString(), providers=["CPUExecutionProvider"])
    out_names = [o.name for o in attention.model.graph.output]
    cut = SoftmaxCut(attention.model, attention.sites, args.onnx)

    def run_all(run_one) -> dict:
        parts = [run_one(part) for part in cap.split_rows(eval_inputs, args.batch)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    reference = run_all(lambda part: dict(zip(out_names, session.run(out_names, part))))
    widest = [0]

    def softmax_and_width(layer, scores):
        widest[0] = max(widest[0], scores.shape[-1])
        return by_mask_blocks(float_softmax, layer, scores)
    through_cut = run_all(lambda part: cut.run(part, softmax_and_width))
    softmax_check = {o: {k: m[k] for k in ("max_abs_diff", "max_abs")}
                     for o, m in compare_outputs(reference, through_cut, eval_inputs, [], None).items()}
    cols = args.cols or max(widest[0], max(s.shape[-1] for s, _ in cal_raw))
    layer_logits, blocks = calibration_data(cal_raw, cols)
    # The wide grid search on the attention output is the slow part: only for the variants that read it.
    cal = calibrate_minilm(layer_logits, blocks=blocks if {"wide_pwl2", "wide_hccs"} & set(chosen) else None)
    normalisers = {SOFTMAX: float_softmax, **{MINILM_FIELDS[name]["key"]: f
                                              for name, f in minilm_normalisers(cal, cols).items()}}
    top1 = args.top1 if args.top1 is not None else [n for n in out_names if "logits" in n.lower()]
    lm_output = "logits" if (args.window or args.causal) else None
    if lm_output and ("logits" not in out_names or "input_ids" not in eval_inputs):
        raise ValueError(f"{args.onnx}: perplexity (--causal or --window) needs a graph output 'logits' and an "
                         f"input 'input_ids' (outputs: {out_names}, inputs: {sorted(eval_inputs)})")
    variants = {}
    for key in chosen:
        outputs = through_cut if key == SOFTMAX else run_all(
            lambda part, f=normalisers[key]: cut.run(part, lambda layer, scores: by_mask_blocks(f, layer, scores)))
        variants[key] = {"name": keys[key], **({} if key == SOFTMAX else MINILM_FIELDS[keys[key]]),
                         "outputs": compare_outputs(reference, outputs, eval_inputs, top1, lm_output)}
        print(f"  {key}: " + ", ".join(f"{o} cos {m['cos_mean']:.6f}" for o, m in variants[key]["outputs"].items()),
              file=sys.stderr)
    def rows_of(arrays):
        return len(next(iter(arrays.values())))
    results = {"model": str(args.onnx), "inputs": source, "calibration": str(args.calibrate_inputs or
               f"first {rows_of(cal_inputs)} rows of {source}"), "n_eval": rows_of(eval_inputs),
               "n_calibration": rows_of(cal_inputs), "cols": cols, "layers": len(attention.sites),
               "heads": int(cal.params[0].B.shape[0]), "mechanism": "graph cut at each attention Softmax",
               "softmax_tolerance": SOFTMAX_TOLERANCE, "machine": machine(), "command": command,
               "softmax_check": softmax_check,
               "variants": variants}
    results["seconds"] = round(time.time() - t0, 1)
    write_outputs(Path(args.out), results, onnx_markdown(results))
    return results


def onnx_markdown(r: dict) -> str:
    rows = []
    for key, v in r["variants"].items():
        for out, m in v["outputs"].items():
            rows.append([key, out, m["cos_mean"], m["cos_min"], m.get("pooled_cos_mean", "-"),
                         m.get("top1_agreement", "-"), m.get("perplexity", "-")])
    check = "; ".join(f"`{o}` {c['max_abs_diff']:.3g} of {c['max_abs']:.3g}" for o, c in r["softmax_check"].items())
    ppl = [m["reference_perplexity"] for v in r["variants"].values() for m in v["outputs"].values()
           if "reference_perplexity" in m][:1]
    return "\n".join([
        f"## {Path(r['model']).name}: integer normalisers in place of softmax",
        "",
        f"{r['n_eval']} evaluation rows of {r['inputs']}; calibration: {r['calibration']} ({r['n_calibration']} "
        f"rows, disjoint); {r['layers']} attention layers of {r['heads']} heads, integer rows padded to "
        f"{r['cols']} keys; reference = the unmodified graph under onnxruntime. Command: `{r['command']}`.",
        "",
        f"Mechanism check (exact softmax through the cut against onnxruntime, max |difference| of the largest "
        f"|value|): {check}."
        + (f" Reference perplexity {ppl[0]:.4f}." if ppl else ""),
        "",
        markdown_table(["variant", "output", "mean cosine", "min cosine", "pooled mean cosine", "top-1 agreement",
                        "perplexity"], rows),
        "",
    ])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `somatile eval onnx` (registered by somatile.eval.cli)."""
    parser.add_argument("--onnx", metavar="MODEL.onnx", required=True, help="the transformer graph")
    cap.add_input_arguments(parser)
    parser.add_argument("--calibrate-inputs", metavar="FILE.npz", default=None,
                        help="calibration rows (must not repeat an evaluation row); default: the first "
                             "--calibration-rows rows of the inputs")
    parser.add_argument("--calibration-rows", type=int, default=None,
                        help="calibrate on the first N rows, evaluate the rest (default a quarter)")
    parser.add_argument("--variants", nargs="+", default=None, metavar="KEY",
                        help="normalisers to evaluate (default all: " + " ".join(variant_keys()) + ")")
    parser.add_argument("--cols", type=int, default=None,
                        help="row length of the integer kernels (default: the longest key axis seen)")
    parser.add_argument("--causal", action="store_true",
                        help="a causal LM: report the next-token perplexity of output 'logits' (implied by --window)")
    parser.add_argument("--top1", nargs="*", default=None, metavar="OUTPUT",
                        help="outputs with a class axis last (default: outputs named like *logits*)")



def command_line(args) -> str:
    """The `somatile eval onnx` command that reproduces this run (the options given, plus --out)."""
    parts = [f"somatile eval onnx --out {args.out} --onnx {args.onnx}"]
    for name in ("inputs", "text", "tokenizer", "window", "calibrate_inputs", "calibration_rows", "cols"):
        if getattr(args, name) is not None:
            parts.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    for name, default in (("max_tokens", 128), ("batch", 8)):
        if getattr(args, name) != default:
            parts.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    if args.causal:
        parts.append("--causal")
    for name in ("variants", "top1"):
        if getattr(args, name) is not None:
            parts.append(f"--{name} {' '.join(getattr(args, name))}".rstrip())
    return " ".join(parts)
