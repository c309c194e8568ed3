"""Per-head HCCS calibration by grid search, on float logits or directly on int8 logits; `somatile calibrate`.

The objectives ``kl_seed``, ``kl_eps`` and ``tv`` (the default: see docs/calibration.md for the evidence) are
defined per row in :mod:`somatile.model.logits`, which also reads the input logits both this command and
`somatile compare` take.

A head whose best objective stays above ``threshold`` (default 0.3, a project heuristic from seed 003, not
from the paper) is marked ``fallback``: it keeps the exponential (integer-exp softmax on hardware).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import numba
import numpy as np

from somatile.model import hccs, nbcache, quant
from somatile.model.logits import (OBJECTIVES, add_input_arguments, head_metrics, load_input, objective_term,
                                   row_objective)
from somatile.model.params import FALLBACK_EXPS, SOMATILE_EXP, HccsParams

# Its kernels inline @njit code of these files: a change there must reach this module's numba cache.
nbcache.drop_stale(__file__, ("calibrate.py", "hccs.py", "logits.py"))

DEFAULT_OBJECTIVE = "tv"
DEFAULT_THRESHOLD = 0.3
DEFAULT_C_RANGE = (0.5, 20.0)
DEFAULT_STEPS = 80


@numba.njit(cache=True, nogil=True)
def _float_grid(dist_sorted, q_sorted, n_valid, candidates, objective, out):
    """Mean objective of float HCCS for each clip c = candidates[k] (ascending). Rows hold their valid
    distances m - x sorted ascending (then padding), q reordered alike, n_valid (R,) valid counts. Clipped
    elements (d >= c, p = 0) form a suffix whose contribution comes from suffix sums, so a candidate costs
    only its unclipped prefix; the result equals :func:`row_objective` of :func:`hccs.hccs_float`."""
    rows, n = dist_sorted.shape
    acc = np.zeros(candidates.shape[0])
    tail = np.empty(n + 1)
    counted = 0
    for r in range(rows):
        nv = n_valid[r]
        if nv == 0:
            continue
        counted += 1
        tail[nv] = 0.0
        for i in range(nv - 1, -1, -1):
            tail[i] = tail[i + 1] + objective_term(q_sorted[r, i], 0.0, nv, objective)
        k = 0
        dsum = 0.0
        for j in range(candidates.shape[0]):
            c = candidates[j]
            while k < nv and dist_sorted[r, k] < c:
                dsum += dist_sorted[r, k]
                k += 1
            total = k * c - dsum
            v = tail[k]
            for i in range(k):
                v += objective_term(q_sorted[r, i], (c - dist_sorted[r, i]) / total, nv, objective)
            acc[j] += v
    for j in range(candidates.shape[0]):
        out[j] = acc[j] / max(counted, 1)


@numba.njit(cache=True, nogil=True)
def _int_grid(x, valid, q, candidates, objective, out):
    """Mean objective of the exact integer kernel (div, uint8, as probabilities /255) for each candidate
    (B, S, dmax) = candidates[k]."""
    rows, n = x.shape
    y = np.empty(n, np.int64)
    p = np.empty(n)
    for k in range(candidates.shape[0]):
        acc = 0.0
        counted = 0
        for r in range(rows):
            total = hccs.hccs_row(x[r], valid[r], candidates[k, 0], candidates[k, 1], candidates[k, 2],
                                  hccs.MODE_DIV, hccs.OUT_UINT8, y)
            if total <= 0:
                continue
            for i in range(n):
                p[i] = y[i] / 255.0
            acc += row_objective(q[r], p, valid[r], objective)
            counted += 1
        out[k] = acc / max(counted, 1)


@dataclasses.dataclass
class Calibration:
    """Result of a per-head grid search.

    candidates: the grid (K,) of clip ranges (float search) or (K, 3) integer (B, S, dmax) (integer search);
    curve: (H, K) mean objective per head and candidate; best: (H,) index of the best candidate; error:
    (H,) its value; fallback: error > threshold; objective, threshold: as used.
    """

    candidates: np.ndarray
    curve: np.ndarray
    best: np.ndarray
    error: np.ndarray
    fallback: np.ndarray
    objective: str
    threshold: float

    @property
    def c(self) -> np.ndarray:
        """Best clip range per head in logit units (float search only)."""
        if self.candidates.ndim != 1:
            raise ValueError("c: this calibration searched integer (B, S, dmax); use .int_params")
        return self.candidates[self.best]

    @property
    def int_params(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Best integer (B, S, dmax) per head (integer search only)."""
        if self.candidates.ndim != 2:
            raise ValueError("int_params: this calibration searched float c; convert with quant.int_params_from_clip")
        chosen = self.candidates[self.best]
        return chosen[:, 0], chosen[:, 1], chosen[:, 2]


