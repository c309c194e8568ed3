"""`somatile eval minilm`: what HCCS costs in quality on all-MiniLM-L6-v2 (somatile.model.minilm).

Real attention logits of every layer and head are collected on calibration sentences, padded to rows of
``--cols`` (128) elements with a mask (the integer HCCS rules depend on the row length), and calibrated per
head in float (seed 003's clip range c) and on int8 logits (the paper's B, S, Dmax; calibrate after
quantisation). Evaluation sentences (disjoint from the calibration sentences) are embedded with exact softmax
(the reference) and with each normaliser: float HCCS, int8 HCCS div and clb, the hybrid (heads whose
calibration error stays above 0.3 on integer exp, the others on int8 HCCS div), integer exp everywhere.
Reported: mean / minimum embedding cosine against the reference and nearest-neighbour agreement (is each
sentence's nearest other sentence the same as under the reference), plus the per-layer, per-head calibration
table and plots, in ``--out``/results.json, results.md and PNG files. The layers' calibrations and the
variants x chunks of ``--chunk`` sentences run as jobs of :mod:`somatile.eval.jobs` (``--jobs``,
``--cluster``); the numbers do not depend on how they ran.

``--dump-logits FILE.npz --layer L`` writes one layer's real logits (``logits`` float32 (12, R, cols),
``mask`` bool of the same shape) for ``somatile compare --logits``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from somatile.eval import text as textmod
from somatile.eval.report import machine, markdown_table, pyplot, write_outputs

MINILM_COLS = 128
MINILM_CHUNK = 32
"""Evaluation sentences per job (a variant's 256 sentences are 8 jobs of about a second each)."""


def pad_rows(logits: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(H, T, T) logits of one sentence -> (H, T, cols) float64 rows padded with masked zeros, and the mask."""
    H, T, N = logits.shape
    if N > cols:
        raise ValueError(f"logits: a row has {N} keys, more than cols = {cols}; raise --cols or shorten the "
                         "sentence")
    x = np.zeros((H, T, cols))
    x[..., :N] = logits
    mask = np.zeros((H, T, cols), bool)
    mask[..., :N] = True
    return x, mask


def mean_row_range(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per head (H,): mean over rows of (max - min) of the valid logits of (H, R, N)."""
    hi = np.where(mask, x, -np.inf).max(axis=-1)
    lo = np.where(mask, x, np.inf).min(axis=-1)
    return (hi - lo).mean(axis=-1)


def collect_minilm_logits(model, sentences: list[str], cols: int, progress: str | None = None):
    """Per layer: (logits (H, R, cols) float64, mask (H, R, cols) bool) over every query row of every sentence."""
    rows: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(model.n_layers)]
    model.embed(sentences, logits_hook=lambda n, layer, logits, mask: rows[layer].append(pad_rows(logits, cols)),
                progress=progress)
    return [(np.concatenate([x for x, _ in r], axis=1), np.concatenate([m for _, m in r], axis=1)) for r in rows]


@dataclass
class MiniLMCalibration:
    """Per layer: float clip ranges c (H,), their calibration error, the int8 HccsParams, and the wide
    profile's per-head parameters (normaliser -> per layer WideCalibration)."""

    c: list[np.ndarray]
    c_error: list[np.ndarray]
    params: list  # HccsParams per layer
    wide: dict = field(default_factory=dict)


def collect_minilm_blocks(model, sentences: list[str]):
    """Per layer: one (logits (H, T, T), mask (T, T), values (H, T, D)) block per sentence (what the wide
    calibration on the attention output reads)."""
    blocks: list[list] = [[] for _ in range(model.n_layers)]
    model.embed(sentences, logits_hook=lambda n, layer, logits, mask: blocks[layer].append([logits, mask]),
                values_hook=lambda n, layer, v: blocks[layer][-1].append(v))
    return blocks


def calibrate_layer(x: np.ndarray, mask: np.ndarray, blocks=None, progress: bool = False) -> tuple:
    """One layer's calibration (independent of the other layers): float c (H,), its error (H,), the int8
    HccsParams, and normaliser -> WideCalibration on the attention output of ``blocks`` (empty without)."""
    from somatile.model.calibrate import calibrate_float, calibrate_params, calibrate_wide
    fl = calibrate_float(x, mask)
    params = calibrate_params(x, mask, search="int", mode="div", progress=progress)
    wide = {norm: calibrate_wide(blocks, norm) for norm in ("pwl2", "hccs")} if blocks else {}
    return fl.c, fl.error, params, wide


def join_calibration(layers: list[tuple]) -> MiniLMCalibration:
    """:class:`MiniLMCalibration` from the :func:`calibrate_layer` results of every layer, in layer order."""
    wide = {norm: [w[norm] for *_, w in layers] for norm in layers[0][3]} if layers[0][3] else {}
    return MiniLMCalibration([c for c, *_ in layers], [e for _, e, *_ in layers], [p for _, _, p, _ in layers],
                             wide)


def calibrate_minilm(layer_logits, progress: bool = False, blocks=None) -> MiniLMCalibration:
    return join_calibration([calibrate_layer(x, mask, blocks[layer] if blocks else None, progress)
                             for layer, (x, mask) in enumerate(layer_logits)])


WORST_HEAD_FRACTION = 0.1


def minilm_normalisers(cal: MiniLMCalibration, cols: int) -> dict[str, Callable]:
    """Name -> normaliser(layer, logits (H,T,T), mask) for every evaluated variant (float HCCS and the
    int8 kernels on padded rows; uint8 outputs read as p / 255 exactly as the hardware emits them).

    Two hybrids: the calibration's own fallback flags (heads above the 0.3 threshold), and the worst
    ``WORST_HEAD_FRACTION`` of all heads by int8 calibration error on integer exp (a threshold a user can
    reach with ``--threshold`` in ``somatile calibrate``)."""
    import dataclasses

    from somatile.model import hccs, intexp, quant, wide

    errors = np.concatenate([p.error for p in cal.params])
    cut = np.quantile(errors, 1 - WORST_HEAD_FRACTION)
    worst = [dataclasses.replace(p, fallback=p.error >= cut) for p in cal.params]

    def int8_rows(layer, logits):
        x, mask = pad_rows(logits, cols)
        return quant.quantize_logits(x, cal.params[layer].scale, mask), mask, logits.shape[-1]

    def int_kernel(run, params=cal.params):
        def normaliser(layer, logits, mask):
            xq, pmask, n = int8_rows(layer, logits)
            return run(params[layer], xq, pmask)[..., :n] / 255.0
        return normaliser

    def hccs_mode(mode):
        return lambda p, xq, m: hccs.hccs_int(xq, p.B, p.S, p.dmax, mode=mode, mask=m)

    def wide_kernel(norm, calibrated=True):
        def normaliser(layer, logits, mask):
            w = cal.wide[norm][layer] if calibrated else None
            params = (w.B, w.S, w.dmax) if w is not None else (0, 256, wide.DMAX_MAX)
            return wide.wide_softmax(wide.logits_from_float(logits), norm, *params) / float(wide.PROB_ONE)
        return normaliser

    wide_variants = {"wide exp (int16 logits, Q15)": wide_kernel("exp", False),
                     "wide pwl2, model slope, no clip": wide_kernel("pwl2", False)}
    if cal.wide:
        wide_variants.update({"wide pwl2, calibrated on the output": wide_kernel("pwl2"),
                              "wide HCCS, calibrated on the output": wide_kernel("hccs")})
    return {**wide_variants,
        "float HCCS": lambda layer, logits, mask: hccs.hccs_float(logits, cal.c[layer]),
        "int8 HCCS div": int_kernel(hccs_mode("div")),
        "int8 HCCS clb": int_kernel(hccs_mode("clb")),
        "hybrid (int8 HCCS div + int-exp fallback)": int_kernel(lambda p, xq, m: p.apply_int(xq, m)),
        f"hybrid, worst {WORST_HEAD_FRACTION:.0%} of heads on int-exp": int_kernel(
            lambda p, xq, m: p.apply_int(xq, m), worst),
        "integer exp everywhere": int_kernel(lambda p, xq, m: intexp.intexp_softmax(xq, p.exp_mult, mask=m)),
    }


def _minilm_fields(key, profile, normaliser, integer):
    return {"key": key, "profile": profile, "normaliser": normaliser, "integer": integer, "ring": None,
            "sinks": None}


MINILM_FIELDS = {
    "wide exp (int16 logits, Q15)": _minilm_fields("wide_exp", "wide", "exp_int", True),
    "wide pwl2, model slope, no clip": _minilm_fields("wide_pwl2_uncal", "wide", "pwl2_int", True),
    "wide pwl2, calibrated on the output": _minilm_fields("wide_pwl2", "wide", "pwl2_int", True),
    "wide HCCS, calibrated on the output": _minilm_fields("wide_hccs", "wide", "hccs_int", True),
    "float HCCS": _minilm_fields("hccs", None, "hccs", False),
    "int8 HCCS div": _minilm_fields("int_hccs", "paper", "hccs_int", True),
    "int8 HCCS clb": _minilm_fields("int_hccs_clb", "paper", "hccs_int", True),
    "hybrid (int8 HCCS div + int-exp fallback)": _minilm_fields("hybrid", "paper", "hccs_int+exp_int", True),
    f"hybrid, worst {WORST_HEAD_FRACTION:.0%} of heads on int-exp": _minilm_fields("hybrid_worst", "paper",
                                                                                 "hccs_int+exp_int", True),
    "integer exp everywhere": _minilm_fields("int_exp", "paper", "exp_int", True),
}
"""The machine-readable fields of each MiniLM variant (the name is the row label of the report). MiniLM's
variants replace softmax on float logits (q, k, v stay float): ``integer`` says the normaliser is an
integer kernel."""


def embedding_agreement(ref: np.ndarray, emb: np.ndarray) -> dict:
    """Cosine of each embedding with its reference, and nearest-neighbour agreement (self excluded)."""
    cos = np.sum(ref * emb, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(emb, axis=1))

    def nearest(e):
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(axis=1)
    return {"cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
            "nn_agreement": float(np.mean(nearest(ref) == nearest(emb))), "cosines": cos.tolist()}


def dump_minilm_logits(path: Path, layer_logits, layer: int, rows: int | None = None) -> dict:
    if not 0 <= layer < len(layer_logits):
        raise ValueError(f"--layer: expected 0..{len(layer_logits) - 1}, got {layer}")
    x, mask = layer_logits[layer]
    if rows is not None:
        x, mask = x[:, :rows], mask[:, :rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, logits=x.astype(np.float32), mask=mask)
    return {"path": str(path), "layer": layer, "shape": list(x.shape)}


def evaluate_minilm(args, command: str) -> dict:
    """The MiniLM evaluation of `somatile eval minilm` (options ``args``, reproduced by ``command``)."""
    from somatile.model.calibrate import DEFAULT_THRESHOLD
    from somatile.model.minilm import MiniLM

    t0 = time.time()
    model = MiniLM.load()
    source = textmod.load_text(args.text)
    n_eval, n_cal = (8, 4) if args.quick else (args.sentences, args.calibration_sentences)
    pool = [s for s in textmod.sentences(source, None) if len(model.encode(s)) <= args.cols]
    if len(pool) < n_eval + n_cal:
        raise ValueError(f"evaluation text: only {len(pool)} sentences fit rows of --cols {args.cols} tokens, "
                         f"{n_eval + n_cal} needed")
    eval_sents, cal_sents = pool[:n_eval], pool[n_eval:n_eval + n_cal]
    cal_logits = collect_minilm_logits(model, cal_sents, args.cols, progress="MiniLM logits")
    results = {"model": "all-MiniLM-L6-v2", "machine": machine(), "quick": bool(args.quick),
               "text": str(args.text or textmod.DEFAULT_TEXT), "n_eval": n_eval, "n_calibration": n_cal,
               "cols": args.cols, "command": command}
    if args.dump_logits:
        results["dump"] = dump_minilm_logits(Path(args.dump_logits), cal_logits, args.layer, args.dump_rows)
    from somatile.eval import jobs as joblib
    cluster = getattr(args, "cluster", None)
    n_jobs = joblib.check(getattr(args, "jobs", 1), cluster)
    chunk = getattr(args, "chunk", MINILM_CHUNK)
    chunks = [eval_sents[i:i + chunk] for i in range(0, n_eval, chunk)]

    def run_jobs(work: list[dict], labels: list[str], desc: str) -> list:
        return joblib.run(minilm_job, work, n_jobs=n_jobs, cluster=cluster, labels=labels, desc=desc)

    def chunk_label(i: int) -> str:
        return f"sentences {i * chunk}..{min((i + 1) * chunk, n_eval) - 1}"

    # First the layers' calibrations beside the reference embeddings, then every variant on every chunk.
    blocks = collect_minilm_blocks(model, cal_sents)
    n_layers = len(cal_logits)
    first = run_jobs([{"layer": l, "logits": x, "mask": m, "blocks": blocks[l]} for l, (x, m) in enumerate(cal_logits)]
                     + [{"normaliser": None, "sentences": c} for c in chunks],
                     [f"layer {l} calibration" for l in range(n_layers)]
                     + [f"reference {chunk_label(i)}" for i in range(len(chunks))], "MiniLM calibration")
    cal = join_calibration(first[:n_layers])
    reference = np.concatenate(first[n_layers:])
    objective = cal.params[0].objective
    results["calibration"] = {
        "objective": objective, "threshold": DEFAULT_THRESHOLD,
        "heads": [{"layer": l, "head": h, "c": float(cal.c[l][h]), "float_error": float(cal.c_error[l][h]),
                   "B": int(p.B[h]), "S": int(p.S[h]), "dmax": int(p.dmax[h]), "scale": float(p.scale[h]),
                   "int_error": float(p.error[h]), "fallback": bool(p.fallback[h]),
                   "mean_row_range": float(spread[h])}
                  for l, ((x, m), p) in enumerate(zip(cal_logits, cal.params))
                  for spread in [mean_row_range(x, m)] for h in range(len(p.B))],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for l, p in enumerate(cal.params):
        p.to_yaml(out / f"hccs_params_layer{l}.yaml")
    results["params_yaml"] = [str(out / f"hccs_params_layer{l}.yaml") for l in range(len(cal.params))]
    names = list(minilm_normalisers(cal, args.cols))
    embedded = run_jobs([{"normaliser": name, "cal": cal, "cols": args.cols, "sentences": c}
                         for name in names for c in chunks],
                        [f"{name} {chunk_label(i)}" for name in names for i in range(len(chunks))],
                        "MiniLM variants x sentences")
    results["variants"] = {name: {**MINILM_FIELDS[name], **embedding_agreement(
        reference, np.concatenate(embedded[v * len(chunks):(v + 1) * len(chunks)]))} for v, name in enumerate(names)}
    results["jobs"] = {"n_jobs": n_jobs, "cluster": cluster, "chunk": chunk,
                       "count": n_layers + len(chunks) * (1 + len(names))}
    results["seconds"] = round(time.time() - t0, 1)
    _minilm_plots(out, results)
    markdown = minilm_markdown(results)
    write_outputs(out, results, markdown)
    return results


def minilm_job(job: dict) -> tuple | np.ndarray:
    """A job of :mod:`somatile.eval.jobs` (runs in any process): one layer's :func:`calibrate_layer` (a job
    with ``layer``), or the embeddings of a chunk of sentences under one of :func:`minilm_normalisers`
    (``normaliser`` None: exact softmax, the reference). The model is loaded once per process."""
    from somatile.model.minilm import MiniLM
    if "layer" in job:
        return calibrate_layer(job["logits"], job["mask"], job["blocks"])
    name = job["normaliser"]
    normaliser = None if name is None else minilm_normalisers(job["cal"], job["cols"])[name]
    return MiniLM.load().embed(job["sentences"], normaliser=normaliser)


def minilm_markdown(r: dict) -> str:
    rows = [[name, v["cos_mean"], v["cos_min"], v["nn_agreement"]] for name, v in r["variants"].items()]
    cal = r["calibration"]
    heads = [[h["layer"], h["head"], h["mean_row_range"], h["c"], h["float_error"], h["B"], h["S"], h["dmax"],
              h["scale"], h["int_error"], "yes" if h["fallback"] else "no"] for h in cal["heads"]]
    n_fb = sum(h["fallback"] for h in cal["heads"])
    return "\n".join([
        f"## MiniLM (all-MiniLM-L6-v2): HCCS in place of softmax",
        "",
        f"{r['n_eval']} evaluation sentences of {Path(r['text']).name}, {r['n_calibration']} calibration "
        f"sentences (disjoint), rows padded "
        f"to {r['cols']} keys; reference = exact float softmax (float64 forward). Command: `{r['command']}`.",
        "",
        markdown_table(["normaliser", "mean cosine", "min cosine", "NN agreement"], rows),
        "",
        f"Per-head calibration (objective `{cal['objective']}`; int8 search on the quantised logits; "
        f"{n_fb} of {len(heads)} heads above the {cal['threshold']} threshold go to the integer-exp fallback in "
        "the first hybrid):",
        "",
        markdown_table(["layer", "head", "row range", "float c", "float err", "B", "S", "dmax", "scale",
                        "int8 err", "fallback"], heads),
        "",
    ])


def _minilm_plots(out: Path, r: dict) -> None:
    plt = pyplot()
    heads = r["calibration"]["heads"]
    L = max(h["layer"] for h in heads) + 1
    H = max(h["head"] for h in heads) + 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, key, title in ((axes[0], "float_error", "float HCCS (c)"), (axes[1], "int_error", "int8 HCCS (B,S,Dmax)")):
        grid = np.zeros((L, H))
        for h in heads:
            grid[h["layer"], h["head"]] = h[key]
        im = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_title(f"calibration error ({r['calibration']['objective']}): {title}")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(out / "calibration_error.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = list(r["variants"])
    ax.boxplot([np.array(r["variants"][n]["cosines"]) for n in names], orientation="horizontal")
    ax.set_yticks(range(1, len(names) + 1), names, fontsize=8)
    ax.set_xlabel("embedding cosine against exact softmax")
    fig.tight_layout()
    fig.savefig(out / "embedding_cosine.png", dpi=110)
    plt.close(fig)
