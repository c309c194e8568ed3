"""HCCS normaliser in hardware: L int8 lanes per beat in, L uint8/int16 lanes out, bit-exact with ``hccs_int``.

Ports (``amaranth.lib.stream``; Verilog names ``i__payload/i__valid/i__ready`` etc.)

``i``   (in)  :data:`in_beat_layout`: ``data`` L x int8, ``mask`` L bits (1 = the element takes part; pad a
              partial last beat with 0), ``first``, ``last``, ``head``. A row is the beats up to and including
              the one with ``last``; ``head`` and the head's parameters are taken from the row's first beat.
``o``   (out) :data:`out_beat_layout`: ``data`` L x u8 (``out_type="uint8"``) or L x 16 bit
              (``out_type="int16"``: per head either uint8 values zero-extended or int16 values, all
              non-negative), with the input row's ``mask``, ``first``, ``last`` and ``head``. Masked lanes are
              0; a fully masked row is all 0.
``cfg`` (in, always ready) :data:`cfg_layout`: writes ``B``, ``S``, ``dmax``, ``mode`` (MODE_DIV/MODE_CLB)
              and ``out`` (OUT_UINT8/OUT_INT16; with ``out_type="uint8"`` every head is OUT_UINT8) of one head. A row uses
              the parameters its head had when its first beat was accepted. Writes to heads >= ``heads`` are
              ignored.
``status`` (out) sticky error bits, cleared by ``clear_status`` or reset: ``overflow`` (a row had more than
              ``n_max`` elements: beats past the capacity were dropped, the row was normalised over its
              first ``n_max`` elements), ``framing`` (``first`` disagreed with the row framing by ``last``),
              ``bad_head`` (a row named a head >= ``heads``: it uses all-zero parameters and outputs zeros).
              ``busy``: a row is inside the unit.

Structure (why it sustains one beat per cycle). The row maximum is known only after the last beat, and the
row sum only after the maximum, so a row passes three reading passes over a row buffer plus a reciprocal:

1. ingest: write beats into bank ``r mod 4`` of the row memory; the beat's maximum over the valid lanes goes
   through a pipeline of one compare level per register stage into the row's running max;
2. sum: read the row back, ``sum d_i`` over valid lanes (``d = min(m - x, Dmax)``) and their count; the row
   total is ``count*B - S*sum d`` (equal to ``sum (B - S*d_i)``, so no per-lane multiplier here);
3. reciprocal: ``div`` a restoring divider, ``div_bits`` quotient bits per cycle; ``clb`` a leading-one
   detector and a shift;
4. normalise: read the row again, ``min((B - S*d_i) * inv >> shift, max)`` per lane, to ``o`` (register
   stages: read data, distance, ``S*d``, score, two partial products, their sum, saturate).

Four banks let ingest of row r+3, sum of r+2, reciprocal of r+1 and normalise of r run at the same time,
each stage taking the next row as soon as it is free (one ``amaranth.lib.memory`` with one write and two
read ports; bank depth ``n_max / lanes`` rounded up to a power of two). The register stages are there for
the clock: no path has more than one carry chain or one multiplier (the Fmax per lane count is in
docs/boards.md).

Contract
- Throughput: with ``nb = ceil(n / lanes)`` beats per row, rows of equal length sustain one row every
  ``max(nb, D, (3*nb + D + E + P + 1) / 4)`` cycles, where ``D`` is the reciprocal's occupancy
  (:func:`reciprocal_cycles`: ``2 + ceil(23 / div_bits)`` for div uint8, ``2 + ceil(15 / div_bits)`` for
  div int16, 3 for clb) and ``E = 1 + log2(lanes)`` the ingest pipeline (:func:`ingest_pipeline`). Rows of
  at least ``(D + E + P + 1) / 3`` and ``D`` beats therefore stream at one beat per cycle; shorter rows are
  bound by the reciprocal (div) or the four-bank ring.
- Latency of a lone row: ``3*nb + D + E + P + 12`` cycles from its first input beat to its last output beat,
  ``P`` the sum pipeline (:func:`sum_pipeline`: 6 up to 8 lanes, 7 at 16 and 32) and 12
  :data:`NORMALISE_PIPELINE`.
- Backpressure: ``o`` stalls only the normalise stage; the other stages run on until they need a bank it
  holds, then ``i.ready`` falls. No beat is lost or duplicated. ``i.ready`` is a register (it depends only
  on internal state) and rises one cycle after the normaliser releases a bank.
- :func:`expected_cycles` gives the exact cycle count of back-to-back rows with ``o`` always ready.
- Parameters outside the model's rules (``check_params``) are outside this contract except that every
  reachable total (up to ``n_max * 32767``) is divided exactly; ``B < S*Dmax`` (negative scores) is not
  supported.
"""

from __future__ import annotations

import dataclasses
import math
import operator

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from somatile.hw.pipe import Replicated, lut_mul_pairs, reduce_levels, reduce_tree, reg
# The unit accepts the lane counts and output types a board may give the tile: one value set for both.
from somatile.hw.tile_params import HCCS_LANES, HCCS_OUT_TYPES
from somatile.model.hccs import (B_MAX, DMAX_MAX, INPUT_BITS, INT16_MAX, INT16_NUMERATOR, INV_SHIFT, MODE_CLB,
                                 MODE_CODES, OUT_CODES, OUT_INT16, OUT_UINT8, PRODUCT_BITS, S_MAX, UINT8_MAX,
                                 UINT8_NUMERATOR)