def _finish(candidates, curve, objective, threshold) -> Calibration:
    best = np.nanargmin(curve, axis=1)
    error = curve[np.arange(curve.shape[0]), best]
    return Calibration(candidates, curve, best, error, error > threshold, objective, float(threshold))


def _heads_progress(heads: int, progress: bool, desc: str):
    if not progress:
        return range(heads)
    from tqdm import tqdm
    return tqdm(range(heads), desc=desc, unit="head")


def calibrate_float(logits: np.ndarray, mask=None, *, c_range=DEFAULT_C_RANGE, steps: int = DEFAULT_STEPS,
                    objective: str = DEFAULT_OBJECTIVE, threshold: float = DEFAULT_THRESHOLD,
                    progress: bool = False) -> Calibration:
    """Seed 003's per-head search over c in linspace(*c_range, steps) on float logits (H, R, N) or (R, N).

    The reference is the exact softmax of the same logits; masks as in :func:`hccs.softmax`.
    """
    code = hccs.code_of(OBJECTIVES, "objective", objective)
    lo, hi = (float(v) for v in c_range)
    if not (0 < lo <= hi and math.isfinite(hi)) or steps < 1:
        raise ValueError(f"c_range/steps: expected 0 < lo <= hi and steps >= 1, got {c_range}, {steps}")
    dist, valid, squeeze = hccs.float_distances(logits, mask)
    candidates = np.linspace(lo, hi, int(steps))
    q = hccs.softmax(logits, mask)
    q = q[None] if squeeze else q
    n_valid = valid.sum(axis=-1)
    curve = np.empty((dist.shape[0], candidates.size))
    for h in _heads_progress(dist.shape[0], progress, "calibrate (float)"):
        order = np.argsort(dist[h], axis=-1, kind="stable")
        _float_grid(np.take_along_axis(dist[h], order, -1), np.take_along_axis(q[h], order, -1), n_valid[h],
                    candidates, code, curve[h])
    return _finish(candidates, curve, objective, threshold)


def int_candidates(cols: int, dmax_values=None, floors=(0.0,)) -> np.ndarray:
    """Integer grid (K, 3) of (B, S, dmax) legal for ``cols``, ordered by floor fraction then dmax: one
    :func:`quant.int_params_for` per floor fraction f (0 = the seed's zero floor, raised to the floor-mass
    minimum) and dmax in ``dmax_values`` (default 1..:func:`quant.dmax_cap`)."""
    d_cap = quant.dmax_cap(cols)
    dmax_values = range(1, d_cap + 1) if dmax_values is None else [int(d) for d in dmax_values if 1 <= d <= d_cap]
    rows = [params for f in floors for d in dmax_values
            if (params := quant.int_params_for(d, f, cols)) is not None]
    if not rows:
        raise ValueError(f"cols = {cols}: the grid (dmax {list(dmax_values)}, floors {list(floors)}) is empty")
    return np.array(rows, np.int64)


