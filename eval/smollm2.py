"""`somatile eval smollm2`: what the Soma ring/field and HCCS cost in perplexity on SmolLM2-135M
(somatile.model.smollm2).

Perplexity on the evaluation text (first 40,000 characters by default: 9,480 scored tokens in 512-token
windows; a subset also in 2,048-token windows) for full attention and Soma variants
(somatile.model.soma.prefill in place of every layer's attention): the seed preset, rings of 64/128/256, rings
with 4 sinks, ring + field (keys vs values, gated vs not, alpha grid), HCCS as near-field normaliser (c per
layer and head calibrated on SmolLM2's own logits), the integer path (int8 q/k/v through the bit-exact integer
Soma, HCCS and integer-exp normalisers), and the SFA enhancement of seed 001 on full attention. State sizes
against the full KV cache at 2K, 8K and 64K. Calibration uses text after the evaluated range (characters
40,000 on), so no evaluated token is seen. Windows x variants run as jobs of :mod:`somatile.eval.jobs`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from somatile.eval import text as textmod
from somatile.eval.report import machine, markdown_table, pyplot, write_outputs

STATE_LENGTHS = (2048, 8192, 65536)


@dataclass(frozen=True)
class LMVariant:
    """One evaluated configuration: full attention (``soma`` None) or Soma in every layer.

    ``soma``: name of the SomaConfig builder in :func:`soma_configs`; ``sfa``: add seed 001's enhancement
    to each layer's attention output; ``long``: also scored in long windows; ``in_grid``: part of the
    default run (the others run when named with ``--only``); ``boundary``: the float <-> int8 boundary
    (:class:`somatile.model.boundary.Boundary`, a key of ``LMCalibration.boundaries``) of an integer
    variant, None for the per-head scales of ``LMCalibration``."""

    key: str
    name: str
    group: str
    soma: str | None = None
    sfa: bool = False
    long: bool = False
    in_grid: bool = True
    boundary: str | None = None


def lm_variants(quick: bool, everything: bool = False) -> list[LMVariant]:
    """The evaluated grid; ``key`` is the Soma builder name (see :func:`soma_configs`), "full" or "sfa"."""
    v = [
        LMVariant("full", "full attention", "reference", long=True),
        LMVariant("seed", "seed preset (ring 16, keys field a=0.1, no self)", "seed", "seed"),
        LMVariant("ring64", "ring 64", "ring", "ring64"),
        LMVariant("ring128", "ring 128", "ring", "ring128"),
        LMVariant("ring256", "ring 256", "ring", "ring256", long=True),
        LMVariant("sinks4_ring60", "4 sinks + ring 60", "sinks", "sinks4_ring60"),
        LMVariant("default", "4 sinks + ring 252 (default preset)", "sinks", "default", long=True),
        LMVariant("field_keys_0.1", "4 sinks + ring 60 + keys field a=0.1", "field", "field_keys_0.1"),
        LMVariant("field_values_0.1", "4 sinks + ring 60 + values field a=0.1", "field", "field_values_0.1"),
        LMVariant("field_gated_0.05", "4 sinks + ring 60 + gated values field a=0.05", "field", "field_gated_0.05",
                  in_grid=False),
        LMVariant("field_gated_0.1", "4 sinks + ring 60 + gated values field a=0.1", "field", "field_gated_0.1"),
        LMVariant("field_gated_0.3", "4 sinks + ring 60 + gated values field a=0.3", "field", "field_gated_0.3"),
        LMVariant("hccs", "4 sinks + ring 252, float HCCS (calibrated c)", "hccs", "hccs"),
        LMVariant("int_hccs", "4 sinks + ring 252, integer (int8 qkv, HCCS div)", "integer", "int_hccs"),
        LMVariant("int_exp", "4 sinks + ring 252, integer (int8 qkv, integer exp)", "integer", "int_exp"),
        LMVariant("paper_exp_levers", "paper profile, integer exp, K smoothing + per-channel K/V scales",
                  "paper+levers", "paper_exp_levers", boundary="paper_levers"),
        LMVariant("wide_exp_per_head", "wide profile, integer exp, per-head scales (no smoothing)", "wide",
                  "wide_exp", boundary="per_head"),
        LMVariant("wide_exp_no_smooth", "wide profile, integer exp, per-channel K/V scales (no smoothing)",
                  "wide", "wide_exp", boundary="no_smooth"),
        LMVariant("wide_exp", "wide profile, integer exp (K smoothing, per-channel K/V, int16 out)", "wide",
                  "wide_exp", boundary="levers"),
        LMVariant("wide_pwl2_uncal", "wide profile, pwl2 (exp-free), model slope, no clip", "wide",
                  "wide_pwl2_uncal", boundary="levers"),
        LMVariant("wide_pwl2", "wide profile, pwl2 (exp-free), calibrated on the output", "wide", "wide_pwl2",
                  boundary="levers"),
        LMVariant("wide_hccs", "wide profile, HCCS, calibrated on the output", "wide", "wide_hccs",
                  boundary="levers"),
        LMVariant("wide_hccs_hybrid", "wide profile, HCCS + integer exp on the worst 10% of heads", "wide",
                  "wide_hccs_hybrid", boundary="levers"),
        LMVariant("sfa", "full attention + SFA (seed 001 schedule)", "sfa", sfa=True),
    ]
    if quick:
        keep = {"full", "seed", "ring64", "field_gated_0.1", "hccs", "int_hccs", "wide_exp", "wide_pwl2", "sfa"}
        return [x for x in v if x.key in keep]
    return v if everything else [x for x in v if x.in_grid]


@dataclass
class LMCalibration:
    """Per layer, from full attention on calibration tokens: HCCS params for rows of ``cols`` keys
    (int8 search; ``c`` in logit units for the float normaliser) and int8 scales of q, k, v and the output."""

    cols: int
    params: list
    q_scale: list = field(default_factory=list)
    k_scale: list = field(default_factory=list)
    v_scale: list = field(default_factory=list)
    out_scale: list = field(default_factory=list)
    boundaries: dict = field(default_factory=dict)
    """boundary name -> per layer Boundary (see BOUNDARIES)"""
    wide: dict = field(default_factory=dict)
    """wide normaliser ("pwl2", "hccs") -> per layer WideCalibration (rows of the default Soma slots)"""


BOUNDARIES = {"levers": ("wide", dict(smooth_k=True, per_channel=True)),
              "no_smooth": ("wide", dict(smooth_k=False, per_channel=True)),
              "per_head": ("wide", dict(smooth_k=False, per_channel=False)),
              "paper_levers": ("paper", dict(smooth_k=True, per_channel=True))}
"""Boundaries calibrated for the evaluation: name -> (profile, Boundary.calibrate levers)."""


def wide_fallback(cals: list, fraction: float = 0.1) -> list[tuple[bool, ...]]:
    """Per layer, the heads that keep the integer exp in a hybrid: the ``fraction`` of all the model's heads
    where the calibrated normaliser's attention-output error exceeds the integer exp's the most (the measured
    effect on what the next layer sees, from the calibration rows)."""
    if not cals:
        return []
    excess = np.concatenate([w.error - w.exp_error for w in cals])
    cut = np.quantile(excess, 1 - fraction)
    return [tuple(bool(x) for x in (w.error - w.exp_error) >= cut) for w in cals]


def soma_mask(T: int, sinks: int, ring: int) -> np.ndarray:
    """(T, T) bool: key u is in query t's Soma row (include_self): a sink (u < sinks) or one of the last
    ``ring`` tokens, u <= t."""
    t, u = np.arange(T)[:, None], np.arange(T)[None, :]
    return (u <= t) & ((u < sinks) | (t - u < ring))


def calibrate_smollm2(model, tokens: np.ndarray, cols: int, geometry: dict | None = None,
                      wide: bool = True, *, n_jobs: int = 1, cluster: str | None = None) -> LMCalibration:
    """Run full attention over ``tokens`` and calibrate each layer per head on rows of ``cols`` keys: each
    query's last ``cols`` visible keys (what a Soma row of ``cols`` slots holds), masked where fewer exist.

    With ``wide`` (needs ``geometry``): also the :data:`BOUNDARIES` of each layer from these tokens' q, k, v,
    and the wide pwl2 / hccs parameters chosen on the attention output over rows of the default preset's
    Soma slots (:func:`soma_mask`).

    The forward pass runs here; each layer's calibration is a job of :mod:`somatile.eval.jobs`
    (:func:`calibrate_layer_job`, ``n_jobs`` processes or ``cluster``): the layers are independent, and their
    wide searches are most of the calibration's time. The result does not depend on where the jobs ran."""
    from somatile.eval import jobs as joblib
    from somatile.model.smollm2 import CausalAttention

    layers: dict[int, dict] = {}

    def keep_logits(layer, logits, mask):
        layers[layer] = dict(layer=layer, logits=logits, mask=mask)

    inner = CausalAttention(logits_hook=keep_logits)

    def attention(layer, q, k, v):
        out = inner(layer, q, k, v)
        layers[layer].update(q=q, k=k, v=v, out=out)
        return out

    model.forward(tokens, attention=attention)
    n_layers = model.config.n_layers
    work = [dict(layers[layer], cols=cols, geometry=geometry, wide=wide) for layer in range(n_layers)]
    layers.clear()   # the jobs hold the only references: each layer's logits are freed once it is done
    parts = joblib.run(calibrate_layer_job, work, n_jobs=n_jobs, cluster=cluster, desc="calibrate SmolLM2",
                       labels=[f"calibrate layer {layer}" for layer in range(n_layers)])
    cal = LMCalibration(cols=cols, params=[])
    for part in parts:
        cal.params.append(part["params"])
        for name in ("q_scale", "k_scale", "v_scale", "out_scale"):
            getattr(cal, name).append(part[name])
        for name, boundary in part["boundaries"].items():
            cal.boundaries.setdefault(name, []).append(boundary)
        for norm, w in part["wide"].items():
            cal.wide.setdefault(norm, []).append(w)
    return cal


