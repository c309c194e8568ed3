"""`somatile compare`: fixed-point HCCS against float softmax on the host, per head.

Input: seeded synthetic logits (default, :mod:`somatile.model.synth`) or ``--logits FILE.npz`` with
``logits`` float (H, R, N) (or int8 with ``scale`` (H,): quantised logits after QAT), optional ``mask``
bool (H, R, N) (True = takes part) and optional ``values`` float (H, N, D). The calibration (:func:`somatile.model.calibrate.calibrate_params`) runs on the same logits.
Methods, each turned into probabilities (uint8 outputs / 255):

- ``softmax``: the float64 reference;
- ``hccs_float``: seed 003's float HCCS with the per-head c of the float search;
- ``int8_div`` / ``int8_clb``: the integer kernel on the int8 logits with the integer-searched (B, S, dmax);
- ``intexp``: somatile's integer-exp softmax on the int8 logits;
- ``deployed``: int8_div on HCCS heads and, on the heads marked fallback, the integer exp ``fallback_exp``
  names (``--fallback-exp``: somatile's intexp, what the PL tile runs, or aie4ml's exact-exp kernel, what
  the AI Engine runs): what that hardware would return;
- ``deployed_float``: its float reference (the float family the integers represent, exact softmax on
  fallback heads), which separates the approximation error from the integer rounding.

With ``--profile wide`` (the default) the logits become int16 base-2 logits and the methods are
:data:`WIDE_METHODS` (Q15 outputs / 32768), calibrated by :func:`calibrate.calibrate_wide_params`.

Per head and method: TV, KL (eps-smoothed and the seed's clamped form), max |p - q|, top-1 agreement (softmax's
top element among p's maxima; strict: p's unique maximum), row-sum
mean/min/max (clb rows are not normalised), and with values the relative attention-output error
||(P - Q) V|| / ||Q V||. Prints a table, writes ``compare.json`` and PNG plots to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from somatile.model import calibrate, hccs, intexp, quant, wide
from somatile.model.logits import add_input_arguments, head_metrics, load_input
from somatile.model.params import SOMATILE_EXP, check_fallback_exp

METHODS = ("hccs_float", "int8_div", "int8_clb", "intexp", "deployed", "deployed_float")
WIDE_METHODS = ("wide_exp", "wide_hccs|wide_pwl2", "deployed", "deployed_float")
"""Profile "wide" (int16 logits, Q15 probabilities): the integer exp, the calibrated exp-free normaliser,
the deployed mix (fallback heads on the integer exp) and its float reference."""


def method_outputs(logits, mask, params, float_c, *, impl="numba") -> dict[str, np.ndarray]:
    """Probabilities (H, R, N) float64 of every method (see the module doc) for calibrated parameters."""
    xq = quant.quantize_logits(logits, params.scale, mask)
    full_scale = float(hccs.UINT8_MAX if params.out == "uint8" else hccs.INT16_MAX)

    def to_p(y):
        return y.astype(np.float64) / full_scale

    common = dict(out=params.out, mask=mask, impl=impl)
    return {
        "hccs_float": hccs.hccs_float(logits, float_c, mask),
        "int8_div": to_p(hccs.hccs_int(xq, params.B, params.S, params.dmax, mode="div", **common)),
        "int8_clb": to_p(hccs.hccs_int(xq, params.B, params.S, params.dmax, mode="clb", **common)),
        "intexp": to_p(intexp.intexp_softmax(xq, params.exp_mult, **common)),
        "deployed": to_p(params.apply_int(xq, mask, impl=impl)),
        "deployed_float": params.apply_float(np.asarray(logits, np.float64), mask),
    }


def wide_outputs(logits, mask, params, *, impl="numba") -> dict[str, np.ndarray]:
    """Probabilities (H, R, N) float64 of :data:`WIDE_METHODS` for wide-profile parameters."""
    xw = wide.logits_from_float(logits, mask)
    one = float(wide.PROB_ONE)
    return {
        "wide_exp": wide.wide_softmax(xw, "exp", mask=mask, impl=impl) / one,
        f"wide_{params.normaliser}": wide.wide_softmax(xw, params.normaliser, params.B, params.S, params.dmax,
                                                       mask=mask, impl=impl) / one,
        "deployed": params.apply_int(xw, mask, impl=impl) / one,
        "deployed_float": params.apply_float(np.asarray(logits, np.float64), mask),
    }


def compare(logits, mask=None, values=None, *, scale=None, objective=calibrate.DEFAULT_OBJECTIVE,
            threshold=calibrate.DEFAULT_THRESHOLD, mode="div", out="uint8", progress=False, impl="numba",
            profile="paper", normaliser="hccs", fallback_exp=SOMATILE_EXP) -> dict:
    """Calibrate on ``logits`` (with the given int8 ``scale`` per head, or one chosen from the logits) and
    measure every method per head; returns the report (``params``, ``reference``, ``outputs`` are arrays
    and objects; :func:`json_report` makes it JSON-ready). ``profile`` "wide" calibrates ``normaliser``
    ("pwl2" or "hccs") with ``objective`` ("output", "tv" or None: output when values are given).
    ``fallback_exp`` (:data:`params.FALLBACK_EXPS`, checked before calibrating) is the integer exp of the
    fallback heads in ``params`` and in the ``deployed`` method, as `somatile calibrate` records it."""
    check_fallback_exp(fallback_exp, profile)
    x3, valid3, _ = hccs.as_heads(logits, mask, "logits", floating=True)
    if values is not None and (values.ndim != 3 or values.shape[:2] != (x3.shape[0], x3.shape[2])):
        raise ValueError(f"values: expected (H, N, D) = ({x3.shape[0]}, {x3.shape[2]}, D), got {values.shape}")
    q = hccs.softmax(x3, valid3)
    if profile == "wide":
        params = calibrate.calibrate_wide_params(x3, valid3, values, normaliser=normaliser, objective=objective,
                                                 threshold=threshold)
        objective = params.objective
        outputs = wide_outputs(x3, valid3, params, impl=impl)
        float_c = np.full(x3.shape[0], np.nan)
    else:
        params = calibrate.calibrate_params(x3, valid3, scale=scale, objective=objective, threshold=threshold,
                                            mode=mode, out=out, progress=progress, fallback_exp=fallback_exp)
        float_c = calibrate.calibrate_float(x3, valid3, objective=objective, threshold=threshold,
                                            progress=progress).c
        outputs = method_outputs(x3, valid3, params, float_c, impl=impl)
    valid = np.ones(x3.shape, bool) if valid3 is None else valid3
    heads = range(x3.shape[0])
    if progress:
        from tqdm import tqdm
        heads = tqdm(heads, desc="metrics", unit="head")
    per_head = []
    for h in heads:
        v = None if values is None else values[h].astype(np.float64)
        per_head.append({
            "head": h, "fallback": bool(params.fallback[h]), "c_float": float(float_c[h]),
            "B": int(params.B[h]), "S": int(params.S[h]), "dmax": int(params.dmax[h]), "scale": float(params.scale[h]),
            "calibration_error": float(params.error[h]),
            "methods": {name: head_metrics(q[h], p[h], valid[h], v) for name, p in outputs.items()},
        })
    summary = {name: {k: float(np.mean([ph["methods"][name][k] for ph in per_head]))
                      for k in per_head[0]["methods"][name]} for name in outputs}
    return {"shape": list(x3.shape), "objective": objective, "threshold": threshold, "mode": mode, "out": out,
            "profile": profile, "normaliser": params.normaliser, "fallback_exp": params.fallback_exp,
            "heads": per_head, "summary": summary, "params": params, "reference": q, "outputs": outputs}


def _top_method(report: dict) -> str:
    """The method whose top-1 agreement the table and plots single out: int8 div (paper), deployed (wide)."""
    return "deployed" if report.get("profile") == "wide" else "int8_div"


def format_table(report: dict) -> str:
    methods = list(report["summary"])
    top = _top_method(report)
    lines = [f"per-head total variation (0..1) against float softmax; objective {report['objective']}, "
             f"threshold {report['threshold']}, fallback heads on {report['fallback_exp']}'s integer exp",
             f"{'head':>4} {'c':>6} {'B':>5} {'S':>4} {'dmax':>4} " + " ".join(f"{m:>14}" for m in methods)
             + f" {'top1 ' + top.split('_')[-1]:>8} fallback"]
    for ph in report["heads"]:
        c = '-' if np.isnan(ph['c_float']) else f"{ph['c_float']:.2f}"
        lines.append(f"{ph['head']:>4} {c:>6} {ph['B']:>5} {ph['S']:>4} {ph['dmax']:>4} "
                     + " ".join(f"{ph['methods'][m]['tv']:>14.4f}" for m in methods)
                     + f" {ph['methods'][top]['top1']:>8.3f} {'yes' if ph['fallback'] else 'no'}")
    keys = list(report["summary"][methods[0]])
    lines += ["", "mean over heads", f"{'method':>14} " + " ".join(f"{k:>11}" for k in keys)]
    for m in methods:
        lines.append(f"{m:>14} " + " ".join(f"{report['summary'][m][k]:>11.4f}" for k in keys))
    return "\n".join(lines)


def write_plots(report: dict, out_dir: Path) -> list[Path]:
    """tv_per_head.png, row_sums.png, example_rows.png; matplotlib is imported here (Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(report["summary"])
    heads = [ph["head"] for ph in report["heads"]]
    paths = []
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        ax.bar(np.array(heads) + i * width, [ph["methods"][m]["tv"] for ph in report["heads"]], width, label=m)
    ax.set_xlabel("head"), ax.set_ylabel("total variation vs softmax"), ax.legend(fontsize=8)
    ax.set_title("per-head error of each normaliser")
    paths.append(out_dir / "tv_per_head.png")
    fig.tight_layout(), fig.savefig(paths[-1], dpi=110), plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for m in [m for m in methods if m not in ("hccs_float", "deployed", "deployed_float")]:
        ax.hist(report["outputs"][m].sum(axis=-1).ravel(), bins=80, alpha=0.6, label=m)
    ax.set_xlabel("row sum (1.0 = normalised)"), ax.set_ylabel("rows"), ax.legend()
    ax.set_title("row sums: clb rows are not normalised")
    paths.append(out_dir / "row_sums.png")
    fig.tight_layout(), fig.savefig(paths[-1], dpi=110), plt.close(fig)

    tv = [ph["methods"][_top_method(report)]["tv"] for ph in report["heads"]]
    picks = sorted({int(np.argmin(tv)), int(np.argmax(tv))})
    fig, axes = plt.subplots(1, len(picks), figsize=(6 * len(picks), 4), squeeze=False)
    for ax, h in zip(axes[0], picks):
        ax.plot(report["reference"][h, 0], "k-", lw=2, label="softmax")
        for m in methods:
            ax.plot(report["outputs"][m][h, 0], lw=1, label=m)
        ax.set_title(f"head {h}, row 0"), ax.set_xlabel("column"), ax.set_ylabel("weight")
    axes[0][0].legend(fontsize=8)
    paths.append(out_dir / "example_rows.png")
    fig.tight_layout(), fig.savefig(paths[-1], dpi=110), plt.close(fig)
    return paths


def json_report(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("params", "reference", "outputs")} | {
        "params": report["params"].to_dict()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser)
    calibrate.add_profile_arguments(parser)
    parser.add_argument("--threshold", type=float, default=calibrate.DEFAULT_THRESHOLD,
                        help="heads above this calibration error keep the exponential (default 0.3)")
    parser.add_argument("--out-type", choices=sorted(hccs.OUT_CODES), default="uint8")
    parser.add_argument("--out", metavar="DIR", default="build/compare",
                        help="JSON + PNG plots (default build/compare)")
    parser.add_argument("--save-params", metavar="FILE.yaml",
                        help="write the calibrated parameters as YAML (as somatile calibrate -o does, with the "
                             "--fallback-exp choice)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def run(args: argparse.Namespace) -> int:
    try:
        profile, normaliser, objective, fallback_exp = calibrate.profile_choice(args)
        data = load_input(args)
        report = compare(data.logits, data.mask, data.values, scale=data.scale, objective=objective,
                         threshold=args.threshold, out=args.out_type, progress=True, profile=profile,
                         normaliser=normaliser, fallback_exp=fallback_exp)
    except (TypeError, ValueError) as exc:
        print(f"somatile compare: {exc}")
        return 2
    print(f"input: {data.source}")
    print(format_table(report))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = json_report(report) | {"source": data.source}
    (out_dir / "compare.json").write_text(json.dumps(summary, indent=1) + "\n")
    written = [out_dir / "compare.json"]
    if not args.no_plots:
        written += write_plots(report, out_dir)
    if args.save_params:
        report["params"].to_yaml(args.save_params)
        written.append(Path(args.save_params))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