def calibrate_int(x: np.ndarray, scale, mask=None, *, candidates=None, objective: str = DEFAULT_OBJECTIVE,
                  threshold: float = DEFAULT_THRESHOLD, reference=None, stride: int = 4,
                  progress: bool = False) -> Calibration:
    """Integer search on int8 logits (H, R, N) (seed 003's "calibrate after QAT"): candidates (B, S, dmax)
    of :func:`int_candidates` (or ``candidates``, in grid order) run through the exact integer kernel (div,
    uint8) and are scored against ``reference`` (float (H, R, N) probabilities; default: softmax of
    x*scale). ``stride`` > 1 searches coarse to fine: every stride-th candidate, then all within one stride
    of the best (candidates not evaluated stay NaN in ``curve``); ``stride=1`` evaluates the whole grid."""
    code = hccs.code_of(OBJECTIVES, "objective", objective)
    x3, valid3, _ = hccs.as_heads(x, mask)
    heads = x3.shape[0]
    scale = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (heads,))
    candidates = int_candidates(x3.shape[-1]) if candidates is None else np.asarray(candidates, np.int64)
    for row in candidates:
        hccs.check_params(row[0], row[1], row[2], x3.shape[-1])
    if reference is None:
        reference = hccs.softmax(x3.astype(np.float64) * scale[:, None, None], valid3)
    elif reference.shape != x3.shape:
        raise ValueError(f"reference: expected probabilities of shape {x3.shape}, got {reference.shape}")
    if stride < 1:
        raise ValueError(f"stride: expected >= 1, got {stride}")
    curve = np.full((heads, len(candidates)), np.nan)
    for h in _heads_progress(heads, progress, "calibrate (int8)"):
        valid = np.empty((x3.shape[1], 0), np.bool_) if valid3 is None else np.ascontiguousarray(valid3[h])
        args = (np.ascontiguousarray(x3[h]), valid, np.ascontiguousarray(reference[h], np.float64))
        coarse = np.arange(0, len(candidates), stride)
        fine = np.empty(0, np.int64)
        for chosen in (coarse, fine):
            if chosen is fine:
                best = int(np.nanargmin(curve[h]))
                chosen = np.setdiff1d(np.arange(max(best - stride + 1, 0), min(best + stride, len(candidates))),
                                      coarse)
            values = np.empty(len(chosen))
            _int_grid(*args, np.ascontiguousarray(candidates[chosen]), code, values)
            curve[h, chosen] = values
    return _finish(candidates, curve, objective, threshold)


def calibrate_params(logits: np.ndarray, mask=None, *, scale=None, search: str = "int", mode: str = "div",
                     out: str = "uint8", objective: str = DEFAULT_OBJECTIVE, threshold: float = DEFAULT_THRESHOLD,
                     c_range=DEFAULT_C_RANGE, steps: int = DEFAULT_STEPS, progress: bool = False,
                     fallback_exp: str = SOMATILE_EXP) -> HccsParams:
    """Float logits (H, R, N) -> a complete :class:`HccsParams`: per-head int8 scales (``scale``, or
    max |logit| / 127 when None), the integer exp of its fallback heads named by ``fallback_exp``
    (:data:`params.FALLBACK_EXPS`: somatile's for the PL tile, aie4ml's for the AI Engine), then
    either the integer search on the quantised logits against the float softmax (``search="int"``) or the
    float search over c converted with :func:`quant.int_params_from_clip` (``search="float"``)."""
    x3, valid3, _ = hccs.as_heads(logits, mask, "logits", floating=True)
    if scale is None:
        scale = quant.choose_scales(x3, valid3)
    else:
        scale = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (x3.shape[0],)).copy()
    xq = quant.quantize_logits(x3, scale, valid3)
    if search == "int":
        cal = calibrate_int(xq, scale, valid3, objective=objective, threshold=threshold,
                            reference=hccs.softmax(x3, valid3), progress=progress)
        B, S, dmax = cal.int_params
        c = quant.float_params_from_int(B, S, dmax, scale)[2]
    elif search == "float":
        cal = calibrate_float(x3, valid3, c_range=c_range, steps=steps, objective=objective, threshold=threshold,
                              progress=progress)
        c = cal.c
        B, S, dmax = quant.int_params_from_clip(c, scale, x3.shape[-1])
    else:
        raise ValueError(f"search: expected 'int' or 'float', got {search!r}")
    return HccsParams(B=B, S=S, dmax=dmax, fallback=cal.fallback, scale=scale, cols=x3.shape[-1], mode=mode,
                      out=out, c=c, error=cal.error, objective=objective, fallback_exp=fallback_exp)