BANKS = 4
NORMALISE_PIPELINE = 12
"""Cycles from a normalise-stage memory read to its beat being taken from ``o`` (read, read register,
distance, operand copies, ``S*d``, product copy, score, operand copies, two partial products, product copies,
their sum, saturate into the output register). The copies on each side of a multiplier are registers that
only it uses, which the placer puts beside the DSP block; the long routes are then register to register."""
SUM_TREE_LEVELS = 3
"""Adder levels per register stage of the sum stage's tree: three levels of the short distance adders fit a
cycle on the ECP5 85F at 8 lanes; the four of 16 lanes in one stage did not (most of the path routing across
the wider tree), so wider units take another stage (:func:`sum_tree_stages`)."""
OUT_BITS = {"uint8": 8, "int16": 16}
INV_SPLIT = 12
"""The normaliser multiplies ``score * inv`` as ``score * inv[:12] + (score * inv[12:] << 12)``."""
NUMERATOR_BITS = {OUT_UINT8: UINT8_NUMERATOR.bit_length(), OUT_INT16: INT16_NUMERATOR.bit_length()}


@dataclasses.dataclass(frozen=True)
class HCCSConfig:
    """Elaboration parameters of the unit (validated; a bad value names itself and what was expected)."""
    lanes: int = 8
    heads: int = 2
    n_max: int = 256
    out_type: str = "uint8"
    div_bits: int = 2

    def __post_init__(self):
        if self.lanes not in HCCS_LANES:
            raise ValueError(f"lanes: expected one of {HCCS_LANES}, got {self.lanes!r}")
        if not (isinstance(self.heads, int) and 1 <= self.heads <= 256):
            raise ValueError(f"heads: expected an integer from 1 to 256, got {self.heads!r}")
        if not (isinstance(self.n_max, int) and self.n_max >= self.lanes and self.n_max % self.lanes == 0):
            raise ValueError(f"n_max: expected a positive multiple of lanes ({self.lanes}), got {self.n_max!r}")
        if self.out_type not in HCCS_OUT_TYPES:
            raise ValueError(f"out_type: expected one of {HCCS_OUT_TYPES}, got {self.out_type!r}")
        if self.div_bits not in (1, 2, 3, 4, 6, 8):
            raise ValueError(f"div_bits: expected 1, 2, 3, 4, 6 or 8 quotient bits per cycle, got {self.div_bits!r}")

    @property
    def beats_max(self) -> int:
        return self.n_max // self.lanes

    @property
    def head_bits(self) -> int:
        return max(1, ceil_log2(self.heads))

    @property
    def out_bits(self) -> int:
        return OUT_BITS[self.out_type]

    @property
    def total_bits(self) -> int:
        return bits_for(self.n_max * B_MAX)


def in_beat_layout(cfg: HCCSConfig) -> data.StructLayout:
    return data.StructLayout({"data": data.ArrayLayout(signed(INPUT_BITS), cfg.lanes), "mask": cfg.lanes,
                              "first": 1, "last": 1, "head": cfg.head_bits})


def out_beat_layout(cfg: HCCSConfig) -> data.StructLayout:
    return data.StructLayout({"data": data.ArrayLayout(unsigned(cfg.out_bits), cfg.lanes), "mask": cfg.lanes,
                              "first": 1, "last": 1, "head": cfg.head_bits})


def head_params_layout() -> data.StructLayout:
    return data.StructLayout({"B": bits_for(B_MAX), "S": bits_for(S_MAX), "dmax": bits_for(DMAX_MAX),
                              "mode": 1, "out": 1})


def cfg_layout(cfg: HCCSConfig) -> data.StructLayout:
    return data.StructLayout({"head": cfg.head_bits, "params": head_params_layout()})


status_layout = data.StructLayout({"overflow": 1, "framing": 1, "bad_head": 1, "busy": 1})


def reciprocal_cycles(cfg: HCCSConfig, mode: str = "div", out: str = "uint8") -> int:
    """Cycles the reciprocal stage holds one row (its occupancy ``D``)."""
    if MODE_CODES[mode] == MODE_CLB:
        return 3
    return 2 + math.ceil(NUMERATOR_BITS[OUT_CODES[out]] / cfg.div_bits)


