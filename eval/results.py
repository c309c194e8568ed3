"""docs/results.md from the results.json files of `somatile eval` runs: machine, date, commands, every
number, and the sentences that compare rows (computed from the numbers, never typed in).

    python -m somatile.eval --write-results docs/results.md build/eval
"""

from __future__ import annotations

import json
from pathlib import Path

from somatile.eval.minilm import minilm_markdown
from somatile.eval.smollm2 import smollm2_markdown


def reference_check(r: dict) -> list[str]:
    """The full-attention run over every window (``--only full --long-window 0``) against 27.774."""
    from somatile.model.smollm2 import REFERENCE_PPL
    full = next((v for v in r["variants"] if v["key"] == "full" and v.get("ppl")), None)
    if full is None:
        return []
    return ["## Reference check", "",
            f"Full attention over all {full['n_windows']} windows of {r['window']} tokens of the first "
            f"{r['chars']:,} characters ({full['scored']:,} scored tokens): perplexity {full['ppl']:.4f}, "
            f"{100 * (full['ppl'] / REFERENCE_PPL - 1):+.2f} % from the reference {REFERENCE_PPL} "
            f"(numpy and Hugging Face transformers on the same GGUF). Command: `{r['command']}`.", ""]


def findings(found: dict) -> list[str]:
    """Sentences computed from the results (never typed in): each names the rows it compares."""
    lines = []
    for name in ("minilm", "minilm_other"):
        if name not in found:
            continue
        v = found[name]["variants"]
        where = "MiniLM" if name == "minilm" else f"MiniLM on {Path(found[name]['text']).name}"
        ranked = sorted(v.items(), key=lambda kv: -kv[1]["cos_mean"])
        lines.append(f"{where}, " + "; ".join(f"{n}: mean cosine {m['cos_mean']:.6f}, min {m['cos_min']:.4f}, "
                                              f"NN agreement {m['nn_agreement']:.1%}" for n, m in ranked)
                     + " (targets: wide integer exp >= 0.999; best exp-free >= 0.995 and >= 95 %).")
    for name in ("smollm2", "smollm2_other"):
        if name not in found:
            continue
        rows = {r["key"]: r for r in found[name]["variants"] if r.get("ppl")}
        full = rows.get("full")
        where = "SmolLM2" if name == "smollm2" else f"SmolLM2 on {Path(found[name]['text']).name}"

        def vs(key, base, label):
            if key in rows and base in rows:
                a, b = rows[key]["ppl"], rows[base]["ppl"]
                lines.append(f"{where}, {label}: perplexity {a:.3f} against {b:.3f} ({a / b:.4f}x, "
                             f"{100 * (a / b - 1):+.2f} %; rows `{rows[key]['name']}` vs `{rows[base]['name']}`).")
        vs("seed", "full", "the seed preset against full attention")
        vs("ring64", "full", "a plain ring of 64 against full attention")
        vs("sinks4_ring60", "ring64", "4 sinks added to a 64-slot row")
        fields = [k for k in rows if k.startswith("field_")]
        if fields and "sinks4_ring60" in rows:
            best = min(fields, key=lambda k: rows[k]["ppl"])
            vs(best, "sinks4_ring60", "the best far-field variant against the same ring without a field")
        vs("hccs", "default", "float HCCS as near-field normaliser against softmax on the same ring")
        vs("int_hccs", "default", "the integer path (int8 q/k/v, integer HCCS) against the float ring")
        vs("int_exp", "default", "int8 q/k/v with the integer exp (quantisation alone) against the float ring")
        vs("wide_exp", "default", "wide profile with the integer exp against the float ring (target <= 1.02x)")
        best = min((k for k in ("wide_pwl2", "wide_pwl2_uncal", "wide_hccs", "wide_hccs_hybrid") if k in rows),
                   key=lambda k: rows[k]["ppl"], default=None)
        if best:
            vs(best, "default", "the best exp-free normaliser of the wide profile against the float ring "
                                "(target <= 1.10x)")
        vs("wide_exp_per_head", "int_exp", "lever 1+2, int16 logits, Q15 probabilities and a 32-bit row sum "
                                           "(per-head scales as before), against the paper profile's integer exp")
        vs("wide_exp_no_smooth", "wide_exp_per_head", "lever 4, per-channel K/V scales, against per-head scales")
        vs("wide_exp", "wide_exp_no_smooth", "lever 3, K smoothing, against the same without it")
        vs("paper_exp_levers", "int_exp", "levers 3+4 inside the paper profile (int8 logits, uint8 "
                                          "probabilities)")
        vs("wide_pwl2", "wide_exp", "the exp-free pwl2 against the integer exp (both wide)")
        vs("wide_pwl2", "wide_pwl2_uncal", "pwl2 calibrated per head on the attention output against its "
                                           "uncalibrated form")
        vs("wide_hccs", "int_hccs", "HCCS in the wide profile against HCCS in the paper profile")
        vs("wide_hccs_hybrid", "wide_hccs", "the hybrid (integer exp on the 10% worst heads) against wide HCCS")
        if full and "sfa" in rows:
            vs("sfa", "full", "seed 001's SFA enhancement on full attention (the seed claims -5.79 %)")
    return lines


def write_results(path: Path, eval_dir: Path) -> str:
    """docs/results.md from ``eval_dir``/{minilm,smollm2}/results.json: machine, date, commands, numbers."""
    parts = []
    found = {}
    for name in ("minilm", "minilm_other", "smollm2", "smollm2_other"):
        f = eval_dir / name / "results.json"
        if f.is_file():
            found[name] = json.loads(f.read_text())
    if not found:
        raise FileNotFoundError(f"--write-results: no results.json under {eval_dir}/minilm or {eval_dir}/smollm2; "
                                "run `somatile eval minilm --out ...` and `somatile eval smollm2 --out ...` first")
    m = next(iter(found.values()))["machine"]
    parts += ["# Results on real models", "",
              "Measured with the commands listed below (`make eval` runs the same evaluations in one process "
              "each, without a time budget); numpy forward passes, no torch at run time. Every number below is "
              "read from the results.json files of those runs and is reported whatever it shows.", "",
              f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, numpy {m['numpy']}, "
              f"{m['platform']}. Date: {m['date']}.", "", "Commands:", ""]
    parts += [f"- `{found[n]['command']}` ({found[n]['seconds']:.0f} s)" for n in found]
    parts += [f"- `python -m somatile.eval --write-results {path} {eval_dir}`", ""]
    reference = eval_dir / "reference" / "results.json"
    if reference.is_file():
        parts += reference_check(json.loads(reference.read_text()))
    summary = findings(found)
    if summary:
        parts += ["## What the numbers say", ""] + [f"- {line}" for line in summary] + [""]
    if "minilm" in found:
        parts.append(minilm_markdown(found["minilm"]))
    if "minilm_other" in found:
        parts.append(minilm_markdown(found["minilm_other"]).replace(
            "## MiniLM (all-MiniLM-L6-v2):", f"## MiniLM on other text ({Path(found['minilm_other']['text']).name}):", 1))
    if "smollm2" in found:
        parts.append(smollm2_markdown(found["smollm2"]))
    if "smollm2_other" in found:
        parts.append(smollm2_markdown(found["smollm2_other"]).replace(
            "## SmolLM2-135M:", f"## SmolLM2-135M on other text ({Path(found['smollm2_other']['text']).name}):", 1))
    missing = [n for n in ("minilm", "smollm2") if n not in found]
    if missing:
        parts.append(f"Not measured in this run: {', '.join(missing)}.\n")
    text = "\n".join(parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text
