"""Attention logits as `somatile calibrate` and `somatile compare` read them, and how a normaliser's
probabilities are scored on them against softmax.

Reading: ``--logits FILE.npz`` (:func:`load_npz`) or seeded synthetic logits (:func:`load_input`), with the
options both commands share (:func:`add_input_arguments`).

Scoring, per row (averaged over rows that have a valid element; q = softmax, p = the normaliser's output):

- ``kl_seed``: KL(q || p) = sum q (log q - max(log p, -100)), seed 003's ``F.kl_div(p.log().clamp(-100), q)``
  per row. A clipped token (p = 0) costs q * (log q + 100), so this value is dominated by how much softmax
  mass falls on clipped tokens (docs/calibration.md).
- ``kl_eps``: KL(q || (1 - eps) p + eps / n) with eps = 1e-3 and n the row's valid count: finite, and a
  clipped token costs at most q * log(n / eps).
- ``tv``: total variation 0.5 * sum |q - p| (0..1).

These :data:`OBJECTIVES` are what calibration minimises (its grid kernels call :func:`objective_term` and
:func:`row_objective`); :func:`head_metrics` reports them per head with the other metrics of `somatile compare`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import numba
import numpy as np

from somatile.model import hccs, synth

OBJECTIVES = {"kl_seed": 0, "kl_eps": 1, "tv": 2}
KL_LOG_CLAMP = -100.0
KL_EPS = 1e-3


@numba.njit(cache=True, nogil=True)
def objective_term(q, p, n_valid, objective):
    """One element's contribution to the row objective."""
    if objective == 2:
        return 0.5 * abs(q - p)
    if q <= 0.0:
        return 0.0
    if objective == 0:
        log_p = math.log(p) if p > 0.0 else KL_LOG_CLAMP
        return q * (math.log(q) - max(log_p, KL_LOG_CLAMP))
    return q * (math.log(q) - math.log((1.0 - KL_EPS) * p + KL_EPS / n_valid))


@numba.njit(cache=True, nogil=True)
def row_objective(q_row, p_row, valid_row, objective):
    """Objective of one row (see the module doc); valid_row of length 0 = all valid; NaN for an empty row."""
    n = q_row.shape[0]
    every = valid_row.shape[0] == 0
    n_valid = 0
    for i in range(n):
        if every or valid_row[i]:
            n_valid += 1
    if n_valid == 0:
        return np.nan
    acc = 0.0
    for i in range(n):
        if every or valid_row[i]:
            acc += objective_term(q_row[i], p_row[i], n_valid, objective)
    return acc


@numba.njit(cache=True, nogil=True)
def row_objectives(q, p, valid, objective, out):
    """row_objective over rows of (R, N) arrays; valid (R, N) or (R, 0); out (R,) float64."""
    for r in range(q.shape[0]):
        out[r] = row_objective(q[r], p[r], valid[r], objective)


def objective_per_row(q: np.ndarray, p: np.ndarray, mask, objective: str) -> np.ndarray:
    """Per-row objective of p against reference q, any leading shape (..., N); NaN for rows without a
    valid element. p may be unnormalised (clb output / 255): the value then shows that too."""
    code = hccs.code_of(OBJECTIVES, "objective", objective)
    n = q.shape[-1]
    q2 = np.ascontiguousarray(q.reshape(-1, n), np.float64)
    p2 = np.ascontiguousarray(p.reshape(-1, n), np.float64)
    valid = np.empty((q2.shape[0], 0), np.bool_) if mask is None else np.ascontiguousarray(mask.reshape(-1, n))
    out = np.empty(q2.shape[0])
    row_objectives(q2, p2, valid, code, out)
    return out.reshape(q.shape[:-1])


SYNTH_VALUE_DIM = 32


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """Input options shared by `somatile compare` and `somatile calibrate`."""
    parser.add_argument("--logits", metavar="FILE.npz",
                        help="logits (H,R,N) float (or int8 with scale (H,)), optional mask (H,R,N) bool and "
                             "values (H,N,D); default: seeded synthetic logits")
    g = parser.add_argument_group("synthetic logits (without --logits)")
    g.add_argument("--heads", type=int, default=12)
    g.add_argument("--rows", type=int, default=2000)
    g.add_argument("--cols", type=int, default=128)
    g.add_argument("--peaked", type=int, default=2, help="number of very peaked heads (default 2)")
    g.add_argument("--padding", action="store_true", help="random valid prefix per row (mask)")
    g.add_argument("--seed", type=int, default=0)


@dataclasses.dataclass
class LogitsInput:
    """What `compare` and `calibrate` work on: float logits (H, R, N), optional mask (H, R, N) bool, values
    (H, N, D), the int8 scale (H,) when the file held int8 logits (None: chosen by calibration), and a
    description of the source."""

    logits: np.ndarray
    mask: np.ndarray | None
    values: np.ndarray | None
    scale: np.ndarray | None
    source: str