def calibrate_layer_job(job: dict) -> dict:
    """One layer's share of :func:`calibrate_smollm2` (a job: runs in any process). ``job``: the layer's
    causal logits (H, T, T) and mask, its q, k, v and attention output, ``cols``, ``geometry`` and ``wide``.
    Returns the layer's HCCS params, int8 scales, and with ``wide`` its boundaries and wide calibrations."""
    from somatile.model import soma_int
    from somatile.model.boundary import Boundary
    from somatile.model.calibrate import calibrate_params, calibrate_wide
    from somatile.model.soma import SomaConfig

    logits, mask, q, k, v, out = (job[name] for name in ("logits", "mask", "q", "k", "v", "out"))
    x, m = last_keys(logits, mask, job["cols"])
    part = {"params": calibrate_params(x, m, search="int", mode="div"),
            **{f"{name}_scale": soma_int.scales_for(t) for name, t in (("q", q), ("k", k), ("v", v), ("out", out))},
            "boundaries": {}, "wide": {}}
    if not job["wide"]:
        return part
    default = SomaConfig.preset("default", **job["geometry"])
    for name, (profile, levers) in BOUNDARIES.items():
        part["boundaries"][name] = Boundary.calibrate(default.replace(profile=profile), q, k, v, **levers)
    kv = np.arange(default.n_heads) // default.group
    block = (logits.astype(np.float64), soma_mask(logits.shape[-1], default.sinks, default.ring),
             np.asarray(v, np.float64).transpose(1, 0, 2)[kv])
    for norm in ("pwl2", "hccs"):
        part["wide"][norm] = calibrate_wide([block], norm)
    return part


