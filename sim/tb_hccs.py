"""cocotb testbench of the HCCS unit (hw/hccs.py) with the golden model ``hccs_int`` as scoreboard.

A job (see :func:`make_job`) carries the rows, their masks and heads, the per-head parameters and the traffic
pattern; :func:`somatile.sim.runner.build_and_test` hands it to the ``hccs_rows`` test, which configures the
heads through ``cfg``, streams every row through ``i`` and collects ``o`` with random input idles and output
backpressure. The per-cycle Python work is one FallingEdge, two reads and up to three writes: whole beats are
packed before the run and unpacked after it. This relies on the unit's contract that ``i.ready`` and
``o.valid``/``o.payload`` depend on internal state only (never combinationally on ``i`` or ``o.ready``), so
values read at the falling edge decide the handshakes of the next rising edge.

The simulator process imports only numpy and cocotb until a strict check needs the model. The test writes
``out`` (the unit's rows, int32 of shape (R, N)), ``framing_errors``, ``cycles`` (first input beat accepted
to last output beat taken, inclusive) and ``loop_seconds`` (wall time of the streaming loop) back to the
caller; with ``strict`` it also fails on the first mismatch against the model, naming the row, head and
elements.
"""

from __future__ import annotations

import itertools
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge

from somatile.sim.runner import job_inputs, write_job_outputs

MAX_REPORTED = 5
CFG_FIELDS = ("B", "S", "dmax", "mode", "out")


def make_job(x: np.ndarray, heads: np.ndarray, B, S, dmax, *, modes, outs, mask=None, lanes: int,
             head_bits: int, out_bits: int, idle: float = 0.0, backpressure: float = 0.0, seed: int = 0,
             strict: bool = True, allow_zero_floor: bool = False) -> dict[str, np.ndarray]:
    """Inputs of the ``hccs_rows`` test. x: int8 (R, N); heads: int (R,) head of each row; B, S, dmax, modes
    ("div"/"clb"), outs ("uint8"/"int16"): per head (H,); mask: bool (R, N) or None; idle/backpressure:
    probability of an idle input cycle / a cycle with ``o.ready`` low."""
    from somatile.hw.hccs import head_params_layout
    from somatile.model.hccs import MODE_CODES, OUT_CODES

    layout = head_params_layout()
    x = np.asarray(x)
    if x.dtype != np.int8 or x.ndim != 2:
        raise ValueError(f"x: expected int8 of shape (R, N), got {x.dtype} {x.shape}")
    mask = np.ones(x.shape, bool) if mask is None else np.asarray(mask, bool)
    return {"x": x, "mask": mask, "heads": np.asarray(heads, np.int64), "B": np.asarray(B, np.int64),
            "S": np.asarray(S, np.int64), "dmax": np.asarray(dmax, np.int64),
            "mode": np.array([MODE_CODES[m] for m in modes]), "out": np.array([OUT_CODES[o] for o in outs]),
            "lanes": np.int64(lanes), "head_bits": np.int64(head_bits), "out_bits": np.int64(out_bits),
            "idle": np.float64(idle), "backpressure": np.float64(backpressure), "seed": np.int64(seed),
            "strict": np.bool_(strict), "allow_zero_floor": np.bool_(allow_zero_floor),
            "cfg_offsets": np.array([layout[name].offset for name in CFG_FIELDS])}


def golden(job: dict[str, np.ndarray]) -> np.ndarray:
    """The model's output for every row of a job, int32 (R, N)."""
    from somatile.model.hccs import MODE_CODES, OUT_CODES, hccs_int

    x, mask, heads = job["x"], job["mask"], job["heads"]
    modes = {v: k for k, v in MODE_CODES.items()}
    outs = {v: k for k, v in OUT_CODES.items()}
    expected = np.zeros(x.shape, np.int32)
    for h in np.unique(heads):
        rows = heads == h
        expected[rows] = hccs_int(x[rows], int(job["B"][h]), int(job["S"][h]), int(job["dmax"][h]),
                                  mode=modes[int(job["mode"][h])], out=outs[int(job["out"][h])], mask=mask[rows],
                                  allow_zero_floor=bool(job["allow_zero_floor"]))
    return expected


def mismatches(job: dict[str, np.ndarray], got: np.ndarray, expected: np.ndarray | None = None) -> list[str]:
    """One line per row whose output differs from the model (all rows; callers cut the list)."""
    expected = golden(job) if expected is None else expected
    lines = []
    for r in np.flatnonzero((got != expected).any(axis=1)):
        cols = np.flatnonzero(got[r] != expected[r])
        shown = ", ".join(f"[{c}] x={int(job['x'][r, c])} got {int(got[r, c])} want {int(expected[r, c])}"
                          for c in cols[:4])
        lines.append(f"row {r} (head {int(job['heads'][r])}): {len(cols)} element(s) differ: {shown}")
    return lines