def load_npz(path) -> LogitsInput:
    """Read and check an input file. ``logits`` is float (H, R, N), or int8 (H, R, N) together with ``scale``
    (H,) float (logit = int8 * scale: quantised logits after QAT, calibrated with that scale). Optional
    ``mask`` (H, R, N) bool and ``values`` (H, N, D) float. Errors name the file and the array at fault."""
    from somatile.model.files import read_npz
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (expected an .npz with array 'logits' (H, R, N))")
    try:
        arrays = read_npz(str(path), "logits file")
    except ValueError as exc:   # also a .npy inside that is not an array file
        raise ValueError(f"{path}: not a readable .npz file ({exc})") from exc
    if "logits" not in arrays:
        raise ValueError(f"{path}: missing array 'logits' (H, R, N); found {sorted(arrays)}")
    unknown = sorted(set(arrays) - {"logits", "mask", "values", "scale"})
    if unknown:
        raise ValueError(f"{path}: unknown array {unknown[0]!r} (expected logits, mask, values, scale)")
    logits, mask, values, scale = (arrays.get(k) for k in ("logits", "mask", "values", "scale"))
    if logits.ndim != 3 or (logits.dtype.kind != "f" and logits.dtype != np.int8):
        raise ValueError(f"{path}: 'logits' must be float or int8 (H, R, N), got {logits.dtype} {logits.shape}")
    H, _, N = logits.shape
    if logits.dtype == np.int8:
        if scale is None or scale.shape != (H,) or scale.dtype.kind != "f":
            raise ValueError(f"{path}: int8 'logits' need 'scale' float ({H},) (logit = int8 * scale), got "
                             f"{None if scale is None else (scale.dtype, scale.shape)}")
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError(f"{path}: 'scale' must be finite and positive, got {scale.tolist()}")
        logits = logits.astype(np.float64) * scale[:, None, None]
    elif scale is not None:
        raise ValueError(f"{path}: 'scale' goes with int8 'logits' only (these are {logits.dtype})")
    try:
        hccs.as_heads(logits, mask, "logits", floating=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if H == 0:
        raise ValueError(f"{path}: 'logits' has no heads (shape {logits.shape}); expected (H, R, N) with H >= 1")
    if mask is not None and not mask.any():
        raise ValueError(f"{path}: 'mask' is False everywhere: no row has an element to calibrate on")
    if mask is not None and not mask.any(axis=-1).all():
        empty = int((~mask.any(axis=-1)).sum())
        print(f"note: {path}: {empty} fully-masked rows (HCCS outputs zeros there; they are left out of the "
              f"metrics)")
    if values is not None:
        if values.ndim != 3 or values.shape[:2] != (H, N) or values.dtype.kind != "f":
            raise ValueError(f"{path}: 'values' must be float (H, N, D) = ({H}, {N}, D), got "
                             f"{values.dtype} {values.shape}")
        if not np.isfinite(values).all():
            raise ValueError(f"{path}: 'values' holds NaN or inf")
    return LogitsInput(logits, mask, values, None if scale is None else scale.astype(np.float64), str(path))


def load_input(args) -> LogitsInput:
    """Logits from --logits or the synthetic generator (which adds seeded N(0, 1) values (H, N, 32))."""
    if args.logits:
        return load_npz(args.logits)
    logits, mask, kinds = synth.synthetic_logits(args.heads, args.rows, args.cols, peaked=args.peaked,
                                                 seed=args.seed, padding=args.padding)
    values = np.random.default_rng(args.seed + 1).normal(size=(args.heads, args.cols, SYNTH_VALUE_DIM))
    source = (f"synthetic logits (heads {args.heads}, rows {args.rows}, cols {args.cols}, peaked {args.peaked}, "
              f"seed {args.seed}{', padded' if args.padding else ''})")
    return LogitsInput(logits, mask if args.padding else None, values, None, source)


def head_metrics(q, p, valid, values=None) -> dict[str, float]:
    """Metrics of probabilities p against reference q for one head ((R, N) each; valid (R, N) bool)."""
    rows = valid.any(axis=-1)
    q, p, valid = q[rows], p[rows], valid[rows]
    sums = p.sum(axis=-1)
    at_top = np.take_along_axis(p, np.argmax(np.where(valid, q, -1), -1)[:, None], -1)[:, 0]
    p_max = np.where(valid, p, -1).max(axis=-1)
    metrics = {
        "tv": float(np.mean(objective_per_row(q, p, valid, "tv"))),
        "kl_eps": float(np.mean(objective_per_row(q, p, valid, "kl_eps"))),
        "kl_seed": float(np.mean(objective_per_row(q, p, valid, "kl_seed"))),
        "max_abs": float(np.max(np.abs(p - q))),
        # Ties are common in uint8 outputs: "top1" counts a row when softmax's top element is among p's
        # maxima, "top1_strict" only when it is p's unique maximum.
        "top1": float(np.mean(at_top >= p_max)),
        "top1_strict": float(np.mean((at_top >= p_max) & ((np.where(valid, p, -1) == p_max[:, None]).sum(-1) == 1))),
        "rowsum_mean": float(sums.mean()), "rowsum_min": float(sums.min()), "rowsum_max": float(sums.max()),
    }
    if values is not None:
        ref = q @ values
        err = np.linalg.norm(p @ values - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-12)
        metrics["out_err"] = float(err.mean())
    return metrics