def study_objectives(logits: np.ndarray, mask=None, values=None, *, scale=None, search: str = "int",
                     threshold: float = DEFAULT_THRESHOLD, progress: bool = False) -> list[dict]:
    """Evidence for the default objective: calibrate with each objective on the first half of the rows and
    measure the result on the second half (held out) with every metric of `somatile compare`.

    Returns one dict per objective: mean over heads of tv, kl_eps, kl_seed, top1, out_err (when values are
    given) for the deployed-style output (integer div kernel for ``search="int"``, float HCCS for
    ``"float"``), and the number of heads marked fallback at ``threshold``.
    """
    x3, valid3, _ = hccs.as_heads(logits, mask, "logits", floating=True)
    half = x3.shape[1] // 2
    if half < 1:
        raise ValueError(f"logits: need at least 2 rows per head to hold half out, got {x3.shape[1]}")
    valid = np.ones(x3.shape, bool) if valid3 is None else valid3
    train, test = (x3[:, :half], valid[:, :half]), (x3[:, half:], valid[:, half:])
    q = hccs.softmax(*test)
    rows = []
    for objective in sorted(OBJECTIVES):
        params = calibrate_params(*train, scale=scale, search=search, objective=objective, threshold=threshold,
                                  progress=progress)
        if search == "int":
            xq = quant.quantize_logits(test[0], params.scale, test[1])
            p = hccs.hccs_int(xq, params.B, params.S, params.dmax, mask=test[1]) / 255.0
        else:
            p = hccs.hccs_float(test[0], params.c, test[1])
        per_head = [head_metrics(q[h], p[h], test[1][h], None if values is None else values[h])
                    for h in range(x3.shape[0])]
        rows.append({"objective": objective, "fallback_heads": int(params.fallback.sum())}
                    | {k: float(np.mean([m[k] for m in per_head])) for k in per_head[0]
                       if not k.startswith("rowsum")})
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser)
    parser.add_argument("--search", choices=("int", "float"), default="int",
                        help="integer search on the int8 logits (default) or float search over c")
    add_profile_arguments(parser)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="heads whose best objective exceeds this keep the exponential (default 0.3)")
    parser.add_argument("--c-range", type=float, nargs=2, default=DEFAULT_C_RANGE, metavar=("LO", "HI"),
                        help="float search: clip range grid bounds in logit units (default 0.5 20)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="float search: grid steps (default 80)")
    parser.add_argument("--mode", choices=sorted(hccs.MODE_CODES), default="div")
    parser.add_argument("--out-type", choices=sorted(hccs.OUT_CODES), default="uint8")
    parser.add_argument("-o", "--output", help="YAML file for the calibrated parameters (required unless --study)")
    parser.add_argument("--study", action="store_true",
                        help="instead of writing parameters: calibrate with every objective on half the rows, "
                             "measure on the other half, print a markdown table (docs/calibration.md)")


PROFILE_DEFAULT = "wide"
"""The profile `somatile calibrate` and `compare` use unless told (docs/results.md: the one that keeps a
language model's accuracy)."""


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """--profile, --normaliser, --objective and --fallback-exp, shared by `somatile calibrate` and `somatile
    compare` (whose --save-params file records the fallback exp the same way)."""
    parser.add_argument("--profile", choices=("paper", "wide"), default=PROFILE_DEFAULT,
                        help=f"integer profile (docs/numerics.md; default {PROFILE_DEFAULT}): paper = the HCCS "
                             "paper's int8/uint8 kernel ABI, wide = int16 logits and Q15 probabilities")
    parser.add_argument("--normaliser", choices=("hccs", "pwl2"), default=None,
                        help="exp-free normaliser to calibrate (default: pwl2 in profile wide, hccs in paper; "
                             "pwl2 exists only in profile wide)")
    parser.add_argument("--objective", choices=sorted(OBJECTIVES) + ["output"], default=None,
                        help=f"calibration objective (default: {DEFAULT_OBJECTIVE} in profile paper; in profile "
                             "wide output (the attention output error, needs values) or tv)")
    parser.add_argument("--fallback-exp", choices=FALLBACK_EXPS, default=SOMATILE_EXP,
                        help="profile paper: the integer exp the fallback heads run, written to the file as "
                             "fallback_exp: somatile (default; the PL tile's) or aie4ml (the AI Engine's "
                             "exact-exp kernel, for somatile build --top aie; docs/aie.md)")


def profile_choice(args) -> tuple[str, str, str, str]:
    """(profile, normaliser, objective, fallback_exp) from the shared options, or ValueError naming the option."""
    normaliser = args.normaliser or ("pwl2" if args.profile == "wide" else "hccs")
    if args.profile == "paper":
        if normaliser != "hccs":
            raise ValueError(f"--normaliser: expected 'hccs' in profile 'paper' (pwl2 needs --profile wide), "
                             f"got {normaliser!r}")
        objective = args.objective or DEFAULT_OBJECTIVE
        if objective not in OBJECTIVES:
            raise ValueError(f"--objective: expected one of {sorted(OBJECTIVES)} in profile 'paper', got "
                             f"{objective!r}")
        return args.profile, normaliser, objective, args.fallback_exp
    if args.objective not in (None,) + WIDE_OBJECTIVES:
        raise ValueError(f"--objective: expected one of {WIDE_OBJECTIVES} in profile 'wide', got {args.objective!r}")
    if args.fallback_exp != SOMATILE_EXP:
        raise ValueError(f"--fallback-exp {args.fallback_exp}: needs --profile paper (aie4ml's exact-exp kernel "
                         f"takes int8 logits)")
    return args.profile, normaliser, args.objective, args.fallback_exp


def run(args: argparse.Namespace) -> int:
    if not args.study and not args.output:
        print("somatile calibrate: -o/--output FILE.yaml is required (or --study)")
        return 2
    try:
        profile, normaliser, objective, fallback_exp = profile_choice(args)
        data = load_input(args)
        if args.study:
            if profile == "wide":
                raise ValueError("--study: compares the paper profile's objectives; use --profile paper")
            print(f"objective study on {data.source} ({args.search} search, threshold {args.threshold}); "
                  f"calibrated on the first half of the rows, measured on the second half")
            print(format_study(study_objectives(data.logits, data.mask, data.values, scale=data.scale,
                                                search=args.search, threshold=args.threshold, progress=True)))
            return 0
        if profile == "wide":
            params = calibrate_wide_params(data.logits, data.mask, data.values, normaliser=normaliser,
                                           objective=objective, threshold=args.threshold)
            how = f"profile wide, {normaliser}"
        else:
            params = calibrate_params(data.logits, data.mask, scale=data.scale, search=args.search,
                                      mode=args.mode, out=args.out_type, objective=objective,
                                      threshold=args.threshold, c_range=args.c_range, steps=args.steps,
                                      progress=True, fallback_exp=fallback_exp)
            how = f"{args.search} search, fallback heads on {fallback_exp}'s integer exp"
    except (TypeError, ValueError) as exc:
        print(f"somatile calibrate: {exc}")
        return 2
    params.to_yaml(args.output)
    print(f"calibrated {params.heads} heads on {data.source} ({how}, objective {params.objective})")
    print(format_heads(params))
    print(f"wrote {args.output}")
    return 0


def format_heads(params: HccsParams) -> str:
    """The per-head table `somatile calibrate` prints: B, S, dmax, (paper: the float clip c), the objective
    and the fallback flag."""
    paper = params.profile == "paper"
    s_w, d_w = (4, 5) if paper else (6, 6)   # wide S and dmax reach 65535
    lines = [f"{'head':>4} {'B':>6} {'S':>{s_w}} {'dmax':>{d_w}}" + (f" {'c':>7}" if paper else "")
             + f" {params.objective:>9} fallback"]
    for h in range(params.heads):
        lines.append(f"{h:>4} {params.B[h]:>6} {params.S[h]:>{s_w}} {params.dmax[h]:>{d_w}}"
                     + (f" {params.c[h]:>7.3f} {params.error[h]:>9.4f}" if paper else f" {params.error[h]:>9.4g}")
                     + f" {'yes' if params.fallback[h] else 'no'}")
    return "\n".join(lines)


def format_study(rows: list[dict]) -> str:
    """Markdown table of :func:`study_objectives` rows."""
    keys = [k for k in rows[0] if k != "objective"]
    lines = ["| objective | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for r in rows:
        lines.append(f"| {r['objective']} | " + " | ".join(
            str(r[k]) if isinstance(r[k], int) else f"{r[k]:.4f}" for k in keys) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Wide profile: per-head (B, S, dmax) of the wide normalisers chosen on what the model sees.

WIDE_OBJECTIVES = ("output", "tv")
"""``output`` (default): relative squared error of the attention output, sum ||(P - Q) V||^2 / sum ||Q V||^2
over the calibration rows (Q = float softmax over the same mask); ``tv``: mean total variation of the rows."""
NATS_TO_WIDE = math.log2(math.e) * 256.0
"""Wide-profile logit units (2^-8 bit) per nat."""


def wide_candidates(normaliser: str) -> list[tuple[int, int, int]]:
    """The (B, S, dmax) grid searched per head (wide units: S in Q8, dmax in 2^-8 bit).

    pwl2: slopes 0.84..1.16 of the model's temperature times clips of 3..16 nats and none; hccs: B = 32768,
    clips of 0.5..16 nats, floors 0..30 % of B (the line from B at distance 0 to the floor at the clip)."""
    from somatile.model import wide
    if normaliser == "pwl2":
        clips = [int(round(c * NATS_TO_WIDE)) for c in (3, 4, 6, 8, 11, 16)] + [wide.DMAX_MAX]
        return [(0, s, d) for s in (216, 232, 244, 256, 268, 280, 296) for d in clips]
    if normaliser == "hccs":
        out = []
        for c in (0.5, 0.75, 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 11, 16):
            d = min(int(round(c * NATS_TO_WIDE)), wide.DMAX_MAX)
            for floor in (0.0, 0.01, 0.03, 0.1, 0.3):
                out.append((wide.PROB_ONE, int((wide.PROB_ONE * (1 - floor) * 256) // d), d))
        return out
    if normaliser == "exp":
        return [(0, 0, 0)]
    raise ValueError(f"normaliser: expected one of ('exp', 'hccs', 'pwl2'), got {normaliser!r}")


@dataclasses.dataclass
class WideCalibration:
    """Per-head wide parameters (int64 (H,)) and the objective of the chosen candidate per head, next to
    the integer exp's (``exp_error``): the measured effect a hybrid's fallback decision reads."""

    normaliser: str
    objective: str
    B: np.ndarray
    S: np.ndarray
    dmax: np.ndarray
    error: np.ndarray
    exp_error: np.ndarray


def calibrate_wide(blocks, normaliser: str, *, objective: str = "output") -> WideCalibration:
    """Grid search of the wide normaliser's parameters per head.

    blocks: iterable of (logits (H, R, N) float nats, mask (H, R, N) or (R, N) bool, values (H, N, D)
    float), e.g. one block per calibration sequence: every row of a block attends over the same N keys.
    Each candidate of :func:`wide_candidates` runs through the integer kernel (numba) on the wide logits of
    every block; per head the candidate with the smallest objective wins (ties: the first).
    """
    from somatile.model import wide
    if objective not in WIDE_OBJECTIVES:
        raise ValueError(f"objective: expected one of {WIDE_OBJECTIVES}, got {objective!r}")
    cands = wide_candidates(normaliser)
    prepared = []
    for logits, mask, values in blocks:
        mask = np.broadcast_to(mask, logits.shape)
        ref = hccs.softmax(logits, mask)
        values = np.asarray(values, np.float32)   # the output error needs ~1e-4, float32 products halve the time
        ref_out = (ref @ values).astype(np.float64)
        prepared.append((wide.logits_from_float(logits, mask), np.ascontiguousarray(mask), values, ref, ref_out))

    def errors(norm, B, S, dmax):
        num = 0.0
        den = 0.0
        for x, mask, values, ref, ref_out in prepared:
            p = wide.wide_softmax(x, norm, B, S, dmax, mask=mask) / np.float32(wide.PROB_ONE)
            if objective == "output":
                num = num + ((p @ values - ref_out) ** 2).sum(axis=(1, 2))
                den = den + (ref_out ** 2).sum(axis=(1, 2))
            else:
                rows = mask.any(axis=-1)
                num = num + np.where(rows, 0.5 * np.abs(p - ref).sum(axis=-1), 0).sum(axis=1)
                den = den + rows.sum(axis=1)
        return num / np.maximum(den, 1e-300)

    heads = prepared[0][0].shape[0]
    curve = np.array([errors(normaliser, b, s, d) for b, s, d in cands])   # (candidates, H)
    best = curve.argmin(axis=0)
    chosen = np.array([cands[i] for i in best], np.int64).reshape(heads, 3)
    exp_error = errors("exp", 0, 0, 0)
    return WideCalibration(normaliser, objective, chosen[:, 0], chosen[:, 1], chosen[:, 2],
                           curve[best, np.arange(heads)], exp_error)


def calibrate_wide_params(logits: np.ndarray, mask=None, values=None, *, normaliser: str = "pwl2",
                          objective: str | None = None, threshold: float = DEFAULT_THRESHOLD) -> HccsParams:
    """Wide-profile parameters of ``normaliser`` ("pwl2" or "hccs") for float logits (H, R, N) with an
    optional mask and values (H, N, D) as an :class:`HccsParams` (profile "wide").

    ``objective``: "output" (default when ``values`` are given) or "tv"; heads whose objective stays above
    ``threshold`` keep the integer exp (``fallback``)."""
    from somatile.model import wide
    x3, valid3, _ = hccs.as_heads(logits, mask, "logits", floating=True)
    if normaliser not in ("pwl2", "hccs"):
        raise ValueError(f"normaliser: expected 'pwl2' or 'hccs' in profile 'wide', got {normaliser!r}")
    objective = objective or ("output" if values is not None else "tv")
    if objective not in WIDE_OBJECTIVES:
        raise ValueError(f"objective: expected one of {WIDE_OBJECTIVES} in profile 'wide', got {objective!r}")
    if objective == "output" and values is None:
        raise ValueError("objective 'output': the input has no 'values' (H, N, D); add them to the .npz or use "
                         "--objective tv")
    if values is None:   # tv reads only the probabilities
        values = np.zeros((x3.shape[0], x3.shape[2], 1))
    valid = np.ones(x3.shape, bool) if valid3 is None else valid3
    cal = calibrate_wide([(x3.astype(np.float64), valid, values)], normaliser, objective=objective)
    return HccsParams(B=cal.B, S=cal.S, dmax=cal.dmax, fallback=cal.error > threshold, scale=None,
                      cols=x3.shape[-1], error=cal.error, objective=objective, profile="wide",
                      normaliser=normaliser)