def expected_cycles(cfg: HCCSConfig, rows: int, n: int, *, mode: str = "div", out: str = "uint8") -> int:
    """Cycles from the first input beat accepted to the last output beat taken, inclusive, for ``rows``
    back-to-back rows of ``n`` elements (input valid and output ready on every cycle).

    This evaluates the stage recurrence of the design exactly (each stage starts a row when the previous stage
    has finished it and the stage itself is free; bank ``r mod 4`` is reused once row r-4 is normalised):
    ingest takes ``nb`` cycles plus :func:`ingest_pipeline`, the sum stage ``nb`` cycles plus
    :func:`sum_pipeline`, the reciprocal ``D``, the normaliser ``nb`` plus :data:`NORMALISE_PIPELINE` to the
    output register. See the module docstring for the closed form.
    """
    if rows < 1 or not 1 <= n <= cfg.n_max:
        raise ValueError(f"rows must be >= 1 and n within 1..{cfg.n_max}, got rows={rows}, n={n}")
    nb = -(-n // cfg.lanes)
    recip = reciprocal_cycles(cfg, mode, out)
    extra = ingest_pipeline(cfg)
    ingest, summed, recips, norm = [], [], [], []
    for r in range(rows):
        i_start = 0 if r == 0 else ingest[r - 1] + nb
        if r >= BANKS:
            # The bank is released as its last beat is normalised; the registered i.ready rises a cycle later.
            i_start = max(i_start, norm[r - BANKS] + nb + 1)
        s_start = max(i_start + nb + extra, summed[r - 1] + nb if r else 0)
        d_start = max(s_start + nb + sum_pipeline(cfg), recips[r - 1] + recip if r else 0)
        n_start = max(d_start + recip, norm[r - 1] + nb if r else 0)
        ingest.append(i_start)
        summed.append(s_start)
        recips.append(d_start)
        norm.append(n_start)
    return norm[-1] + nb + NORMALISE_PIPELINE


def sum_tree_stages(cfg: HCCSConfig) -> int:
    """Register stages of the sum stage's adder tree over the lanes (:data:`SUM_TREE_LEVELS` levels each)."""
    return max(1, -(-ceil_log2(cfg.lanes) // SUM_TREE_LEVELS))


def sum_pipeline(cfg: HCCSConfig) -> int:
    """Cycles from the sum stage's read of a row's last beat to the row total being visible: read, read
    register, distance, the adder tree (:func:`sum_tree_stages`), accumulate, the two products ``count*B``
    and ``S*sum d``, their difference. 6 up to 8 lanes, 7 at 16 and 32."""
    return 5 + sum_tree_stages(cfg)


def _capped_distances(row_max, dmax, word):
    """``min(row_max - x, dmax)`` for every lane of a row-memory word; 0 for masked lanes."""
    lanes = []
    for j in range(len(word.mask)):
        dist = (row_max - word.data[j]).as_unsigned()[:INPUT_BITS]
        lanes.append(Mux(word.mask[j], Mux(dist > dmax, dmax, dist), 0))
    return lanes


def ingest_pipeline(cfg: HCCSConfig) -> int:
    """Extra cycles from a row's last input beat to its bank being ready for the sum stage: the registered
    lanes plus one stage per level of the beat-maximum tree, ``1 + log2(lanes)`` (one compare level per
    stage: two chained 8-bit compare-and-select levels do not fit a cycle on the ECP5 85F)."""
    return 1 + ceil_log2(cfg.lanes)


class HCCS(wiring.Component):
    """The HCCS unit; see the module docstring for ports, structure and contract.

    ``HCCS(lanes=8, heads=2, n_max=256, out_type="uint8", div_bits=2)`` or ``HCCS(config=HCCSConfig(...))``.
    """

    def __init__(self, config: HCCSConfig | None = None, **params):
        if config is None:
            config = HCCSConfig(**params)
        elif params:
            raise TypeError("pass either config= or keyword parameters, not both")
        self.config = config
        super().__init__({
            "i": In(stream.Signature(in_beat_layout(config))),
            "o": Out(stream.Signature(out_beat_layout(config))),
            "cfg": In(stream.Signature(cfg_layout(config))),
            "status": Out(status_layout),
            "clear_status": In(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        L, NB = cfg.lanes, cfg.beats_max
        ptr_bits = max(1, ceil_log2(NB))
        count_bits = bits_for(NB)
        bank_bits = ceil_log2(BANKS)
        total_bits = cfg.total_bits
        params_layout = head_params_layout()
        m = Module()

        word = data.StructLayout({"data": data.ArrayLayout(signed(INPUT_BITS), L), "mask": L})
        m.submodules.rows = rows = Memory(shape=word, depth=BANKS << ptr_bits, init=[])
        wr = rows.write_port()
        rd_sum = rows.read_port()
        rd_norm = rows.read_port()

        regfile = Array(Signal(params_layout, name=f"head{h}") for h in range(1 << cfg.head_bits))
        m.d.comb += self.cfg.ready.eq(1)
        with m.If(self.cfg.valid & (self.cfg.payload.head < cfg.heads)):
            m.d.sync += regfile[self.cfg.payload.head].eq(self.cfg.payload.params)
            if cfg.out_type == "uint8":
                m.d.sync += regfile[self.cfg.payload.head].out.eq(OUT_UINT8)

        # FILLING: the row's last beat is in, its maximum still in the ingest pipeline. SUMMING: the sum stage has
        # read the whole row and its total is still in the sum pipeline. Both pipelines are longer than a lap
        # of the four banks when rows are one beat long, so these states keep the next stage off the bank.
        FREE, FILLING, FULL, SUMMING, SUMMED, READY = range(6)
        state = Array(Signal(3, name=f"bank{b}_state") for b in range(BANKS))

        def per_bank(shape, name):
            return Array(Signal(shape, name=f"bank{b}_{name}") for b in range(BANKS))

        d_final = per_bank(count_bits, "final")  # index of the row's last stored beat
        d_max = per_bank(signed(INPUT_BITS), "max")
        d_head = per_bank(cfg.head_bits, "head")
        d_params = per_bank(params_layout, "params")
        d_inv = per_bank(bits_for(UINT8_NUMERATOR), "inv")
        d_single = per_bank(1, "single")  # d_final == 0 (a one-beat row), written beside d_final
        d_double = per_bank(1, "double")  # d_final == 1

        # Ingest: beats of row r go to bank r mod 4 while the normaliser has released it. The beat is written
        # to the row memory when accepted; its maximum goes through a pipeline (masked lanes registered, then one
        # compare level per stage, the last stage folding in the running maximum), and the bank turns FULL when
        # the row's last beat leaves that pipeline (ingest_pipeline(cfg) cycles later).
        wbank = Signal(bank_bits)
        iptr = Signal(count_bits)
        in_row = Signal()
        row_head = Signal(cfg.head_bits)
        row_params = Signal(params_layout)
        beat = self.i.payload
        # i.ready is a register (the write bank is free in the next cycle): as a comparison of the bank's state
        # it would reach the enables of the producer's register slice, too far for one cycle. It is computed from
        # this cycle's states, so it rises one cycle after the normaliser releases the bank.
        ready = Signal(init=1, name="i_ready")
        m.d.comb += self.i.ready.eq(ready)
        lane_min = Const(-(1 << (INPUT_BITS - 1)), signed(INPUT_BITS))
        stored = iptr < NB
        bad_head = Signal()
        cur_head = Mux(in_row, row_head, beat.head)
        cur_params = Signal(params_layout)
        m.d.comb += cur_params.eq(Mux(in_row, row_params, regfile[beat.head]))
        if cfg.heads < (1 << cfg.head_bits):
            with m.If(~in_row & (beat.head >= cfg.heads)):
                m.d.comb += [cur_params.eq(0), bad_head.eq(1)]
        m.d.comb += [wr.addr.eq(Cat(iptr[:ptr_bits], wbank)), wr.data.data.eq(beat.data),
                     wr.data.mask.eq(beat.mask)]
        accepted = self.i.valid & self.i.ready
        closing = accepted & beat.last
        free = Cat(state[b] == FREE for b in range(BANKS))
        m.d.sync += ready.eq(free.bit_select(Mux(closing, wbank + 1, wbank)[:bank_bits], 1))
        with m.If(accepted):
            m.d.comb += wr.en.eq(stored)
            with m.If(stored):
                m.d.sync += iptr.eq(iptr + 1)
            with m.Else():
                m.d.sync += self.status.overflow.eq(1)
            with m.If(beat.first != ~in_row):
                m.d.sync += self.status.framing.eq(1)
            with m.If(bad_head):
                m.d.sync += self.status.bad_head.eq(1)
            m.d.sync += [in_row.eq(1), row_head.eq(cur_head), row_params.eq(cur_params)]
            with m.If(beat.last):
                m.d.sync += [
                    d_final[wbank].eq(Mux(stored, iptr, iptr - 1)),
                    d_single[wbank].eq(Mux(stored, iptr == 0, iptr == 1)),
                    d_double[wbank].eq(Mux(stored, iptr == 1, iptr == 2)),
                    d_head[wbank].eq(cur_head),
                    d_params[wbank].eq(cur_params), state[wbank].eq(FILLING),
                    wbank.eq(wbank + 1), iptr.eq(0), in_row.eq(0),
                ]

        def max_stage(lanes):
            return data.StructLayout({"valid": 1, "start": 1, "last": 1, "bank": bank_bits,
                                      "lanes": data.ArrayLayout(signed(INPUT_BITS), lanes)})

        def signed_max(a, b):
            return Mux(a > b, a, b)

        # A beat past the row's capacity is dropped: it enters the pipeline with every lane masked.
        mx = Signal(max_stage(L), name="max0")
        m.d.sync += [mx.valid.eq(accepted), mx.start.eq(~in_row), mx.last.eq(beat.last), mx.bank.eq(wbank)]
        m.d.sync += [mx.lanes[j].eq(Mux(beat.mask[j] & stored, beat.data[j], lane_min)) for j in range(L)]
        max_pipe = [mx]
        for k in range(ceil_log2(L)):
            values = reduce_levels([mx.lanes[j] for j in range(len(mx.lanes))], signed_max, 1)
            nxt = Signal(max_stage(len(values)), name=f"max{k + 1}")
            m.d.sync += [nxt.valid.eq(mx.valid), nxt.start.eq(mx.start), nxt.last.eq(mx.last),
                         nxt.bank.eq(mx.bank)] + [nxt.lanes[j].eq(v) for j, v in enumerate(values)]
            max_pipe.append(nxt)
            mx = nxt
        # The running maximum the last stage folds in, already chosen (lane_min for a row's first beat): it is
        # computed a cycle early from the stage before's start flag, so the bank's maximum is one compare and
        # select away from registers (a select on start in front of it would not fit the cycle).
        run_max = Signal(signed(INPUT_BITS))
        beat_max = reduce_tree([mx.lanes[j] for j in range(len(mx.lanes))], signed_max)
        new_max = signed_max(beat_max, run_max)
        before = max_pipe[-2] if len(max_pipe) > 1 else None
        next_start = before.start if before is not None else ~in_row
        m.d.sync += run_max.eq(Mux(next_start, lane_min, Mux(mx.valid, new_max, run_max)))
        with m.If(mx.valid & mx.last):
            m.d.sync += [d_max[mx.bank].eq(new_max), state[mx.bank].eq(FULL)]

        # Sum pass: read the row back; per beat sum of d over valid lanes and their count; accumulate.
        sbank = Signal(bank_bits)
        s_active = Signal()
        s_ptr = Signal(count_bits)
        s_final = Signal(count_bits)
        s_max = Signal(signed(INPUT_BITS))
        s_dmax = Signal(bits_for(DMAX_MAX))
        s_start = ~s_active & (state[sbank] == FULL)
        s_ptr_now = Mux(s_active, s_ptr, 0)
        s_max_now = Mux(s_active, s_max, d_max[sbank])
        s_dmax_now = Mux(s_active, s_dmax, d_params[sbank].dmax)
        s_issue = s_active | s_start
        # s_ptr == s_final while active, in a register set as s_ptr steps; a row's first beat is its last when
        # the bank's one-beat flag says so (a comparison through sbank would sit in front of the banks' state
        # registers).
        s_at_end = Signal()
        s_last = Mux(s_active, s_at_end, d_single[sbank])
        m.d.comb += [rd_sum.addr.eq(Cat(s_ptr_now[:ptr_bits], sbank)), rd_sum.en.eq(1)]
        with m.If(s_start):
            m.d.sync += [s_final.eq(d_final[sbank]), s_max.eq(d_max[sbank]), s_dmax.eq(d_params[sbank].dmax)]
        with m.If(s_issue):
            with m.If(s_last):
                m.d.sync += [s_active.eq(0), sbank.eq(sbank + 1), state[sbank].eq(SUMMING)]
            with m.Else():
                m.d.sync += [s_active.eq(1), s_ptr.eq(s_ptr_now + 1),
                             s_at_end.eq(Mux(s_active, s_ptr + 1 == s_final, d_double[sbank]))]
        s_ctl = data.StructLayout({"valid": 1, "first": 1, "last": 1, "bank": bank_bits,
                                   "max": signed(INPUT_BITS), "dmax": bits_for(DMAX_MAX)})
        s1 = Signal(s_ctl)
        m.d.sync += [s1.valid.eq(s_issue), s1.first.eq(s_ptr_now == 0), s1.last.eq(s_last), s1.bank.eq(sbank),
                     s1.max.eq(s_max_now), s1.dmax.eq(s_dmax_now)]
        # The block RAM's output goes straight into a register (its clock-to-out leaves no room for logic).
        s_read = Signal(data.StructLayout({"ctl": s_ctl, "word": word}))
        m.d.sync += [s_read.ctl.eq(s1), s_read.word.eq(rd_sum.data)]
        # Register the capped distances before the adder tree: one subtract-and-cap per stage.
        s_dist = Signal(data.StructLayout({"valid": 1, "first": 1, "last": 1, "bank": bank_bits, "mask": L,
                                           "d": data.ArrayLayout(bits_for(DMAX_MAX), L)}))
        m.d.sync += [s_dist.valid.eq(s_read.ctl.valid), s_dist.first.eq(s_read.ctl.first),
                     s_dist.last.eq(s_read.ctl.last), s_dist.bank.eq(s_read.ctl.bank), s_dist.mask.eq(s_read.word.mask)]
        m.d.sync += [s_dist.d[j].eq(d) for j, d in
                     enumerate(_capped_distances(s_read.ctl.max, s_read.ctl.dmax, s_read.word))]
        # The adder tree over the lanes, SUM_TREE_LEVELS levels per register stage.
        ctl = [s_dist.valid, s_dist.first, s_dist.last, s_dist.bank]
        d_terms = [s_dist.d[j] for j in range(L)]
        c_terms = [s_dist.mask[j] for j in range(L)]
        tree_stages = sum_tree_stages(cfg)
        per_stage = -(-ceil_log2(L) // tree_stages)
        for t in range(tree_stages - 1):
            d_terms = [reg(m, v, f"s_tree{t}_d{k}") for k, v in enumerate(reduce_levels(d_terms, operator.add,
                                                                                          per_stage))]
            c_terms = [reg(m, v, f"s_tree{t}_c{k}") for k, v in enumerate(reduce_levels(c_terms, operator.add,
                                                                                          per_stage))]
            ctl = [reg(m, c, f"s_tree{t}_{field}", reset_less=field != "valid")
                   for c, field in zip(ctl, ("valid", "first", "last", "bank"))]
        s2 = Signal(data.StructLayout({"valid": 1, "first": 1, "last": 1, "bank": bank_bits,
                                       "dsum": bits_for(L * DMAX_MAX), "count": bits_for(L)}))
        m.d.sync += [s2.valid.eq(ctl[0]), s2.first.eq(ctl[1]), s2.last.eq(ctl[2]), s2.bank.eq(ctl[3]),
                     s2.dsum.eq(reduce_tree(d_terms, operator.add)),
                     s2.count.eq(reduce_tree(c_terms, operator.add))]
        acc_dsum = Signal(bits_for(cfg.n_max * DMAX_MAX))
        acc_count = Signal(bits_for(cfg.n_max))
        next_dsum = Mux(s2.first, 0, acc_dsum) + s2.dsum
        next_count = Mux(s2.first, 0, acc_count) + s2.count
        # Row total = count*B - S*sum(d): the two products in one stage, their difference in the next.
        s3 = Signal(data.StructLayout({"valid": 1, "bank": bank_bits, "dsum": len(acc_dsum),
                                       "count": len(acc_count), "B": params_layout["B"].shape,
                                       "S": params_layout["S"].shape}))
        s4 = Signal(data.StructLayout({"valid": 1, "bank": bank_bits, "countB": total_bits + 1,
                                       "Sdsum": total_bits + 1}))
        m.d.sync += [s3.valid.eq(s2.valid & s2.last), s3.bank.eq(s2.bank)]
        with m.If(s2.valid):
            m.d.sync += [acc_dsum.eq(next_dsum), acc_count.eq(next_count), s3.dsum.eq(next_dsum),
                         s3.count.eq(next_count), s3.B.eq(d_params[s2.bank].B), s3.S.eq(d_params[s2.bank].S)]
        m.d.sync += [s4.valid.eq(s3.valid), s4.bank.eq(s3.bank), s4.countB.eq(s3.count * s3.B),
                     s4.Sdsum.eq(s3.S * s3.dsum)]
        d_total = per_bank(total_bits, "total")
        with m.If(s4.valid):
            m.d.sync += [d_total[s4.bank].eq((s4.countB - s4.Sdsum)[:total_bits]), state[s4.bank].eq(SUMMED)]

        # Reciprocal: a restoring divider (div_bits quotient bits per cycle) or a leading-one shift (clb).
        rbank = Signal(bank_bits)
        r_active = Signal()
        r_iter = Signal(range(max(NUMERATOR_BITS.values()) // cfg.div_bits + 2))
        # r_iter == 0 in a register of its own (set as r_iter steps from 1; every start loads r_iter >= 1), so
        # that the comparison is not in front of the banks' state registers.
        r_zero = Signal()
        divisor = Signal(total_bits)
        divisor_zero = Signal()
        remainder = Signal(total_bits + 1)
        quotient = Signal(bits_for(UINT8_NUMERATOR))
        steps = math.ceil(NUMERATOR_BITS[OUT_UINT8] / cfg.div_bits)
        numerator_reg = Signal(steps * cfg.div_bits)
        r_params = d_params[rbank]
        r_start = ~r_active & (state[rbank] == SUMMED)
        # The row's mode and output type, latched at the start: decoded from the bank's parameters through
        # rbank every cycle they were in front of every divider register.
        r_clb, r_out16 = Signal(), Signal()
        # The divider's registers load from bank rbank in every idle cycle (they are read only while
        # r_active): their enable is the ~r_active flip-flop, not the bank state comparison through rbank.
        with m.If(~r_active):
            numerators = {OUT_UINT8: UINT8_NUMERATOR, OUT_INT16: INT16_NUMERATOR}
            iters = {o: math.ceil(NUMERATOR_BITS[o] / cfg.div_bits) for o in numerators}
            # Left-align each numerator in the shift register so its first quotient step reads its top bits.
            aligned = {o: numerators[o] << (len(numerator_reg) - iters[o] * cfg.div_bits) for o in numerators}
            m.d.sync += [r_active.eq(r_start), divisor.eq(d_total[rbank]), divisor_zero.eq(d_total[rbank] == 0),
                         r_clb.eq(r_params.mode == MODE_CLB), r_out16.eq(r_params.out == OUT_INT16),
                         remainder.eq(0), quotient.eq(0),
                         numerator_reg.eq(Mux(r_params.out == OUT_INT16, aligned[OUT_INT16], aligned[OUT_UINT8])),
                         r_zero.eq(0),
                         r_iter.eq(Mux(r_params.mode == MODE_CLB, 1,
                                       Mux(r_params.out == OUT_INT16, iters[OUT_INT16], iters[OUT_UINT8])))]
        r_done = Signal()
        r_inv = Signal.like(d_inv[0])
        with m.If(r_active):
            with m.If(r_clb):
                # numerator >> (position of the leading one): select the shifted numerator by a one-hot of the
                # leading one (log-depth OR trees rather than a priority chain). Two cycles: the one-hot into a
                # register, then the selection.
                clb_num = Mux(r_out16, INT16_NUMERATOR, UINT8_NUMERATOR)
                onehot = Signal(total_bits)
                with m.If(~r_zero):
                    m.d.sync += [onehot.eq(Cat(divisor[bit] & ~divisor[bit + 1:].any() if bit + 1 < total_bits
                                               else divisor[bit] for bit in range(total_bits))),
                                 r_iter.eq(r_iter - 1), r_zero.eq(r_iter == 1)]
                shifted = [Mux(onehot[bit], clb_num >> bit, 0) for bit in range(total_bits)]
                m.d.comb += [r_done.eq(r_zero), r_inv.eq(reduce_tree(shifted, operator.or_))]
            with m.Else():
                rem, quo, num = remainder, quotient, numerator_reg
                for _ in range(cfg.div_bits):
                    shifted = Cat(num[-1], rem)[:total_bits + 1]
                    # One subtractor per quotient bit: its borrow is the comparison.
                    diff = (shifted - divisor)[:total_bits + 2]
                    fits = ~diff[-1]
                    rem = Mux(fits, diff[:total_bits + 1], shifted)
                    quo = Cat(fits, quo)[:len(quotient)]
                    num = Cat(Const(0, 1), num)[:len(numerator_reg)]
                # The quotient is taken from its register one cycle after the last step, so the divider's
                # chain of div_bits subtractors ends at a register rather than at the banks' inv registers.
                with m.If(~r_zero):
                    m.d.sync += [remainder.eq(rem), quotient.eq(quo), numerator_reg.eq(num), r_iter.eq(r_iter - 1),
                                 r_zero.eq(r_iter == 1)]
                m.d.comb += [r_done.eq(r_zero), r_inv.eq(quotient)]
            with m.If(r_done):
                m.d.sync += [d_inv[rbank].eq(Mux(divisor_zero, 0, r_inv)), state[rbank].eq(READY),
                             rbank.eq(rbank + 1), r_active.eq(0)]

        # Normalise: read the row a last time; one output beat per cycle while o is taken.
        nbank = Signal(bank_bits)
        n_active = Signal()
        n_ptr = Signal(count_bits)
        row = data.StructLayout({"final": count_bits, "max": signed(INPUT_BITS), "head": cfg.head_bits,
                                 "params": params_layout, "inv": d_inv[0].shape()})
        advance = ~self.o.valid | self.o.ready
        # The row's fields load into n_row in every cycle the normaliser is idle and the output moves: in the
        # cycle a row starts (which needs both) they are the starting bank's, and n_row holds them while the
        # row is issued and until its last beat has left n1 (n_read takes them from n_row; a copy travelling
        # through n1 would put the four-bank multiplexer behind nbank in front of ~70 enabled registers). The
        # enable is then ~n_active and advance; only the start, the last-beat flag (a per-bank one-beat flag)
        # and the bank's release still go through nbank.
        n_row = Signal(row)
        with m.If(~n_active & advance):
            m.d.sync += [n_row.final.eq(d_final[nbank]), n_row.max.eq(d_max[nbank]), n_row.head.eq(d_head[nbank]),
                         n_row.params.eq(d_params[nbank]), n_row.inv.eq(d_inv[nbank])]
        n_start = ~n_active & (state[nbank] == READY)
        n_ptr_now = Mux(n_active, n_ptr, 0)
        n_issue = advance & (n_active | n_start)
        # n_ptr == n_row.final while active, in a register set as n_ptr steps (so that the comparison is not in
        # front of the banks' state registers).
        n_at_end = Signal()
        n_last = Mux(n_active, n_at_end, d_single[nbank])
        m.d.comb += [rd_norm.addr.eq(Cat(n_ptr_now[:ptr_bits], nbank)), rd_norm.en.eq(advance)]
        with m.If(n_issue):
            with m.If(n_last):
                m.d.sync += [n_active.eq(0), nbank.eq(nbank + 1), state[nbank].eq(FREE)]
            with m.Else():
                m.d.sync += [n_active.eq(1), n_ptr.eq(n_ptr_now + 1),
                             n_at_end.eq(Mux(n_active, n_ptr + 1 == n_row.final, d_double[nbank]))]
        # After the memory: read register, distance, S*d, score, two partial products, their sum, saturate; every
        # stage moves only when the output moves (advance), so a stalled o holds the whole pipeline.
        n1 = Signal(data.StructLayout({"valid": 1, "first": 1, "last": 1}))
        n_read = Signal(data.StructLayout({"valid": 1, "first": 1, "last": 1, "row": row, "word": word}))
        framing = {"valid": 1, "first": 1, "last": 1, "head": cfg.head_bits, "mask": L, "out": 1}
        dist_layout = data.StructLayout({**framing, "B": params_layout["B"].shape, "S": params_layout["S"].shape,
                                         "inv": d_inv[0].shape(), "d": data.ArrayLayout(bits_for(DMAX_MAX), L)})
        n_dist = Signal(dist_layout)
        # Each product gets operand registers of its own in the stage before it (n_ops, n2r) and a register
        # stage after it (n_sdr, n3r). The operands shared by the lanes (S, inv) are kept once per lane
        # (Replicated): one register beside each multiplier instead of one reaching a row of them.
        n_ops = Signal(dist_layout)
        n_ops_S = Replicated(params_layout["S"].shape, L, "n_ops_S")
        # S * d in the fabric, in two registered steps (n_sd: the partial products summed in pairs; n_sdr: the
        # sum): two 7-bit operands, for which a DSP block costs more in routing to and from the block's row
        # than the product itself.
        sd_bits = bits_for(S_MAX * DMAX_MAX)
        sd_pairs = [lut_mul_pairs(n_ops_S.copy(j), n_ops.d[j]) for j in range(L)]
        carried = {**framing, "B": params_layout["B"].shape, "inv": d_inv[0].shape()}
        n_sd = Signal(data.StructLayout({**carried, "pairs": data.ArrayLayout(
            data.ArrayLayout(sd_bits, len(sd_pairs[0])), L)}))
        n_sdr = Signal(data.StructLayout({**carried, "sd": data.ArrayLayout(sd_bits, L)}))
        score_layout = data.StructLayout({**framing, "inv": d_inv[0].shape(),
                                          "score": data.ArrayLayout(bits_for(B_MAX), L)})
        n2, n2r = Signal(score_layout), Signal(score_layout)
        n2r_inv = Replicated(d_inv[0].shape(), L, "n2r_inv")
        # score * inv as two products on the low and high INV_SPLIT bits of inv: each fits one 18x18 multiplier.
        inv_bits = len(d_inv[0])
        parts_layout = data.StructLayout({**framing, "lo": data.ArrayLayout(bits_for(B_MAX) + INV_SPLIT, L),
                                          "hi": data.ArrayLayout(bits_for(B_MAX) + inv_bits - INV_SPLIT, L)})
        n3, n3r = Signal(parts_layout), Signal(parts_layout)
        n4 = Signal(data.StructLayout({**framing, "product": data.ArrayLayout(PRODUCT_BITS, L)}))
        n4_out16 = Replicated(1, L, "n4_out16")
        with m.If(advance):
            m.d.sync += [n1.valid.eq(n_issue), n1.first.eq(n_ptr_now == 0), n1.last.eq(n_last)]
            m.d.sync += [n_read.valid.eq(n1.valid), n_read.first.eq(n1.first), n_read.last.eq(n1.last),
                         n_read.row.eq(n_row), n_read.word.eq(rd_norm.data)]
            p = n_read.row.params
            m.d.sync += [n_dist.valid.eq(n_read.valid), n_dist.first.eq(n_read.first), n_dist.last.eq(n_read.last),
                         n_dist.head.eq(n_read.row.head), n_dist.mask.eq(n_read.word.mask), n_dist.out.eq(p.out),
                         n_dist.B.eq(p.B), n_dist.S.eq(p.S), n_dist.inv.eq(n_read.row.inv)]
            m.d.sync += [n_dist.d[j].eq(d)
                         for j, d in enumerate(_capped_distances(n_read.row.max, p.dmax, n_read.word))]
            m.d.sync += [n_ops.eq(n_dist), n_ops_S.eq(n_dist.S)]
            m.d.sync += [n_sd[name].eq(n_ops[name]) for name in carried]
            m.d.sync += [n_sd.pairs[j][i].eq(pair) for j in range(L) for i, pair in enumerate(sd_pairs[j])]
            m.d.sync += [n_sdr[name].eq(n_sd[name]) for name in carried]
            m.d.sync += [n_sdr.sd[j].eq(reduce_tree([n_sd.pairs[j][i] for i in range(len(sd_pairs[j]))],
                                                    operator.add)) for j in range(L)]
            m.d.sync += [n2[name].eq(n_sdr[name]) for name in framing] + [n2.inv.eq(n_sdr.inv)]
            m.d.sync += [n2.score[j].eq(Mux(n_sdr.mask[j], n_sdr.B - n_sdr.sd[j], 0)) for j in range(L)]
            m.d.sync += [n2r.eq(n2), n2r_inv.eq(n2.inv)]
            m.d.sync += [n3[name].eq(n2r[name]) for name in framing]
            m.d.sync += [n3.lo[j].eq(n2r.score[j] * n2r_inv.copy(j)[:INV_SPLIT]) for j in range(L)]
            m.d.sync += [n3.hi[j].eq(n2r.score[j] * n2r_inv.copy(j)[INV_SPLIT:]) for j in range(L)]
            m.d.sync += n3r.eq(n3)
            # score * inv <= numerator (div) or < 255 << 16 (clb): PRODUCT_BITS hold it exactly.
            m.d.sync += [n4[name].eq(n3r[name]) for name in framing]
            m.d.sync += [n4.product[j].eq(n3r.lo[j] + (n3r.hi[j] << INV_SPLIT)) for j in range(L)]
            # The row's output type as a flag per lane (it selects 16 bits of every lane's result).
            m.d.sync += n4_out16.eq(n3r.out == OUT_INT16)
            for j in range(L):
                out_max = Mux(n4_out16.copy(j), INT16_MAX, UINT8_MAX)
                scaled = Mux(n4_out16.copy(j), n4.product[j], n4.product[j] >> INV_SHIFT)
                m.d.sync += self.o.payload.data[j].eq(Mux(scaled > out_max, out_max, scaled))
            m.d.sync += [self.o.valid.eq(n4.valid), self.o.payload.mask.eq(n4.mask),
                         self.o.payload.first.eq(n4.first), self.o.payload.last.eq(n4.last),
                         self.o.payload.head.eq(n4.head)]

        with m.If(self.clear_status):
            m.d.sync += [self.status.overflow.eq(0), self.status.framing.eq(0), self.status.bad_head.eq(0)]
        pipeline_valid = [stage.valid for stage in max_pipe + [n1, n_read, n_dist, n_ops, n_sd, n_sdr, n2, n2r, n3,
                                                                n3r, n4, self.o]]
        m.d.comb += self.status.busy.eq(in_row | Cat(state[b] != FREE for b in range(BANKS)).any()
                                        | Cat(pipeline_valid).any())
        return m