def row_beats(job: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The input beats of every row of a job as arrays: data (K, L) of the logits' type (int8, or int16 for
    the wide unit of sim/tb_wide.py), mask bool (K, L), first, last, head (K,). A partial last beat is padded
    with masked zero lanes."""
    lanes = int(job["lanes"])
    x, mask, heads = job["x"], job["mask"], job["heads"]
    rows, n = x.shape
    beats = -(-n // lanes)
    data = np.zeros((rows, beats * lanes), x.dtype)
    data[:, :n] = x
    keep = np.zeros((rows, beats * lanes), bool)
    keep[:, :n] = mask
    position = np.tile(np.arange(beats), rows)
    return {"data": data.reshape(-1, lanes), "mask": keep.reshape(-1, lanes), "first": position == 0,
            "last": position == beats - 1, "head": np.repeat(heads, beats)}


def pack_beats(beats: dict[str, np.ndarray]) -> list[int]:
    """Payload integers of input beats (struct order: data, mask, first, last, head); a lane is as wide as
    the data's type."""
    lanes = beats["data"].shape[1]
    data_bits = 8 * beats["data"].dtype.itemsize * lanes
    masks = np.packbits(beats["mask"], axis=1, bitorder="little")
    words = []
    for k in range(len(beats["data"])):
        word = int.from_bytes(beats["data"][k].astype(beats["data"].dtype.newbyteorder("<")).tobytes(), "little")
        word |= int.from_bytes(masks[k].tobytes(), "little") << data_bits
        word |= int(beats["first"][k]) << (data_bits + lanes)
        word |= int(beats["last"][k]) << (data_bits + lanes + 1)
        word |= int(beats["head"][k]) << (data_bits + lanes + 2)
        words.append(word)
    return words