def last_keys(logits: np.ndarray, mask: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(H, T, T) causal logits -> (H, T, cols): for each query its last ``cols`` visible keys, left-padded
    with masked zeros (rows of the width a ring of ``cols`` slots normalises over)."""
    H, T, _ = logits.shape
    out = np.zeros((H, T, cols), np.float64)
    valid = np.zeros((H, T, cols), bool)
    for t in range(T):
        lo = max(0, t + 1 - cols)
        n = t + 1 - lo
        out[:, t, cols - n:] = logits[:, t, lo:t + 1]
        valid[:, t, cols - n:] = mask[t, lo:t + 1]
    return out, valid


def soma_configs(cal: LMCalibration | None, n_layers: int, geometry: dict) -> dict[str, Callable[[int], object]]:
    """Builder name -> (layer -> SomaConfig). Geometry: n_heads, n_kv_heads, head_dim."""
    from somatile.model.soma import SomaConfig, integer_config

    def fixed_cfg(cfg):
        return lambda layer: cfg

    def fixed(**kw):
        return fixed_cfg(SomaConfig(**geometry, **kw))

    sinks60 = dict(ring=60, sinks=4, include_self=True, gamma=0.98)
    builders = {
        "seed": (lambda cfg: (lambda layer: cfg))(SomaConfig.preset("seed", **geometry)),
        "default": (lambda cfg: (lambda layer: cfg))(SomaConfig.preset("default", **geometry)),
        "ring64": fixed(ring=64, sinks=0, alpha=0.0),
        "ring128": fixed(ring=128, sinks=0, alpha=0.0),
        "ring256": fixed(ring=256, sinks=0, alpha=0.0),
        "sinks4_ring60": fixed(**sinks60, alpha=0.0),
        "field_keys_0.1": fixed(**sinks60, alpha=0.1, field_source="keys"),
        "field_values_0.1": fixed(**sinks60, alpha=0.1, field_source="values"),
        "field_gated_0.05": fixed(**sinks60, alpha=0.05, field_source="values", gating="query"),
        "field_gated_0.1": fixed(**sinks60, alpha=0.1, field_source="values", gating="query"),
        "field_gated_0.3": fixed(**sinks60, alpha=0.3, field_source="values", gating="query"),
    }
    if cal is not None:
        default = SomaConfig.preset("default", profile="paper", **geometry)
        if default.slots != cal.cols:
            raise ValueError(f"calibration rows have {cal.cols} keys, the default preset {default.slots} slots")
        hccs_cfgs = [default.replace(normaliser="hccs", hccs_c=tuple(cal.params[l].c)) for l in range(n_layers)]

        def integer(layer: int, normaliser: str):
            p = cal.params[layer]
            base = default.replace(normaliser=normaliser if normaliser == "exp_int" else "softmax")
            cfg = integer_config(base, q_scale=cal.q_scale[layer], k_scale=cal.k_scale[layer],
                                 v_scale=cal.v_scale[layer], out_scale=cal.out_scale[layer],
                                 logit_scale=tuple(p.scale))
            if normaliser == "hccs_int":
                cfg = cfg.replace(hccs_B=tuple(p.B), hccs_S=tuple(p.S), hccs_dmax=tuple(p.dmax), hccs_mode="div")
            return cfg
        int_hccs = [integer(l, "hccs_int") for l in range(n_layers)]
        int_exp = [integer(l, "exp_int") for l in range(n_layers)]
        builders.update({"hccs": hccs_cfgs.__getitem__, "int_hccs": int_hccs.__getitem__,
                         "int_exp": int_exp.__getitem__})
        # Boundary variants: the float config of the profile; SomaAttention makes it integer per boundary.
        wide_cfg = default.replace(profile="wide")

        def calibrated(norm, fallback=None):
            return [wide_cfg.replace(normaliser=f"{norm}_int", hccs_B=tuple(w.B), hccs_S=tuple(w.S),
                                     hccs_dmax=tuple(w.dmax), fallback=None if fallback is None else fallback[l])
                    for l, w in enumerate(cal.wide.get(norm, []))]
        builders.update({"paper_exp_levers": fixed_cfg(default.replace(normaliser="exp_int")),
                         "wide_exp": fixed_cfg(wide_cfg.replace(normaliser="exp_int")),
                         "wide_pwl2_uncal": fixed_cfg(wide_cfg.replace(normaliser="pwl2_int")),
                         "wide_pwl2": calibrated("pwl2").__getitem__, "wide_hccs": calibrated("hccs").__getitem__,
                         "wide_hccs_hybrid": calibrated("hccs", wide_fallback(cal.wide.get("hccs", []))).__getitem__})
    return builders


class SomaAttention:
    """Soma streaming attention in every layer (fresh state per call: one window = one stream).

    Integer configs quantise q/k/v with the config's calibrated per-head scales and read the int8 output
    back as out * out_scale. With ``boundaries`` (one :class:`Boundary` per layer) the layer's config is a
    float config with an integer normaliser: it runs integer through that boundary (its quantiser, its
    per-channel output scales)."""

    def __init__(self, config_of_layer: Callable[[int], object], scales: LMCalibration | None = None,
                 boundaries: list | None = None):
        self.config_of_layer = config_of_layer
        self.scales = scales
        self.boundaries = boundaries

    def __call__(self, layer, q, k, v):
        from somatile.model import soma
        cfg = self.config_of_layer(layer)
        if self.boundaries is not None:
            b = self.boundaries[layer]
            out, _ = soma.prefill(b.integer_config(cfg), *b.quantize(q, k, v))
            return b.dequantize(out)
        if not cfg.integer:
            return soma.prefill(cfg, q, k, v)[0]
        s = self.scales
        out, _ = soma.prefill(cfg, soma.quantize(q, s.q_scale[layer], "q"), soma.quantize(k, s.k_scale[layer], "k"),
                              soma.quantize(v, s.v_scale[layer], "v"))
        return (out.astype(np.float32) * s.out_scale[layer][:, None].astype(np.float32))


def sfa_hook_factory(n_layers: int, hidden: int):
    """A fresh SFA enhancement (seed 001 defaults) per window: returns attn_out_hook(layer, a)."""
    from somatile.model.sfa import SfaConfig, SfaState, sfa_apply
    cfg = SfaConfig(n_layers=n_layers)
    states = [SfaState.new(cfg, hidden) for _ in range(n_layers)]
    return lambda layer, a: sfa_apply(cfg, states[layer], layer, a)[0]


def window_schedule(n_tokens: int, window: int, long_window: int) -> list[tuple[int, int]]:
    """Rounds of (start, length): the short windows in order with one long window after every fourth
    short one (then the remaining long windows), so that a run stopped by its time budget still has
    both protocols on a common prefix of windows."""
    from somatile.model.smollm2 import window_starts
    short = [(s, window) for s in window_starts(n_tokens, window)]
    long = [(s, long_window) for s in window_starts(n_tokens, long_window)] if long_window else []
    rounds = []
    for i, w in enumerate(short):
        rounds.append(w)
        if i % 4 == 3 and long:
            rounds.append(long.pop(0))
    return rounds + long


def variant_fields(v: LMVariant, builders: dict) -> dict:
    """The machine-readable fields of a variant's results row: profile (None for float attention),
    normaliser, integer, ring and sinks (None for full attention)."""
    if not v.soma:
        return {"profile": None, "normaliser": "softmax", "integer": False, "ring": None, "sinks": None}
    cfg = builders[v.soma](0)
    integer = bool(cfg.integer or v.boundary)
    return {"profile": cfg.profile if integer else None, "normaliser": cfg.normaliser, "integer": integer,
            "ring": cfg.ring, "sinks": cfg.sinks}


def evaluate_smollm2(args, command: str) -> dict:
    """Every variant on the same windows, round by round (all variants on window 1, then window 2, ...),
    writing results after each round; ``args.max_minutes`` stops after the round that crosses it."""
    from somatile.model import soma
    from somatile.model.smollm2 import SmolLM2

    t0 = time.time()
    model = SmolLM2.load()
    c = model.config
    geometry = dict(n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim)
    source = textmod.load_text(args.text)
    chars = args.chars
    eval_tokens = model.encode(source[:chars])
    cal_source = source[chars:] if len(source) > chars + 2000 else source
    cal_tokens = model.encode(cal_source)[:args.calibration_tokens]
    window, long_window = args.window, args.long_window
    if args.quick:
        eval_tokens, window, long_window = eval_tokens[:args.quick_tokens], args.quick_tokens, 0
        cal_tokens = cal_tokens[:max(args.quick_tokens, 64)]
    if len(cal_tokens) < 2:
        raise ValueError("calibration text: fewer than 2 tokens after the evaluated range")
    variants = lm_variants(args.quick)
    if args.only:
        variants = [v for v in lm_variants(False, everything=True) if v.key in args.only]
    default_slots = soma.SomaConfig.preset("default", **geometry).slots
    from somatile.eval import jobs as joblib
    n_jobs = joblib.check(getattr(args, "jobs", 1), getattr(args, "cluster", None))
    cal = calibrate_smollm2(model, cal_tokens, default_slots, geometry, wide=any(v.boundary for v in variants),
                            n_jobs=n_jobs, cluster=getattr(args, "cluster", None))
    builders = soma_configs(cal, c.n_layers, geometry)
    results = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, float32 forward)", "machine": machine(),
               "quick": bool(args.quick), "text": str(args.text or textmod.DEFAULT_TEXT), "chars": chars,
               "n_tokens": int(len(eval_tokens)), "window": window, "long_window": long_window,
               "calibration_tokens": int(len(cal_tokens)), "command": command, "variants": []}
    rows = {}
    for v in variants:
        row = {"key": v.key, "name": v.name, "group": v.group, **variant_fields(v, builders),
               "windows": [], "long_windows": []}
        if v.soma:
            cfg = builders[v.soma](0)
            row["config"] = {k: getattr(cfg, k) for k in ("ring", "sinks", "include_self", "alpha", "gamma",
                                                          "field_source", "gating", "normaliser", "profile")}
            row["config"]["integer"] = row["integer"]
            row["state"] = [_state_row(soma.state_bytes(cfg.replace(integer=row["integer"]) if v.boundary else cfg,
                                                        n, n_layers=c.n_layers)) for n in STATE_LENGTHS]
        rows[v.key] = row
    results["variants"] = list(rows.values())
    if cal.wide:
        fallback = wide_fallback(cal.wide.get("hccs", []))
        results["wide_calibration"] = [
            {"normaliser": norm, "layer": l, "head": h, "B": int(w.B[h]), "S": int(w.S[h]), "dmax": int(w.dmax[h]),
             "objective": w.objective, "error": float(w.error[h]), "exp_error": float(w.exp_error[h]),
             **({"fallback": fallback[l][h]} if norm == "hccs" else {})}
            for norm, ws in cal.wide.items() for l, w in enumerate(ws) for h in range(len(w.B))]
    results["full_kv"] = [_state_row(soma.state_bytes(soma.SomaConfig.preset("default", **geometry), n,
                                                      n_layers=c.n_layers)) for n in STATE_LENGTHS]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    schedule = window_schedule(len(eval_tokens), window, long_window)
    results["rounds_planned"] = len(schedule)
    if args.first_round >= len(schedule):
        raise ValueError(f"--first-round: expected less than the {len(schedule)} rounds of this protocol, "
                         f"got {args.first_round}")
    schedule = schedule[args.first_round:]
    results["first_round"] = args.first_round
    deadline = t0 + 60 * args.max_minutes if args.max_minutes else None
    token = _calibration_token(cal, geometry, c.n_layers)
    _BUILDERS.clear()
    _BUILDERS[token] = builders   # jobs run in this process (--jobs 1) reuse the configs built above
    cache = out / "jobs"
    cache.mkdir(exist_ok=True)
    job_list, owners = [], []
    for r, (start, length) in enumerate(schedule):
        for v in variants:
            if length != window and not v.long:
                continue
            chunk = eval_tokens[start:start + length]
            fingerprint = f"{token}:{v.key}:{start}:{length}:{hash_tokens(chunk)}"
            done = (_cached_window(cache, v.key, start, len(chunk), fingerprint) if getattr(args, "resume", False)
                    else None)
            job_list.append(dict(token=token, cal=cal, geometry=geometry, n_layers=c.n_layers, variant=v,
                                 start=int(start), length=int(len(chunk)), chunk=chunk, deadline=deadline,
                                 fingerprint=fingerprint, cached=done))
            owners.append(r)
    last_of_round = {r: i for i, r in enumerate(owners)}
    pending: dict[int, list] = {}
    stopped = []

    def deliver(i, w):
        """Results arrive in job order: a round counts only when every variant has run it (a window past
        the time budget comes back as None and ends the run there)."""
        r, job = owners[i], job_list[i]
        if stopped:
            return
        if w is None:
            stopped.append(r)
            results["stopped_by_budget"] = f"--max-minutes {args.max_minutes}"
            return
        if job["cached"] is None:
            (cache / _window_file(job["variant"].key, job["start"], job["length"])).write_text(
                json.dumps({**w, "fingerprint": job["fingerprint"]}))
        pending.setdefault(r, []).append((job["variant"], w))
        if last_of_round[r] == i:
            is_long = schedule[r][1] != window
            for v, win in pending.pop(r):
                rows[v.key]["long_windows" if is_long else "windows"].append(win)
            _summarise(results)
            results["seconds"] = round(time.time() - t0, 1)
            write_outputs(out, results, smollm2_markdown(results))
            print(f"window {schedule[r][0]}+{schedule[r][1]} done: " + ", ".join(
                f"{row['key']} {row['ppl']:.3f}" for row in results["variants"] if row.get("ppl")),
                file=sys.stderr, flush=True)

    results["jobs"] = {"n_jobs": n_jobs, "cluster": getattr(args, "cluster", None), "count": len(job_list),
                       "resumed": sum(j["cached"] is not None for j in job_list)}
    joblib.run(smollm2_window_job, job_list, n_jobs=n_jobs, cluster=getattr(args, "cluster", None),
               on_result=deliver, desc="SmolLM2 windows x variants",
               # A window's run time grows with its length (the long windows are 4x): submit those first.
               cost=[0 if j["cached"] is not None else j["length"] for j in job_list],
               labels=[f"{j['variant'].key} window {j['start']}+{j['length']}" for j in job_list])
    _summarise(results)
    results["seconds"] = round(time.time() - t0, 1)
    _smollm2_plots(out, results)
    write_outputs(out, results, smollm2_markdown(results))
    return results


def hash_tokens(tokens: np.ndarray) -> str:
    import hashlib
    return hashlib.sha256(np.ascontiguousarray(tokens, np.int64).tobytes()).hexdigest()[:16]


def _calibration_token(cal, geometry: dict, n_layers: int) -> str:
    """A digest of everything a window job's result depends on besides its tokens and variant: the
    calibration and the geometry, so ``--resume`` never reuses a window of another calibration. The digest
    reads values (:func:`_feed`), not pickled bytes: a calibration assembled from jobs run in other processes
    pickles differently (no shared objects, other array strides) but is the same calibration."""
    import hashlib
    h = hashlib.sha256()
    _feed(h, (cal, sorted(geometry.items()), n_layers))
    return h.hexdigest()[:16]


def _feed(h, value) -> None:
    """Feed ``value``'s contents to the hash ``h``: arrays by dtype, shape and C-order bytes; dataclasses and
    other objects by class name and fields; containers element by element; scalars by type and repr."""
    import dataclasses
    if isinstance(value, np.ndarray):
        h.update(f"array {value.dtype.str} {value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__} {len(value)}".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, dict):
        h.update(f"dict {len(value)}".encode())
        for key in sorted(value, key=repr):
            _feed(h, key)
            _feed(h, value[key])
    elif value is None or isinstance(value, (str, bool, int, float, np.generic)):
        h.update(f"{type(value).__name__} {value!r}".encode())
    elif dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
        h.update(type(value).__qualname__.encode())
        _feed(h, {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
              if dataclasses.is_dataclass(value) else vars(value))
    else:
        raise TypeError(f"calibration fingerprint: cannot digest a {type(value).__name__}")


def _window_file(key: str, start: int, length: int) -> str:
    return f"{key}@{start}+{length}.json"


def _cached_window(cache: Path, key: str, start: int, length: int, fingerprint: str) -> dict | None:
    f = cache / _window_file(key, start, length)
    try:
        w = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return {k: v for k, v in w.items() if k != "fingerprint"} if w.get("fingerprint") == fingerprint else None


_BUILDERS: dict[str, dict] = {}


def smollm2_window_job(job: dict) -> dict | None:
    """One variant on one window (a job of :mod:`somatile.eval.jobs`; runs in any process): the model is
    loaded once per process and the variants' configs once per calibration. None when the job starts past
    its deadline (``--max-minutes``)."""
    from somatile.model.smollm2 import SmolLM2, window_nll
    if job["cached"] is not None:
        return job["cached"]
    if job["deadline"] is not None and time.time() > job["deadline"]:
        return None
    model = SmolLM2.load()
    if job["token"] not in _BUILDERS:
        _BUILDERS.clear()
        _BUILDERS[job["token"]] = soma_configs(job["cal"], job["n_layers"], job["geometry"])
    builders, v, cal = _BUILDERS[job["token"]], job["variant"], job["cal"]
    kwargs = {}
    if v.soma:
        kwargs["attention"] = SomaAttention(builders[v.soma], cal, cal.boundaries[v.boundary] if v.boundary else None)
    if v.sfa:
        kwargs["attn_out_hook"] = sfa_hook_factory(model.config.n_layers, model.config.hidden)
    t1 = time.time()
    nll, scored = window_nll(model, job["chunk"], **kwargs)
    return {"start": job["start"], "length": job["length"], "nll": nll, "scored": scored,
            "seconds": round(time.time() - t1, 1)}


def _summarise(results: dict) -> None:
    """Perplexity of each variant over the windows it has run (the same windows for every variant)."""
    for r in results["variants"]:
        for key, suffix in (("windows", ""), ("long_windows", "_long")):
            ws = r[key]
            if ws:
                nll, scored = sum(w["nll"] for w in ws), sum(w["scored"] for w in ws)
                r["ppl" + suffix] = math.exp(nll / scored)
                r["scored" + suffix] = scored
                r["n_windows" + suffix] = len(ws)


def _state_row(sb) -> dict:
    return {"seq_len": sb.seq_len, "soma_bytes": sb.soma_model, "full_kv_bytes": sb.full_kv_model,
            "ratio": sb.full_kv_model / sb.soma_model, "kv_dtype": sb.kv_dtype}


def _mib(b: float) -> str:
    return f"{b / 2**20:.3f} MiB" if b >= 2**20 else f"{b / 1024:.1f} KiB"


def smollm2_markdown(r: dict) -> str:
    done = [v for v in r["variants"] if v.get("ppl")]
    ref = next((v for v in done if v["group"] == "reference"), None)
    has_long = any(v.get("ppl_long") for v in done)

    def delta(v, suffix):
        if not ref or not v.get("ppl" + suffix) or not ref.get("ppl" + suffix):
            return ""
        return f"{100 * (v['ppl' + suffix] / ref['ppl' + suffix] - 1):+.2f} %"
    rows = [[v["name"], v["ppl"], delta(v, "")] + ([v.get("ppl_long", ""), delta(v, "_long")] if has_long else [])
            for v in done]
    scored = done[0]["scored"] if done else 0
    n_win = done[0]["n_windows"] if done else 0
    long_note = ""
    if has_long:
        lv = next(v for v in done if v.get("ppl_long"))
        long_note = (f" Long protocol: {lv['n_windows_long']} window(s) of up to {r['long_window']} tokens "
                     f"({lv['scored_long']:,} scored tokens), for the variants with a value in that column.")
    budget = (f" The run stopped at its time budget ({r['stopped_by_budget']}) after these windows; every "
              "variant ran the same windows." if r.get("stopped_by_budget") else "")
    lines = [
        "## SmolLM2-135M: Soma attention, HCCS and SFA against full attention",
        "",
        f"Text: first {r['chars']:,} characters of {Path(r['text']).name} ({r['n_tokens']:,} tokens). "
        f"Perplexity over {n_win} of its "
        f"non-overlapping {r['window']}-token windows ({scored:,} scored tokens; the same windows for every "
        f"variant, starts in results.json; each window runs from position 0 with a fresh state, its first token "
        f"unscored).{long_note}{budget} "
        f"Calibration (HCCS per layer and head, int8 scales) on {r['calibration_tokens']} tokens of text after "
        f"the evaluated range. Command: `{r['command']}`.",
        "",
        markdown_table(["variant", f"ppl ({r['window']})", "vs full"]
                       + ([f"ppl ({r['long_window']})", "vs full"] if has_long else []), rows),
        "",
    ]
    state_rows = [[v["name"]] + [f"{_mib(s['soma_bytes'])} ({s['ratio']:.1f}x smaller)" for s in v["state"]]
                  for v in r["variants"] if "state" in v]
    if state_rows and r.get("full_kv"):
        full_row = [f"full KV cache ({r['full_kv'][0]['kv_dtype']})"] + [_mib(s["full_kv_bytes"]) for s in r["full_kv"]]
        lines += ["State of all 30 layers (Soma: sinks + ring of K and V plus the field, in the dtype used; the "
                  "ratio is against a full KV cache of the same dtype, i.e. int8 for the integer path):", "",
                  markdown_table(["variant"] + [f"{n:,} tokens" for n in STATE_LENGTHS], state_rows + [full_row]),
                  ""]
    return "\n".join(lines)


def _smollm2_plots(out: Path, r: dict) -> None:
    plt = pyplot()
    done = [v for v in r["variants"] if v.get("ppl")]
    if not done:
        return
    names = [v["name"] for v in done]
    ppl = [v["ppl"] for v in done]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(names) + 1.2))
    ax.barh(range(len(names)), ppl, color=["C0" if v["group"] == "reference" else "C1" for v in done])
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"perplexity ({r['window']}-token windows, log scale)")
    fig.tight_layout()
    fig.savefig(out / "perplexity.png", dpi=110)
    plt.close(fig)


def merge_smollm2(out: Path, parts: list[Path]) -> dict:
    """Join results.json of ``somatile eval smollm2 --only ...`` slices run in parallel into ``out``.

    Slices may split the variants (``--only``) or the windows (``--first-round``); they must share the text,
    window length and token counts. Windows of the same variant are joined; then every variant is cut to
    the windows that all variants ran (long windows: all variants that ran any), so each perplexity in the
    merged table covers the same tokens. Variants keep the grid order."""
    loaded = []
    for part in parts:
        f = part / "results.json"
        if not f.is_file():
            raise FileNotFoundError(f"--merge: no {f}")
        loaded.append(json.loads(f.read_text()))
    protocol = ("text", "chars", "n_tokens", "window", "calibration_tokens", "quick")
    for r, part in zip(loaded[1:], parts[1:]):
        differs = [k for k in protocol if r.get(k) != loaded[0].get(k)]
        if differs:
            raise ValueError(f"--merge: {part} differs from {parts[0]} in {differs}")
    order = {v.key: i for i, v in enumerate(lm_variants(False, everything=True))}
    merged = dict(loaded[0])
    merged["long_window"] = max(r["long_window"] for r in loaded)
    by_key: dict[str, dict] = {}
    for r in loaded:
        for v in r["variants"]:
            row = by_key.setdefault(v["key"], {**v, "windows": [], "long_windows": []})
            for key in ("windows", "long_windows"):
                seen = {(w["start"], w["length"]) for w in row[key]}
                row[key] += [w for w in v[key] if (w["start"], w["length"]) not in seen]
    merged["variants"] = sorted(by_key.values(), key=lambda v: order.get(v["key"], len(order)))
    for key in ("windows", "long_windows"):  # every perplexity covers the windows that all variants ran
        sets = [{(w["start"], w["length"]) for w in v[key]} for v in merged["variants"] if v[key]]
        common = set.intersection(*sets) if sets else set()
        for v in merged["variants"]:
            v[key] = sorted((w for w in v[key] if (w["start"], w["length"]) in common), key=lambda w: w["start"])
            for stale in ("ppl", "scored", "n_windows"):
                v.pop(stale + ("_long" if key == "long_windows" else ""), None)
    _summarise(merged)
    from somatile.model.smollm2 import window_starts
    if all(v.get("n_windows") == len(window_starts(merged["n_tokens"], merged["window"])) for v in merged["variants"]):
        merged.pop("stopped_by_budget", None)  # the slices together covered every window
    merged["command"] = "; ".join([r["command"] for r in loaded]
                                  + [f"python -m somatile.eval --merge {out} {' '.join(map(str, parts))}"])
    merged["seconds"] = max(r.get("seconds", 0.0) for r in loaded)
    merged["merged_from"] = [str(p) for p in parts]
    out.mkdir(parents=True, exist_ok=True)
    _smollm2_plots(out, merged)
    write_outputs(out, merged, smollm2_markdown(merged))
    return merged
