"""all-MiniLM-L6-v2 as an ONNX graph, built with ``onnx.helper`` from the weights :mod:`somatile.model.minilm`
loads (no torch, no model hub): the test model of `somatile capture` (issue 26).

Contract of :func:`export_minilm`:

- graph inputs ``input_ids`` int64 (batch, sequence) and ``attention_mask`` int64 (batch, sequence), 1 = real
  token, 0 = padding (Hugging Face's names and meaning); token type 0 throughout, as in the numpy pass;
- graph outputs ``last_hidden_state`` float32 (batch, sequence, 384) and ``sentence_embedding`` float32
  (batch, 384): mean pooling over real tokens, then L2 normalisation (sentence-transformers' pooling);
- default opset :data:`OPSET` (ai.onnx), float32 weights (the safetensors file's own precision);
- per layer one ``Softmax`` over the last (key) axis, fed by ``Add(Mul(MatMul(Q, K^T), 1/sqrt(D)), mask)``
  where the mask is ``(1 - attention_mask) * float32_min`` broadcast over heads and query rows (what Hugging
  Face's BERT adds), and consumed by ``MatMul(probs, V)``: the pattern `somatile capture` looks for.

Node and tensor names carry the layer (``layer{i}/...``) so that a reader can follow the graph.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

OPSET = 17
"""LayerNormalization is an ai.onnx operator from opset 17 on; the rest is older."""


def export_minilm(path, model=None, *, opset: int = OPSET) -> Path:
    """Write all-MiniLM-L6-v2 (``model``: a :class:`~somatile.model.minilm.MiniLM`, default the installed one)
    as ONNX to ``path``; returns the path. See the module docstring for inputs, outputs and the attention
    pattern."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from somatile.model.minilm import MiniLM

    if opset < OPSET:
        raise ValueError(f"opset: expected >= {OPSET} (LayerNormalization), got {opset}")
    m = model if model is not None else MiniLM.load()
    H, D, C = m.n_heads, m.head_dim, m.hidden
    nodes: list = []
    inits: list = []

    def const(name: str, value) -> str:
        arr = np.asarray(value)
        arr = arr.astype(np.float32) if arr.dtype.kind == "f" else arr
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def linear(x: str, w: np.ndarray, b: np.ndarray, name: str) -> str:
        return node("Add", [node("MatMul", [x, const(name + ".w", w)], name + "/matmul"), const(name + ".b", b)],
                    name)

    def layer_norm(x: str, wb, name: str) -> str:
        return node("LayerNormalization", [x, const(name + ".w", wb[0]), const(name + ".b", wb[1])], name,
                    axis=-1, epsilon=m.eps)

    # Embeddings: word + position (0..T-1) + token type 0.
    seq_len = node("Gather", [node("Shape", ["input_ids"], "ids_shape"), const("one_i64", np.int64(1))],
                   "seq_len", axis=0)
    positions = node("Range", [const("zero_i64", np.int64(0)), seq_len, const("step_i64", np.int64(1))],
                     "positions")
    x = node("Add", [node("Gather", [const("word_embeddings", m.word), "input_ids"], "word_emb"),
                     node("Gather", [const("position_embeddings", m.pos), positions], "pos_emb")], "emb_sum")
    x = node("Add", [x, const("token_type0", m.type0)], "emb_typed")
    x = layer_norm(x, m.emb_ln, "emb_ln")

    # (1 - mask) * float32 min: a padded key drops out of every softmax row (exp underflows to 0).
    mask_f = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    additive = node("Mul", [node("Sub", [const("one_f", 1.0), mask_f], "mask_inv"),
                            const("mask_min", np.finfo(np.float32).min)], "mask_additive")
    additive = node("Unsqueeze", [additive, const("mask_axes", np.array([1, 2], dtype=np.int64))], "mask_bhrn")

    heads_shape = const("heads_shape", np.array([0, 0, H, D], dtype=np.int64))   # 0: keep batch and sequence
    merged_shape = const("merged_shape", np.array([0, 0, C], dtype=np.int64))
    scale = const("score_scale", 1.0 / math.sqrt(D))
    for i, L in enumerate(m.layers):
        p = f"layer{i}/"

        def heads(t: str, perm: list[int], name: str) -> str:
            return node("Transpose", [node("Reshape", [t, heads_shape], name + "_bthd")], name, perm=perm)

        q = heads(linear(x, L["wq"], L["bq"], p + "q"), [0, 2, 1, 3], p + "q_bhtd")
        k_t = heads(linear(x, L["wk"], L["bk"], p + "k"), [0, 2, 3, 1], p + "k_bhdt")
        v = heads(linear(x, L["wv"], L["bv"], p + "v"), [0, 2, 1, 3], p + "v_bhtd")
        scores = node("Mul", [node("MatMul", [q, k_t], p + "qk"), scale], p + "scores")
        probs = node("Softmax", [node("Add", [scores, additive], p + "scores_masked")], p + "probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], p + "ctx_bhtd")], p + "ctx_bthd", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merged_shape], p + "ctx")
        x = layer_norm(node("Add", [x, linear(ctx, L["wo"], L["bo"], p + "attn_out")], p + "attn_res"),
                       L["ln1"], p + "ln1")
        # Exact-erf GELU (opset 17 has no Gelu operator): 0.5 x (1 + erf(x / sqrt 2)).
        hid = linear(x, L["wi"], L["bi"], p + "ffn_in")
        erf = node("Erf", [node("Mul", [hid, const(p + "inv_sqrt2", 1.0 / math.sqrt(2.0))], p + "gelu_scaled")],
                   p + "gelu_erf")
        gelu = node("Mul", [node("Mul", [hid, const(p + "half", 0.5)], p + "gelu_half"),
                            node("Add", [erf, const(p + "one", 1.0)], p + "gelu_one")], p + "gelu")
        x = layer_norm(node("Add", [x, linear(gelu, L["wf"], L["bf"], p + "ffn_out")], p + "ffn_res"),
                       L["ln2"], p + "ln2")
    nodes[-1].output[0] = "last_hidden_state"
    nodes[-1].name = "last_hidden_state"

    # Mean over real tokens, then L2 normalisation (the norm is clamped like the numpy pass's 1e-12).
    mask_3d = node("Unsqueeze", [mask_f, const("pool_axes", np.array([2], dtype=np.int64))], "pool_mask")
    summed = node("ReduceSum", [node("Mul", ["last_hidden_state", mask_3d], "pool_masked"),
                                const("seq_axis", np.array([1], dtype=np.int64))], "pool_sum", keepdims=0)
    count = node("ReduceSum", [mask_3d, "seq_axis"], "pool_count", keepdims=0)
    mean = node("Div", [summed, count], "pool_mean")
    # sqrt(ReduceSum(x^2)), not ReduceL2, whose axes move from attribute to input at opset 18.
    sq_sum = node("ReduceSum", [node("Mul", [mean, mean], "pool_sq"), const("feat_axis", np.array([1], dtype=np.int64))],
                  "pool_sq_sum", keepdims=1)
    norm = node("Max", [node("Sqrt", [sq_sum], "pool_norm"), const("norm_floor", 1e-12)], "pool_norm_floor")
    node("Div", [mean, norm], "sentence_embedding")

    batch_seq = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes, "all-MiniLM-L6-v2",
        inputs=[helper.make_tensor_value_info("input_ids", TensorProto.INT64, batch_seq),
                helper.make_tensor_value_info("attention_mask", TensorProto.INT64, batch_seq)],
        outputs=[helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, batch_seq + [C]),
                 helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", C])],
        initializer=inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                   producer_name="somatile.eval.onnx_minilm")
    onnx.checker.check_model(onnx_model, full_check=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_model, str(path))
    return path


def batch_inputs(model, sentences) -> dict[str, np.ndarray]:
    """``input_ids`` and ``attention_mask`` int64 (batch, longest) of ``sentences``, padded at the end with
    token 0 and mask 0: the graph inputs of :func:`export_minilm`."""
    ids = [model.encode(s) for s in sentences]
    T = max(len(t) for t in ids)
    input_ids = np.zeros((len(ids), T), dtype=np.int64)
    mask = np.zeros((len(ids), T), dtype=np.int64)
    for b, t in enumerate(ids):
        input_ids[b, :len(t)] = t
        mask[b, :len(t)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}
