"""Seeded synthetic attention logits whose per-head spread resembles real attention.

Real encoders and small LMs show a few very peaked heads (a previous-token or copy head whose top weight is
near 0.999, a sink head that parks its mass on the first token) and mostly broad heads whose logit standard
deviation is 1-4 (MiniLM layer ranges 7-19, SmolLM2 median std 2.5; notes/realdata.md). The generator mixes
those kinds; it stands in for real logits until `somatile eval minilm` dumps them (same .npz layout:
``logits`` (H, R, N) float32, ``mask`` (H, R, N) bool).
"""

from __future__ import annotations

import numpy as np

HEAD_KINDS = ("broad", "previous", "sink")


def head_kinds(heads: int, peaked: int) -> list[str]:
    """The kind of each head: ``peaked`` heads alternate previous-token and sink, the rest are broad."""
    if not 0 <= peaked <= heads:
        raise ValueError(f"peaked: expected 0..{heads} peaked heads, got {peaked}")
    return ["previous" if i % 2 == 0 else "sink" for i in range(peaked)] + ["broad"] * (heads - peaked)


def synthetic_logits(heads: int = 12, rows: int = 2000, cols: int = 128, *, peaked: int = 2, seed: int = 0,
                     padding: bool = False) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Return (logits float32 (H, R, N), mask bool (H, R, N), kinds) drawn from a seeded generator.

    Broad heads: N(0, sigma_h) with sigma_h spread over 1.0..3.5 across heads, plus a mild per-row offset
    (irrelevant to softmax, there so that quantisation sees a realistic range). Previous-token heads: a
    broad row (sigma 2) whose target column r mod N gets +9..+14, top weight ~0.99. Sink heads: column 0
    gets +6..+10. ``padding``: each row keeps a random valid prefix of N/4..N columns (mask False after it),
    and the target of a previous-token head stays inside it.
    """
    if heads < 1 or rows < 1 or cols < 1:
        raise ValueError(f"heads, rows, cols: expected >= 1 each, got {heads}, {rows}, {cols}")
    rng = np.random.default_rng(seed)
    kinds = head_kinds(heads, peaked)
    broad = [k == "broad" for k in kinds]
    sigmas = np.ones(heads) * 2.0
    sigmas[np.flatnonzero(broad)] = np.linspace(1.0, 3.5, int(np.sum(broad)))
    logits = rng.normal(0.0, 1.0, size=(heads, rows, cols)) * sigmas[:, None, None]
    logits += rng.normal(0.0, 2.0, size=(heads, rows, 1))
    mask = np.ones((heads, rows, cols), bool)
    if padding:
        lengths = rng.integers(max(1, cols // 4), cols + 1, size=rows)
        mask &= np.arange(cols)[None, None, :] < lengths[None, :, None]
    else:
        lengths = np.full(rows, cols)
    for h, kind in enumerate(kinds):
        if kind == "previous":
            target = np.arange(rows) % lengths
            logits[h, np.arange(rows), target] += rng.uniform(9.0, 14.0, size=rows)
        elif kind == "sink":
            logits[h, :, 0] += rng.uniform(6.0, 10.0, size=rows)
    return logits.astype(np.float32), mask, kinds
