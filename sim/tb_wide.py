"""cocotb testbench of the wide profile's row normaliser (hw/wide.py) with ``somatile.model.wide`` as the
scoreboard: the beat packing, the traffic loop (idles and backpressure) and the framing checks are those of
the HCCS unit's bench (sim/tb_hccs.py), with int16 lanes in, Q15 lanes out and the wide unit's per-head
parameters (normaliser code, B, S, dmax).

The job (:func:`make_job`) carries the rows, masks and heads, the per-head parameters and the traffic pattern;
the ``wide_rows`` test writes ``out`` (int32 (R, N)), ``framing_errors``, ``status`` and ``cycles`` (first input
beat accepted to last output beat taken, inclusive) back; with ``strict`` it fails on the first mismatch.
"""

from __future__ import annotations

import cocotb
import numpy as np

from somatile.sim.runner import job_inputs
from somatile.sim.tb_hccs import pack_cfg, run_rows

CFG_FIELDS = ("code", "B", "S", "dmax")
OUT_BITS = 16


def make_job(x: np.ndarray, heads: np.ndarray, normalisers, B, S, dmax, *, mask=None, lanes: int, head_bits: int,
             idle: float = 0.0, backpressure: float = 0.0, seed: int = 0, strict: bool = True) -> dict:
    """Inputs of the ``wide_rows`` test. x: int16 (R, N) logits in 2^-8 bit units; heads: int (R,);
    normalisers ("exp"/"hccs"/"pwl2"), B, S, dmax: per head; mask: bool (R, N) or None."""
    from somatile.hw.wide import head_params_layout
    from somatile.model import wide

    x = np.asarray(x)
    if x.dtype != np.int16 or x.ndim != 2:
        raise ValueError(f"x: expected int16 of shape (R, N), got {x.dtype} {x.shape}")
    mask = np.ones(x.shape, bool) if mask is None else np.asarray(mask, bool)
    return {"x": x, "mask": mask, "heads": np.asarray(heads, np.int64),
            "code": np.array([wide.NORM_CODES[n] for n in normalisers]), "B": np.asarray(B, np.int64),
            "S": np.asarray(S, np.int64), "dmax": np.asarray(dmax, np.int64), "lanes": np.int64(lanes),
            "head_bits": np.int64(head_bits), "out_bits": np.int64(OUT_BITS), "idle": np.float64(idle),
            "backpressure": np.float64(backpressure), "seed": np.int64(seed), "strict": np.bool_(strict),
            "cfg_offsets": np.array([head_params_layout[name].offset for name in CFG_FIELDS])}


def golden(job: dict) -> np.ndarray:
    """The model's output for every row of a job, int32 (R, N)."""
    from somatile.model import wide

    names = {code: name for name, code in wide.NORM_CODES.items()}
    x, mask, heads = job["x"], job["mask"], job["heads"]
    expected = np.zeros(x.shape, np.int32)
    for h in np.unique(heads):
        rows = heads == h
        expected[rows] = wide.wide_softmax(x[rows], names[int(job["code"][h])], int(job["B"][h]), int(job["S"][h]),
                                           int(job["dmax"][h]), mask=mask[rows], impl="numpy")
    return expected


@cocotb.test()
async def wide_rows(dut):
    await run_rows(dut, job_inputs(), lambda job, head: pack_cfg(job, head, CFG_FIELDS), golden, "wide_softmax")