def unpack_beats(words: list[int], lanes: int, out_bits: int) -> dict[str, np.ndarray]:
    """Output payload integers as arrays: data int32 (K, L), mask bool (K, L), first, last, head (K,)."""
    data_bits = out_bits * lanes
    lane_dtype = np.dtype(np.uint8 if out_bits == 8 else "<u2")
    raw = b"".join((w & ((1 << data_bits) - 1)).to_bytes(data_bits // 8, "little") for w in words)
    flags = [w >> data_bits for w in words]
    return {"data": np.frombuffer(raw, lane_dtype).reshape(len(words), lanes).astype(np.int32),
            "mask": np.array([[(f >> j) & 1 for j in range(lanes)] for f in flags], bool).reshape(-1, lanes),
            "first": np.array([(f >> lanes) & 1 for f in flags], bool),
            "last": np.array([(f >> (lanes + 1)) & 1 for f in flags], bool),
            "head": np.array([f >> (lanes + 2) for f in flags], np.int64)}


def unpack_rows(job: dict[str, np.ndarray], words: list[int]) -> tuple[np.ndarray, list[str]]:
    """Output payload integers back to rows (int32 (R, N)) and a list of framing problems."""
    lanes = int(job["lanes"])
    rows, n = job["x"].shape
    sent = row_beats(job)
    got = unpack_beats(words, lanes, int(job["out_bits"]))
    if len(words) != len(sent["data"]):
        return np.zeros((rows, n), np.int32), [f"expected {len(sent['data'])} output beats, got {len(words)}"]
    problems = []
    for field in ("mask", "first", "last", "head"):
        wrong = np.flatnonzero((got[field] != sent[field]).reshape(len(words), -1).any(axis=1))
        problems += [f"beat {k} (row {k // -(-n // lanes)}): {field} {got[field][k]} expected {sent[field][k]}"
                     for k in wrong[:MAX_REPORTED]]
    return got["data"].reshape(rows, -1)[:, :n], problems


def pack_cfg(job: dict[str, np.ndarray], head: int, fields: tuple[str, ...] = CFG_FIELDS) -> int:
    """Payload of one ``cfg`` write: head, then the parameter ``fields`` (the unit's ``head_params_layout``)
    at the offsets the job carries (so that the simulator process needs neither Amaranth nor the model to
    pack it)."""
    word = head
    shift = int(job["head_bits"])
    for name, offset in zip(fields, job["cfg_offsets"]):
        word |= int(job[name][head]) << (shift + int(offset))
    return word


def _bernoulli(rng: np.random.Generator, p: float):
    """Endless stream of booleans, True with probability p, drawn in blocks (no per-cycle RNG call)."""
    while True:
        if p <= 0:
            yield from itertools.repeat(False)
        yield from (rng.random(1 << 16) < p).tolist()


class HCCSTB:
    """Drives one HCCS unit: reset, head configuration, and a run of rows with idles and backpressure."""

    def __init__(self, dut):
        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())

    async def reset(self):
        dut = self.dut
        dut.rst.value = 1
        dut.i__valid.value = 0
        dut.o__ready.value = 0
        dut.cfg__valid.value = 0
        dut.clear_status.value = 0
        for _ in range(2):
            await RisingEdge(dut.clk)
        dut.rst.value = 0

    async def configure(self, job, pack=None):
        """Write every head's parameters through ``cfg`` (``pack(job, head)``: the payload; default
        :func:`pack_cfg`)."""
        dut = self.dut
        pack = pack_cfg if pack is None else pack
        await FallingEdge(dut.clk)
        for head in range(len(job["B"])):
            dut.cfg__payload.value = pack(job, head)
            dut.cfg__valid.value = 1
            await FallingEdge(dut.clk)
        dut.cfg__valid.value = 0

    async def run(self, words: list[int], expect: int, idle: float, backpressure: float,
                  seed: int) -> tuple[list[int], int]:
        """Stream ``words`` in, collect ``expect`` beats out; return (output words, cycles first-in..last-out).

        Cycle k is the rising edge after the k-th falling edge; both handshakes of edge k are decided at
        falling edge k from what is driven and read there."""
        dut = self.dut
        idle_draws = _bernoulli(np.random.default_rng(seed), idle)
        stall_draws = _bernoulli(np.random.default_rng(seed + 1), backpressure)
        i_valid, i_ready, i_payload = dut.i__valid, dut.i__ready, dut.i__payload
        o_valid, o_ready, o_payload = dut.o__valid, dut.o__ready, dut.o__payload
        out_words = []
        sent, total = 0, len(words)
        first_in = last_out = None
        # Generous: every beat may wait out a reciprocal and the drawn idles/stalls.
        max_cycles = int(64 * (total + expect) / max(1e-3, (1 - idle) * (1 - backpressure))) + 2000
        for cycle in range(max_cycles):
            await FallingEdge(dut.clk)
            driving = sent < total and not next(idle_draws)
            if driving:
                i_payload.value = words[sent]
            i_valid.value = int(driving)
            ready = not next(stall_draws)
            o_ready.value = int(ready)
            if driving and i_ready.value:
                sent += 1
                if first_in is None:
                    first_in = cycle
            if ready and o_valid.value:
                out_words.append(o_payload.value.to_unsigned())
                last_out = cycle
                if len(out_words) == expect:
                    break
        else:
            raise AssertionError(f"timeout after {max_cycles} cycles: {sent} of {total} beats sent, "
                                 f"{len(out_words)} of {expect} taken")
        await RisingEdge(dut.clk)
        o_ready.value = 0
        i_valid.value = 0
        return out_words, last_out - first_in + 1

    async def status(self) -> dict[str, int]:
        word = self.dut.status.value.to_unsigned()
        return {name: (word >> bit) & 1 for bit, name in enumerate(("overflow", "framing", "bad_head", "busy"))}


async def run_rows(dut, job, pack, reference, model: str) -> None:
    """The rows test of a row unit (this unit, or the wide one of sim/tb_wide.py): configure the heads with
    ``pack(job, head)``, stream the job's rows under its idles and backpressure, write the outputs back and,
    with ``strict``, fail on the first row that differs from ``reference(job)`` (the model named ``model``)."""
    tb = HCCSTB(dut)
    await tb.reset()
    await tb.configure(job, pack)
    words = pack_beats(row_beats(job))
    started = time.perf_counter()
    out_words, cycles = await tb.run(words, len(words), float(job["idle"]), float(job["backpressure"]),
                                     int(job["seed"]))
    loop_seconds = time.perf_counter() - started
    got, framing = unpack_rows(job, out_words)
    status = await tb.status()
    write_job_outputs(out=got, cycles=np.int64(cycles), loop_seconds=np.float64(loop_seconds),
                      framing_errors=np.array(framing, dtype=str),
                      status=np.array([status["overflow"], status["framing"], status["bad_head"]]))
    if bool(job["strict"]):
        assert not framing, "framing: " + "; ".join(framing[:MAX_REPORTED])
        bad = mismatches(job, got, reference(job))
        assert not bad, f"{len(bad)} of {len(got)} rows differ from {model}: " + "; ".join(bad[:MAX_REPORTED])


@cocotb.test()
async def hccs_rows(dut):
    await run_rows(dut, job_inputs(), pack_cfg, golden, "hccs_int")


@cocotb.test()
async def hccs_beats(dut):
    """Raw beats in (``beat_*`` arrays, framing errors and over-long rows allowed), ``expect`` beats out;
    returns them with the status before and after ``clear_status``."""
    job = job_inputs()
    tb = HCCSTB(dut)
    await tb.reset()
    await tb.configure(job)
    beats = {field: job[f"beat_{field}"] for field in ("data", "mask", "first", "last", "head")}
    out_words, _ = await tb.run(pack_beats(beats), int(job["expect"]), 0.0, 0.0, 0)
    before = await tb.status()
    await FallingEdge(dut.clk)
    dut.clear_status.value = 1
    await FallingEdge(dut.clk)
    dut.clear_status.value = 0
    after = await tb.status()
    got = unpack_beats(out_words, int(job["lanes"]), int(job["out_bits"]))
    write_job_outputs(**{f"out_{k}": v for k, v in got.items()},
                      status_before=np.array([before[k] for k in ("overflow", "framing", "bad_head")]),
                      status_after=np.array([after[k] for k in ("overflow", "framing", "bad_head")]))
