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

Components (each states its own latency; :class:`HCCS` joins them with ``wiring.connect``):
:class:`HeadTable` (the heads' parameters), :class:`BankRing` (the banks' states and per-row registers, written
through one event stream per stage), :class:`Ingest` and :class:`RowMax` (pass 1), :class:`SumReader`,
:class:`CappedDistances`, :class:`SumTree` and :class:`RowTotal` (pass 2), :class:`Reciprocal` (3),
:class:`NormaliseReader`, :class:`CappedDistances` and :class:`Scale` (4). :func:`ingest_pipeline`,
:func:`sum_pipeline`, :func:`reciprocal_cycles` and :data:`NORMALISE_PIPELINE` are sums of their latencies.

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
import enum
import math
import operator
from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from somatile.hw.pipe import Replicated, lut_mul_pairs, reduce_levels, reduce_tree, reg
from somatile.hw.row_unit import RowUnit, RowUnitConfig
# The unit accepts the lane counts and output types a board may give the tile: one value set for both.
from somatile.hw.tile_params import HCCS_LANES, HCCS_OUT_TYPES
from somatile.model.hccs import (B_MAX, DMAX_MAX, INPUT_BITS, INT16_MAX, INT16_NUMERATOR, INV_SHIFT, MODE_CLB,
                                 MODE_CODES, OUT_CODES, OUT_INT16, OUT_UINT8, PRODUCT_BITS, S_MAX, UINT8_MAX,
                                 UINT8_NUMERATOR)

BANKS = 4
BANK_BITS = ceil_log2(BANKS)


class BankState(enum.IntEnum):
    """Where a bank's row is in the ring. FILLING: the row's last beat is in, its maximum still in the row-max
    pipeline. SUMMING: the sum stage has read the whole row and its total is still in the sum pipeline. Both
    pipelines are longer than a lap of the four banks when rows are one beat long, so these states keep the
    next stage off the bank."""
    FREE = 0
    FILLING = 1
    FULL = 2
    SUMMING = 3
    SUMMED = 4
    READY = 5


BANK_STATE_BITS = 3
BANK_LATENCY = 1
"""Cycles from a stage's event (:class:`BankRing` input) to the bank's new state and fields being visible."""
MEMORY_READ_LATENCY = 1
"""Cycles from a row-memory address to its word (the synchronous read port); a reader's output register
(:class:`SumReader`, :class:`NormaliseReader`) holds the beat's tags for that cycle."""
DISTANCE_LATENCY = 2
"""Registers of :class:`CappedDistances`: the read word, then the capped distances."""
ROW_TOTAL_LATENCY = 2
"""Registers of :class:`RowTotal` from the tree's sum to the total: accumulate with the two products'
operands, then the products; the difference is written into the bank (:data:`BANK_LATENCY`)."""
RECIPROCAL_LOAD = 1
"""The reciprocal's idle cycle in which it loads the bank's total (its registers' enable is ~active)."""
SCALE_LATENCY = 9
"""Registers of :class:`Scale`: operand copies, ``S*d`` in pairs, their sum, score, operand copies, two partial
products, product copies, their sum, saturate into the output register."""
NORMALISE_PIPELINE = MEMORY_READ_LATENCY + DISTANCE_LATENCY + SCALE_LATENCY
"""Cycles from a normalise-stage memory read to its beat being taken from ``o`` (read, read register,
distance, operand copies, ``S*d``, product copy, score, operand copies, two partial products, product copies,
their sum, saturate into the output register): 12. The copies on each side of a multiplier are registers
that only it uses, which the placer puts beside the DSP block; the long routes are then register to
register."""
SUM_TREE_LEVELS = 3
"""Adder levels per register stage of the sum stage's tree: three levels of the short distance adders fit a
cycle on the ECP5 85F at 8 lanes; the four of 16 lanes in one stage did not (most of the path routing across
the wider tree), so wider units take another stage (:func:`sum_tree_stages`)."""
OUT_BITS = {"uint8": 8, "int16": 16}
INV_SPLIT = 12
"""The normaliser multiplies ``score * inv`` as ``score * inv[:12] + (score * inv[12:] << 12)``."""
NUMERATOR_BITS = {OUT_UINT8: UINT8_NUMERATOR.bit_length(), OUT_INT16: INT16_NUMERATOR.bit_length()}
RECIPROCAL_BITS = bits_for(UINT8_NUMERATOR)
"""Width of a row's reciprocal ``inv`` (the largest, ``UINT8_NUMERATOR``, for a total of 1)."""

@dataclasses.dataclass(frozen=True)
class HCCSConfig(RowUnitConfig):
    """Elaboration parameters of the unit (validated; a bad value names itself and what was expected)."""
    lanes: int = 8
    heads: int = 2
    n_max: int = 256
    out_type: str = "uint8"
    div_bits: int = 2

    def __post_init__(self):
        self.check_fields(HCCS_LANES, None, (1, 2, 3, 4, 6, 8))
        if self.out_type not in HCCS_OUT_TYPES:
            raise ValueError(f"out_type: expected one of {HCCS_OUT_TYPES}, got {self.out_type!r}")

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



def row_max_latency(cfg: HCCSConfig) -> int:
    """Registers of :class:`RowMax`, from a beat at its input to the row's ``full`` event: the masked lanes,
    then one per level of the beat-maximum tree, ``1 + log2(lanes)`` (one compare level per stage: two chained
    8-bit compare-and-select levels do not fit a cycle on the ECP5 85F)."""
    return 1 + ceil_log2(cfg.lanes)


def ingest_pipeline(cfg: HCCSConfig) -> int:
    """Extra cycles from a row's last input beat to its bank being ready for the sum stage: the row-max
    pipeline and the bank's write, less the last beat's own cycle (counted in the row's ``nb`` beats)."""
    return row_max_latency(cfg) + BANK_LATENCY - 1


def sum_tree_stages(cfg: HCCSConfig) -> int:
    """Register stages of the sum stage's adder tree over the lanes (:data:`SUM_TREE_LEVELS` levels each)."""
    return max(1, -(-ceil_log2(cfg.lanes) // SUM_TREE_LEVELS))


def sum_pipeline(cfg: HCCSConfig) -> int:
    """Cycles from the sum stage's read of a row's last beat to the row total being visible: read, read
    register, distance, the adder tree (:func:`sum_tree_stages`), accumulate, the two products ``count*B``
    and ``S*sum d``, their difference. 6 up to 8 lanes, 7 at 16 and 32."""
    return (MEMORY_READ_LATENCY + DISTANCE_LATENCY + sum_tree_stages(cfg) + ROW_TOTAL_LATENCY + BANK_LATENCY
            - 1)


def reciprocal_steps(cfg: HCCSConfig, mode: str = "div", out: str = "uint8") -> int:
    """Active cycles of :class:`Reciprocal` before its result: ``div_bits`` quotient bits per cycle (div), or
    the leading-one one-hot into its register (clb)."""
    if MODE_CODES[mode] == MODE_CLB:
        return 1
    return math.ceil(NUMERATOR_BITS[OUT_CODES[out]] / cfg.div_bits)


def reciprocal_latency(cfg: HCCSConfig, mode: str = "div", out: str = "uint8") -> int:
    """Cycles of :class:`Reciprocal` from a bank turning SUMMED to its ``inverted`` event."""
    return RECIPROCAL_LOAD + reciprocal_steps(cfg, mode, out)


def reciprocal_cycles(cfg: HCCSConfig, mode: str = "div", out: str = "uint8") -> int:
    """Cycles the reciprocal stage holds one row (its occupancy ``D``)."""
    return reciprocal_latency(cfg, mode, out) + BANK_LATENCY


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




def _ptr_bits(cfg: HCCSConfig) -> int:
    return max(1, ceil_log2(cfg.beats_max))


def _count_bits(cfg: HCCSConfig) -> int:
    return bits_for(cfg.beats_max)


def word_layout(cfg: HCCSConfig) -> data.StructLayout:
    """One row-memory word: a beat's lanes and mask."""
    return data.StructLayout({"data": data.ArrayLayout(signed(INPUT_BITS), cfg.lanes), "mask": cfg.lanes})


def read_port_signature(cfg: HCCSConfig) -> wiring.Signature:
    return ReadPort.Signature(addr_width=BANK_BITS + _ptr_bits(cfg), shape=word_layout(cfg))


def bank_row_layout(cfg: HCCSConfig) -> data.StructLayout:
    """What the ring keeps per bank: its :class:`BankState`, the row's last beat index (``final``) with the
    flags ``final == 0`` (``single``) and ``final == 1`` (``double``), its maximum, head and the head's
    parameters, its total and its reciprocal."""
    return data.StructLayout({"state": BANK_STATE_BITS, "final": _count_bits(cfg), "single": 1, "double": 1,
                              "max": signed(INPUT_BITS), "head": cfg.head_bits, "params": head_params_layout(),
                              "total": cfg.total_bits, "inv": RECIPROCAL_BITS})


def bank_view_signature(cfg: HCCSConfig) -> wiring.Signature:
    """The ring's registers, every bank's :func:`bank_row_layout`, as the stages read them."""
    return wiring.Signature({"row": Out(data.ArrayLayout(bank_row_layout(cfg), BANKS))})


def head_view_signature(cfg: HCCSConfig) -> wiring.Signature:
    """Every head's parameters as :class:`HeadTable` holds them."""
    return wiring.Signature({"params": Out(data.ArrayLayout(head_params_layout(), 1 << cfg.head_bits))})


def bank_event(**fields) -> stream.Signature:
    """A stage's news about one bank, one record per row (always ready: the ring takes it in the cycle it is
    valid): the bank and the fields the stage computed for its row."""
    return stream.Signature(data.StructLayout({"bank": BANK_BITS, **fields}), always_ready=True)


def closed_event(cfg: HCCSConfig) -> stream.Signature:
    return bank_event(final=_count_bits(cfg), single=1, double=1, head=cfg.head_bits, params=head_params_layout())


def max_beat_layout(cfg: HCCSConfig, lanes: int | None = None) -> data.StructLayout:
    """A beat into (and through) the row-max pipeline: masked lanes hold the lowest int8."""
    return data.StructLayout({"start": 1, "last": 1, "bank": BANK_BITS,
                              "lanes": data.ArrayLayout(signed(INPUT_BITS), cfg.lanes if lanes is None else lanes)})


def sum_tag_layout(cfg: HCCSConfig) -> data.StructLayout:
    """What a sum-stage beat carries beside its lanes."""
    return data.StructLayout({"first": 1, "last": 1, "bank": BANK_BITS})


def normalise_tag_layout(cfg: HCCSConfig) -> data.StructLayout:
    """What a normalise-stage beat carries beside its lanes: its framing and its row's parameters."""
    params = head_params_layout()
    return data.StructLayout({"first": 1, "last": 1, "head": cfg.head_bits, "out": 1, "B": params["B"].shape,
                              "S": params["S"].shape, "inv": RECIPROCAL_BITS})


def read_layout(cfg: HCCSConfig, tag: data.StructLayout) -> data.StructLayout:
    """A beat read back from the row memory with its row's maximum and distance cap."""
    return data.StructLayout({"tag": tag, "max": signed(INPUT_BITS), "dmax": bits_for(DMAX_MAX),
                              "word": word_layout(cfg)})


def distance_layout(cfg: HCCSConfig, tag: data.StructLayout) -> data.StructLayout:
    """A beat's capped distances ``min(max - x, dmax)`` (0 for masked lanes) and its mask."""
    return data.StructLayout({"tag": tag, "mask": cfg.lanes,
                              "d": data.ArrayLayout(bits_for(DMAX_MAX), cfg.lanes)})


def tree_sum_layout(cfg: HCCSConfig) -> data.StructLayout:
    """A beat's ``sum d`` and valid-lane count."""
    return data.StructLayout({"first": 1, "last": 1, "bank": BANK_BITS, "dsum": bits_for(cfg.lanes * DMAX_MAX),
                              "count": bits_for(cfg.lanes)})


def _banks(view):
    """The ring's view as an Array over the banks, for indexing by a bank register."""
    return Array(view.row[b] for b in range(BANKS))


def _capped_distances(row_max, dmax, word):
    """``min(row_max - x, dmax)`` for every lane of a row-memory word; 0 for masked lanes."""
    lanes = []
    for j in range(len(word.mask)):
        dist = (row_max - word.data[j]).as_unsigned()[:INPUT_BITS]
        lanes.append(Mux(word.mask[j], Mux(dist > dmax, dmax, dist), 0))
    return lanes


class HeadTable(wiring.Component):
    """The heads' parameter registers, written through ``cfg`` (always ready; writes to heads >= ``heads``
    are ignored; with ``out_type="uint8"`` every head is OUT_UINT8). Latency 1: a write is in ``view`` the
    next cycle."""

    def __init__(self, config: HCCSConfig):
        self.config = config
        super().__init__({"cfg": In(stream.Signature(cfg_layout(config))), "view": Out(head_view_signature(config))})

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        regfile = Array(Signal(head_params_layout(), name=f"head{h}") for h in range(1 << cfg.head_bits))
        m.d.comb += self.cfg.ready.eq(1)
        with m.If(self.cfg.valid & (self.cfg.payload.head < cfg.heads)):
            m.d.sync += regfile[self.cfg.payload.head].eq(self.cfg.payload.params)
            if cfg.out_type == "uint8":
                m.d.sync += regfile[self.cfg.payload.head].out.eq(OUT_UINT8)
        m.d.comb += [self.view.params[h].eq(regfile[h]) for h in range(len(regfile))]
        return m


class BankRing(wiring.Component):
    """The four banks' states and per-row registers. Each stage reports a row through its event (``closed``
    by ingest: FILLING; ``full`` by the row max: FULL; ``summing`` by the sum reader's last read: SUMMING;
    ``summed`` by the row total: SUMMED; ``inverted`` by the reciprocal: READY; ``freed`` by the normaliser's
    last read: FREE), which is in ``view`` :data:`BANK_LATENCY` cycle later. Events are always taken; the
    stages' own waiting on the states keeps two of them off one bank."""

    def __init__(self, config: HCCSConfig):
        self.config = config
        super().__init__({"closed": In(closed_event(config)), "full": In(bank_event(max=signed(INPUT_BITS))),
                          "summing": In(bank_event()), "summed": In(bank_event(total=config.total_bits)),
                          "inverted": In(bank_event(inv=RECIPROCAL_BITS)), "freed": In(bank_event()),
                          "view": Out(bank_view_signature(config)), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        layout = bank_row_layout(self.config)
        fields = {name: Array(Signal(layout[name].shape, name=f"bank{b}_{name}") for b in range(BANKS))
                  for name in layout.members}
        state = fields["state"]
        with m.If(self.closed.valid):
            event = self.closed.payload
            m.d.sync += [fields[name][event.bank].eq(event[name]) for name in ("final", "single", "double", "head",
                                                                                 "params")]
            m.d.sync += state[event.bank].eq(BankState.FILLING)
        with m.If(self.full.valid):
            m.d.sync += [fields["max"][self.full.payload.bank].eq(self.full.payload.max),
                         state[self.full.payload.bank].eq(BankState.FULL)]
        with m.If(self.summing.valid):
            m.d.sync += state[self.summing.payload.bank].eq(BankState.SUMMING)
        with m.If(self.summed.valid):
            m.d.sync += [fields["total"][self.summed.payload.bank].eq(self.summed.payload.total),
                         state[self.summed.payload.bank].eq(BankState.SUMMED)]
        with m.If(self.inverted.valid):
            m.d.sync += [fields["inv"][self.inverted.payload.bank].eq(self.inverted.payload.inv),
                         state[self.inverted.payload.bank].eq(BankState.READY)]
        with m.If(self.freed.valid):
            m.d.sync += state[self.freed.payload.bank].eq(BankState.FREE)
        m.d.comb += [self.view.row[b][name].eq(fields[name][b]) for b in range(BANKS) for name in fields]
        m.d.comb += self.busy.eq(Cat(state[b] != BankState.FREE for b in range(BANKS)).any())
        return m


class Ingest(wiring.Component):
    """Takes the beats of ``i`` (``in_beat_layout``) into the row memory: row r goes to bank ``r mod 4``
    once the normaliser has released it. Throughput one beat per cycle; ``i.ready`` is a register (see
    below), low while the next row's bank is not FREE. Each accepted beat goes on to ``beat`` (the row-max
    pipeline) in the cycle it is accepted, its masked lanes and beats past the capacity as the lowest int8;
    a row's last beat sends ``closed`` (its bank, last index, head and parameters, latency 0). ``status``
    holds the sticky ``overflow``, ``framing`` and ``bad_head`` flags (see the module docstring), cleared by
    ``clear``; ``in_row``: a row has begun and not ended."""

    def __init__(self, config: HCCSConfig):
        self.config = config
        super().__init__({
            "i": In(stream.Signature(in_beat_layout(config))),
            "heads": In(head_view_signature(config)),
            "banks": In(bank_view_signature(config)),
            "wr": In(WritePort.Signature(addr_width=BANK_BITS + _ptr_bits(config), shape=word_layout(config))),
            "closed": Out(closed_event(config)),
            "beat": Out(stream.Signature(max_beat_layout(config), always_ready=True)),
            "status": Out(data.StructLayout({"overflow": 1, "framing": 1, "bad_head": 1})),
            "clear": In(1),
            "in_row": Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        NB = cfg.beats_max
        params_layout = head_params_layout()
        m = Module()
        heads = Array(self.heads.params[h] for h in range(1 << cfg.head_bits))
        banks = _banks(self.banks)
        wbank = Signal(BANK_BITS)
        iptr = Signal(_count_bits(cfg))
        in_row = self.in_row
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
        m.d.comb += cur_params.eq(Mux(in_row, row_params, heads[beat.head]))
        if cfg.heads < (1 << cfg.head_bits):
            with m.If(~in_row & (beat.head >= cfg.heads)):
                m.d.comb += [cur_params.eq(0), bad_head.eq(1)]
        m.d.comb += [self.wr.addr.eq(Cat(iptr[:_ptr_bits(cfg)], wbank)), self.wr.data.data.eq(beat.data),
                     self.wr.data.mask.eq(beat.mask)]
        accepted = self.i.valid & self.i.ready
        closing = accepted & beat.last
        free = Cat(banks[b].state == BankState.FREE for b in range(BANKS))
        m.d.sync += ready.eq(free.bit_select(Mux(closing, wbank + 1, wbank)[:BANK_BITS], 1))
        with m.If(accepted):
            m.d.comb += self.wr.en.eq(stored)
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
                closed = self.closed.payload
                m.d.comb += [self.closed.valid.eq(1), closed.bank.eq(wbank),
                             closed.final.eq(Mux(stored, iptr, iptr - 1)),
                             closed.single.eq(Mux(stored, iptr == 0, iptr == 1)),
                             closed.double.eq(Mux(stored, iptr == 1, iptr == 2)),
                             closed.head.eq(cur_head), closed.params.eq(cur_params)]
                m.d.sync += [wbank.eq(wbank + 1), iptr.eq(0), in_row.eq(0)]
        with m.If(self.clear):
            m.d.sync += [self.status.overflow.eq(0), self.status.framing.eq(0), self.status.bad_head.eq(0)]
        # A beat past the row's capacity is dropped: it enters the row-max pipeline with every lane masked.
        m.d.comb += [self.beat.valid.eq(accepted), self.beat.payload.start.eq(~in_row),
                     self.beat.payload.last.eq(beat.last), self.beat.payload.bank.eq(wbank)]
        m.d.comb += [self.beat.payload.lanes[j].eq(Mux(beat.mask[j] & stored, beat.data[j], lane_min))
                     for j in range(cfg.lanes)]
        return m


class RowMax(wiring.Component):
    """The running maximum of each row's beats: ``beat`` in (one per cycle, never stalled), the row's
    ``full`` event (its bank and maximum) :func:`row_max_latency` cycles after its last beat. The beat
    goes through a pipeline (lanes registered, then one compare level per stage, the last stage folding in
    the running maximum). ``busy``: a beat is in the pipeline."""

    def __init__(self, config: HCCSConfig):
        self.config = config
        self.latency = row_max_latency(config)
        super().__init__({"beat": In(stream.Signature(max_beat_layout(config), always_ready=True)),
                          "full": Out(bank_event(max=signed(INPUT_BITS))), "busy": Out(1)})

    def elaborate(self, platform):
        cfg = self.config
        m = Module()

        def max_stage(lanes):
            return data.StructLayout({"valid": 1, **max_beat_layout(cfg, lanes).members})

        def signed_max(a, b):
            return Mux(a > b, a, b)

        mx = Signal(max_stage(cfg.lanes), name="max0")
        m.d.sync += [mx.valid.eq(self.beat.valid), mx.start.eq(self.beat.payload.start),
                     mx.last.eq(self.beat.payload.last), mx.bank.eq(self.beat.payload.bank),
                     mx.lanes.eq(self.beat.payload.lanes)]
        max_pipe = [mx]
        for k in range(ceil_log2(cfg.lanes)):
            values = reduce_levels([mx.lanes[j] for j in range(len(mx.lanes))], signed_max, 1)
            nxt = Signal(max_stage(len(values)), name=f"max{k + 1}")
            m.d.sync += [nxt.valid.eq(mx.valid), nxt.start.eq(mx.start), nxt.last.eq(mx.last),
                         nxt.bank.eq(mx.bank)] + [nxt.lanes[j].eq(v) for j, v in enumerate(values)]
            max_pipe.append(nxt)
            mx = nxt
        assert len(max_pipe) == self.latency
        # The running maximum the last stage folds in, already chosen (lane_min for a row's first beat): it is
        # computed a cycle early from the stage before's start flag, so the bank's maximum is one compare and
        # select away from registers (a select on start in front of it would not fit the cycle).
        lane_min = Const(-(1 << (INPUT_BITS - 1)), signed(INPUT_BITS))
        run_max = Signal(signed(INPUT_BITS))
        beat_max = reduce_tree([mx.lanes[j] for j in range(len(mx.lanes))], signed_max)
        new_max = signed_max(beat_max, run_max)
        next_start = max_pipe[-2].start if len(max_pipe) > 1 else self.beat.payload.start
        m.d.sync += run_max.eq(Mux(next_start, lane_min, Mux(mx.valid, new_max, run_max)))
        m.d.comb += [self.full.valid.eq(mx.valid & mx.last), self.full.payload.bank.eq(mx.bank),
                     self.full.payload.max.eq(new_max)]
        m.d.comb += self.busy.eq(Cat(stage.valid for stage in max_pipe).any())
        return m


class _BankReader(wiring.Component):
    """Reads the banks in ring order, each once it reaches ``self.waits_for``, one beat per cycle while
    ``o.ready``: the memory address in the cycle of issue, the beat on ``o`` :data:`MEMORY_READ_LATENCY`
    cycle later beside its word; the cycle of a row's last read sends ``release`` (latency 0)."""

    waits_for: BankState

    def __init__(self, config: HCCSConfig, tag: data.StructLayout, *, always_ready: bool):
        self.config = config
        self.latency = MEMORY_READ_LATENCY
        super().__init__({"banks": In(bank_view_signature(config)), "rd": In(read_port_signature(config)),
                          "release": Out(bank_event()),
                          "o": Out(stream.Signature(read_layout(config, tag), always_ready=always_ready))})

    def _issue(self, m, final):
        """The pointer logic shared by the readers; ``final``: the row's last beat index while active."""
        banks = _banks(self.banks)
        bank = Signal(BANK_BITS, name="bank")
        active = Signal(name="active")
        ptr = Signal(_count_bits(self.config), name="ptr")
        start = ~active & (banks[bank].state == self.waits_for)
        ptr_now = Mux(active, ptr, 0)
        issue = self.o.ready & (active | start)
        # ptr == final while active, in a register set as ptr steps; a row's first beat is its last when the
        # bank's one-beat flag says so (a comparison through bank would sit in front of the banks' state
        # registers).
        at_end = Signal(name="at_end")
        last = Mux(active, at_end, banks[bank].single)
        m.d.comb += [self.rd.addr.eq(Cat(ptr_now[:_ptr_bits(self.config)], bank)), self.rd.en.eq(self.o.ready)]
        with m.If(issue):
            with m.If(last):
                m.d.sync += [active.eq(0), bank.eq(bank + 1)]
                m.d.comb += [self.release.valid.eq(1), self.release.payload.bank.eq(bank)]
            with m.Else():
                m.d.sync += [active.eq(1), ptr.eq(ptr_now + 1),
                             at_end.eq(Mux(active, ptr + 1 == final, banks[bank].double))]
        return SimpleNamespace(row=banks[bank], bank=bank, active=active, start=start, issue=issue,
                               first=ptr_now == 0, last=last)


class SumReader(_BankReader):
    """The sum stage's reader: a FULL bank's row, never stalled (``o`` always ready), with the row's maximum
    and distance cap; ``release`` turns the bank SUMMING."""

    waits_for = BankState.FULL

    def __init__(self, config: HCCSConfig):
        super().__init__(config, sum_tag_layout(config), always_ready=True)

    def elaborate(self, platform):
        m = Module()
        held = Signal(data.StructLayout({"final": _count_bits(self.config), "max": signed(INPUT_BITS),
                                         "dmax": bits_for(DMAX_MAX)}))
        r = self._issue(m, held.final)
        # held loads in every idle cycle, so the last load is the start cycle's (start implies idle, and held
        # is read only while active): its enable is ~active, not start, whose comparison of the bank's state
        # through the four-bank multiplexer began the ULX3S tile's longest paths with the heap placer.
        with m.If(~r.active):
            m.d.sync += [held.final.eq(r.row.final), held.max.eq(r.row.max), held.dmax.eq(r.row.params.dmax)]
        issued = Signal(data.StructLayout({"valid": 1, "tag": sum_tag_layout(self.config), "max": signed(INPUT_BITS),
                                           "dmax": bits_for(DMAX_MAX)}), name="issued")
        m.d.sync += [issued.valid.eq(r.issue), issued.tag.first.eq(r.first), issued.tag.last.eq(r.last),
                     issued.tag.bank.eq(r.bank), issued.max.eq(Mux(r.active, held.max, r.row.max)),
                     issued.dmax.eq(Mux(r.active, held.dmax, r.row.params.dmax))]
        m.d.comb += [self.o.valid.eq(issued.valid), self.o.payload.tag.eq(issued.tag),
                     self.o.payload.max.eq(issued.max), self.o.payload.dmax.eq(issued.dmax),
                     self.o.payload.word.eq(self.rd.data)]
        return m


class NormaliseReader(_BankReader):
    """The normaliser's reader: a READY bank's row, one beat per cycle while ``o.ready``, with its row's
    framing and parameters; ``release`` frees the bank."""

    waits_for = BankState.READY

    def __init__(self, config: HCCSConfig):
        super().__init__(config, normalise_tag_layout(config), always_ready=False)

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        advance = self.o.ready
        # The row's fields load into row in every cycle the reader is idle and the output moves: in the cycle a
        # row starts (which needs both) they are the starting bank's, and row holds them while the row is issued
        # and until its last beat has left the output register (a copy travelling with the beats would put the
        # four-bank multiplexer behind bank in front of ~70 enabled registers). The enable is then ~active and
        # advance; only the start, the last-beat flag (a per-bank one-beat flag) and the bank's release still go
        # through bank.
        row = Signal(data.StructLayout({"final": _count_bits(cfg), "max": signed(INPUT_BITS),
                                        "head": cfg.head_bits, "params": head_params_layout(),
                                        "inv": RECIPROCAL_BITS}), name="row")
        r = self._issue(m, row.final)
        with m.If(~r.active & advance):
            m.d.sync += [row.final.eq(r.row.final), row.max.eq(r.row.max), row.head.eq(r.row.head),
                         row.params.eq(r.row.params), row.inv.eq(r.row.inv)]
        issued = Signal(data.StructLayout({"valid": 1, "first": 1, "last": 1}), name="issued")
        with m.If(advance):
            m.d.sync += [issued.valid.eq(r.issue), issued.first.eq(r.first), issued.last.eq(r.last)]
        tag = self.o.payload.tag
        m.d.comb += [self.o.valid.eq(issued.valid), tag.first.eq(issued.first), tag.last.eq(issued.last),
                     tag.head.eq(row.head), tag.out.eq(row.params.out), tag.B.eq(row.params.B),
                     tag.S.eq(row.params.S), tag.inv.eq(row.inv), self.o.payload.max.eq(row.max),
                     self.o.payload.dmax.eq(row.params.dmax), self.o.payload.word.eq(self.rd.data)]
        return m


class CappedDistances(wiring.Component):
    """A read beat's word into a register, then its capped distances ``min(max - x, dmax)`` (0 for masked
    lanes) into the next, one subtract-and-cap per stage. Latency :data:`DISTANCE_LATENCY`; one beat per
    cycle; both registers move only while ``o.ready`` (``i.ready`` is ``o.ready``)."""

    def __init__(self, config: HCCSConfig, tag: data.StructLayout, *, always_ready: bool):
        self.config = config
        self.latency = DISTANCE_LATENCY
        super().__init__({"i": In(stream.Signature(read_layout(config, tag), always_ready=always_ready)),
                          "o": Out(stream.Signature(distance_layout(config, tag), always_ready=always_ready)),
                          "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        # The block RAM's output goes straight into a register (its clock-to-out leaves no room for logic).
        read = Signal(data.StructLayout({"valid": 1, "beat": self.i.payload.shape()}), name="read")
        if not self.i.signature.always_ready:
            m.d.comb += self.i.ready.eq(self.o.ready)
        with m.If(self.o.ready):
            m.d.sync += [read.valid.eq(self.i.valid), read.beat.eq(self.i.payload)]
            m.d.sync += [self.o.valid.eq(read.valid), self.o.payload.tag.eq(read.beat.tag),
                         self.o.payload.mask.eq(read.beat.word.mask)]
            m.d.sync += [self.o.payload.d[j].eq(d) for j, d in
                         enumerate(_capped_distances(read.beat.max, read.beat.dmax, read.beat.word))]
        m.d.comb += self.busy.eq(read.valid | self.o.valid)
        return m


class SumTree(wiring.Component):
    """``sum d`` and the valid-lane count of each beat: an adder tree over the lanes, :data:`SUM_TREE_LEVELS`
    levels per register stage. Latency :func:`sum_tree_stages`; one beat per cycle, never stalled."""

    def __init__(self, config: HCCSConfig):
        self.config = config
        self.latency = sum_tree_stages(config)
        super().__init__({"i": In(stream.Signature(distance_layout(config, sum_tag_layout(config)),
                                                   always_ready=True)),
                          "o": Out(stream.Signature(tree_sum_layout(config), always_ready=True))})

    def elaborate(self, platform):
        L = self.config.lanes
        m = Module()
        beat = self.i.payload
        ctl = [self.i.valid, beat.tag.first, beat.tag.last, beat.tag.bank]
        d_terms = [beat.d[j] for j in range(L)]
        c_terms = [beat.mask[j] for j in range(L)]
        per_stage = -(-ceil_log2(L) // self.latency)
        for t in range(self.latency - 1):
            d_terms = [reg(m, v, f"tree{t}_d{k}") for k, v in enumerate(reduce_levels(d_terms, operator.add,
                                                                                        per_stage))]
            c_terms = [reg(m, v, f"tree{t}_c{k}") for k, v in enumerate(reduce_levels(c_terms, operator.add,
                                                                                        per_stage))]
            ctl = [reg(m, c, f"tree{t}_{field}", reset_less=field != "valid")
                   for c, field in zip(ctl, ("valid", "first", "last", "bank"))]
        out = self.o.payload
        m.d.sync += [self.o.valid.eq(ctl[0]), out.first.eq(ctl[1]), out.last.eq(ctl[2]), out.bank.eq(ctl[3]),
                     out.dsum.eq(reduce_tree(d_terms, operator.add)),
                     out.count.eq(reduce_tree(c_terms, operator.add))]
        return m


class RowTotal(wiring.Component):
    """Accumulates a row's beats from the tree and sends its total ``count*B - S*sum d`` (equal to
    ``sum (B - S*d_i)``, so no per-lane multiplier here) as ``summed`` :data:`ROW_TOTAL_LATENCY` cycles after
    its last beat: the two products in one stage, their difference in the next (written by the ring). B and S
    are the bank's, read with the beat. Never stalled."""

    def __init__(self, config: HCCSConfig):
        self.config = config
        self.latency = ROW_TOTAL_LATENCY
        super().__init__({"i": In(stream.Signature(tree_sum_layout(config), always_ready=True)),
                          "banks": In(bank_view_signature(config)),
                          "summed": Out(bank_event(total=config.total_bits))})

    def elaborate(self, platform):
        cfg = self.config
        total_bits = cfg.total_bits
        params_layout = head_params_layout()
        m = Module()
        banks = _banks(self.banks)
        beat = self.i.payload
        acc_dsum = Signal(bits_for(cfg.n_max * DMAX_MAX))
        acc_count = Signal(bits_for(cfg.n_max))
        next_dsum = Mux(beat.first, 0, acc_dsum) + beat.dsum
        next_count = Mux(beat.first, 0, acc_count) + beat.count
        s3 = Signal(data.StructLayout({"valid": 1, "bank": BANK_BITS, "dsum": len(acc_dsum),
                                       "count": len(acc_count), "B": params_layout["B"].shape,
                                       "S": params_layout["S"].shape}))
        s4 = Signal(data.StructLayout({"valid": 1, "bank": BANK_BITS, "countB": total_bits + 1,
                                       "Sdsum": total_bits + 1}))
        m.d.sync += [s3.valid.eq(self.i.valid & beat.last), s3.bank.eq(beat.bank)]
        with m.If(self.i.valid):
            m.d.sync += [acc_dsum.eq(next_dsum), acc_count.eq(next_count), s3.dsum.eq(next_dsum),
                         s3.count.eq(next_count), s3.B.eq(banks[beat.bank].params.B),
                         s3.S.eq(banks[beat.bank].params.S)]
        m.d.sync += [s4.valid.eq(s3.valid), s4.bank.eq(s3.bank), s4.countB.eq(s3.count * s3.B),
                     s4.Sdsum.eq(s3.S * s3.dsum)]
        m.d.comb += [self.summed.valid.eq(s4.valid), self.summed.payload.bank.eq(s4.bank),
                     self.summed.payload.total.eq((s4.countB - s4.Sdsum)[:total_bits])]
        return m


class Reciprocal(wiring.Component):
    """The rows' reciprocals in ring order: for a SUMMED bank, ``inv`` of its total by the row's mode (div: a
    restoring divider, ``div_bits`` quotient bits per cycle, of ``UINT8_NUMERATOR`` or ``INT16_NUMERATOR``;
    clb: that numerator shifted right by the position of the total's leading one; 0 for a total of 0), sent
    as ``inverted`` :func:`reciprocal_latency` cycles after the bank turned SUMMED. One row at a time: the
    next starts in the cycle after ``inverted`` (occupancy :func:`reciprocal_cycles`)."""

    def __init__(self, config: HCCSConfig):
        self.config = config
        super().__init__({"banks": In(bank_view_signature(config)),
                          "inverted": Out(bank_event(inv=RECIPROCAL_BITS))})

    def elaborate(self, platform):
        cfg = self.config
        total_bits = cfg.total_bits
        m = Module()
        banks = _banks(self.banks)
        rbank = Signal(BANK_BITS)
        r_active = Signal()
        r_iter = Signal(range(max(NUMERATOR_BITS.values()) // cfg.div_bits + 2))
        # r_iter == 0 in a register of its own (set as r_iter steps from 1; every start loads r_iter >= 1), so
        # that the comparison is not in front of the banks' state registers.
        r_zero = Signal()
        divisor = Signal(total_bits)
        divisor_zero = Signal()
        remainder = Signal(total_bits + 1)
        quotient = Signal(RECIPROCAL_BITS)
        numerator_reg = Signal(reciprocal_steps(cfg) * cfg.div_bits)
        r_params = banks[rbank].params
        r_start = ~r_active & (banks[rbank].state == BankState.SUMMED)
        # The row's mode and output type, latched at the start: decoded from the bank's parameters through
        # rbank every cycle they were in front of every divider register.
        r_clb, r_out16 = Signal(), Signal()
        # The divider's registers load from bank rbank in every idle cycle (they are read only while
        # r_active): their enable is the ~r_active flip-flop, not the bank state comparison through rbank.
        with m.If(~r_active):
            numerators = {OUT_UINT8: UINT8_NUMERATOR, OUT_INT16: INT16_NUMERATOR}
            iters = {code: reciprocal_steps(cfg, "div", out) for out, code in OUT_CODES.items()}
            # Left-align each numerator in the shift register so its first quotient step reads its top bits.
            aligned = {o: numerators[o] << (len(numerator_reg) - iters[o] * cfg.div_bits) for o in numerators}
            m.d.sync += [r_active.eq(r_start), divisor.eq(banks[rbank].total),
                         divisor_zero.eq(banks[rbank].total == 0),
                         r_clb.eq(r_params.mode == MODE_CLB), r_out16.eq(r_params.out == OUT_INT16),
                         remainder.eq(0), quotient.eq(0),
                         numerator_reg.eq(Mux(r_params.out == OUT_INT16, aligned[OUT_INT16], aligned[OUT_UINT8])),
                         r_zero.eq(0),
                         r_iter.eq(Mux(r_params.mode == MODE_CLB, reciprocal_steps(cfg, "clb"),
                                       Mux(r_params.out == OUT_INT16, iters[OUT_INT16], iters[OUT_UINT8])))]
        r_done = Signal()
        r_inv = Signal(RECIPROCAL_BITS)
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
                m.d.comb += [self.inverted.valid.eq(1), self.inverted.payload.bank.eq(rbank),
                             self.inverted.payload.inv.eq(Mux(divisor_zero, 0, r_inv))]
                m.d.sync += [rbank.eq(rbank + 1), r_active.eq(0)]
        return m


class Scale(wiring.Component):
    """The normaliser's arithmetic: per lane ``min((B - S*d) * inv >> shift, max)`` (shift 15 and max 255 for
    OUT_UINT8, 0 and 32767 for OUT_INT16; masked lanes 0) onto ``o``. Latency :data:`SCALE_LATENCY`; one
    beat per cycle; every register moves only when the output moves (``i.ready = ~o.valid | o.ready``), so a
    stalled ``o`` holds the whole pipeline. ``busy``: a beat is inside."""

    def __init__(self, config: HCCSConfig):
        self.config = config
        self.latency = SCALE_LATENCY
        super().__init__({"i": In(stream.Signature(distance_layout(config, normalise_tag_layout(config)))),
                          "o": Out(stream.Signature(out_beat_layout(config))), "busy": Out(1)})

    def elaborate(self, platform):
        cfg = self.config
        L = cfg.lanes
        params_layout = head_params_layout()
        m = Module()
        advance = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(advance)
        framing = {"valid": 1, "first": 1, "last": 1, "head": cfg.head_bits, "mask": L, "out": 1}
        dist_layout = data.StructLayout({**framing, "B": params_layout["B"].shape, "S": params_layout["S"].shape,
                                         "inv": RECIPROCAL_BITS, "d": data.ArrayLayout(bits_for(DMAX_MAX), L)})
        tag = self.i.payload.tag
        arriving = {"valid": self.i.valid, "first": tag.first, "last": tag.last, "head": tag.head,
                    "mask": self.i.payload.mask, "out": tag.out, "B": tag.B, "S": tag.S, "inv": tag.inv,
                    "d": self.i.payload.d}
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
        carried = {**framing, "B": params_layout["B"].shape, "inv": RECIPROCAL_BITS}
        n_sd = Signal(data.StructLayout({**carried, "pairs": data.ArrayLayout(
            data.ArrayLayout(sd_bits, len(sd_pairs[0])), L)}))
        n_sdr = Signal(data.StructLayout({**carried, "sd": data.ArrayLayout(sd_bits, L)}))
        score_layout = data.StructLayout({**framing, "inv": RECIPROCAL_BITS,
                                          "score": data.ArrayLayout(bits_for(B_MAX), L)})
        n2, n2r = Signal(score_layout), Signal(score_layout)
        n2r_inv = Replicated(RECIPROCAL_BITS, L, "n2r_inv")
        # score * inv as two products on the low and high INV_SPLIT bits of inv: each fits one 18x18 multiplier.
        parts_layout = data.StructLayout({**framing, "lo": data.ArrayLayout(bits_for(B_MAX) + INV_SPLIT, L),
                                          "hi": data.ArrayLayout(bits_for(B_MAX) + RECIPROCAL_BITS - INV_SPLIT, L)})
        n3, n3r = Signal(parts_layout), Signal(parts_layout)
        n4 = Signal(data.StructLayout({**framing, "product": data.ArrayLayout(PRODUCT_BITS, L)}))
        n4_out16 = Replicated(1, L, "n4_out16")
        with m.If(advance):
            m.d.sync += [n_ops[name].eq(value) for name, value in arriving.items()] + n_ops_S.eq(tag.S)
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
        stages = [n_ops, n_sd, n_sdr, n2, n2r, n3, n3r, n4, self.o]
        assert len(stages) == self.latency
        m.d.comb += self.busy.eq(Cat(stage.valid for stage in stages).any())
        return m


class HCCS(RowUnit):
    """The HCCS unit; see the module docstring for ports, structure and contract.

    ``HCCS(lanes=8, heads=2, n_max=256, out_type="uint8", div_bits=2)`` or ``HCCS(config=HCCSConfig(...))``.
    """

    config_class = HCCSConfig

    @classmethod
    def layouts(cls, config):
        return in_beat_layout(config), out_beat_layout(config), cfg_layout(config), status_layout

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        # One memory with one write and two read ports; bank b's row at addresses b << ptr_bits onwards.
        m.submodules.rows = rows = Memory(shape=word_layout(cfg), depth=BANKS << _ptr_bits(cfg), init=[])
        m.submodules.heads = heads = HeadTable(cfg)
        m.submodules.banks = banks = BankRing(cfg)
        m.submodules.ingest = ingest = Ingest(cfg)
        m.submodules.row_max = row_max = RowMax(cfg)
        m.submodules.sum_reader = sum_reader = SumReader(cfg)
        m.submodules.sum_distances = sum_distances = CappedDistances(cfg, sum_tag_layout(cfg), always_ready=True)
        m.submodules.sum_tree = sum_tree = SumTree(cfg)
        m.submodules.row_total = row_total = RowTotal(cfg)
        m.submodules.reciprocal = reciprocal = Reciprocal(cfg)
        m.submodules.norm_reader = norm_reader = NormaliseReader(cfg)
        m.submodules.norm_distances = norm_distances = CappedDistances(cfg, normalise_tag_layout(cfg),
                                                                       always_ready=False)
        m.submodules.scale = scale = Scale(cfg)
        assert ingest_pipeline(cfg) == row_max.latency + BANK_LATENCY - 1
        assert sum_pipeline(cfg) == (sum_reader.latency + sum_distances.latency + sum_tree.latency
                                     + row_total.latency + BANK_LATENCY - 1)
        assert NORMALISE_PIPELINE == norm_reader.latency + norm_distances.latency + scale.latency

        wiring.connect(m, wiring.flipped(self.cfg), heads.cfg)
        wiring.connect(m, heads.view, ingest.heads)
        wiring.connect(m, banks.view, ingest.banks, sum_reader.banks, row_total.banks, reciprocal.banks,
                       norm_reader.banks)
        wiring.connect(m, wiring.flipped(self.i), ingest.i)
        wiring.connect(m, ingest.wr, rows.write_port())
        wiring.connect(m, sum_reader.rd, rows.read_port())
        wiring.connect(m, norm_reader.rd, rows.read_port())
        # Ingest -> row max -> sum (reader, distances, tree, total) -> reciprocal -> normalise (reader,
        # distances, scale), each stage passing a row on through the ring's bank states.
        flows = [(ingest.beat, row_max.beat), (sum_reader.o, sum_distances.i), (sum_distances.o, sum_tree.i),
                 (sum_tree.o, row_total.i), (norm_reader.o, norm_distances.i), (norm_distances.o, scale.i)]
        events = [(ingest.closed, banks.closed), (row_max.full, banks.full), (sum_reader.release, banks.summing),
                  (row_total.summed, banks.summed), (reciprocal.inverted, banks.inverted),
                  (norm_reader.release, banks.freed)]
        for producer, consumer in flows + events:
            wiring.connect(m, producer, consumer)
        wiring.connect(m, scale.o, wiring.flipped(self.o))

        m.d.comb += [ingest.clear.eq(self.clear_status), self.status.overflow.eq(ingest.status.overflow),
                     self.status.framing.eq(ingest.status.framing), self.status.bad_head.eq(ingest.status.bad_head)]
        # The sum stage's pipeline holds a bank SUMMING until its total is written: the ring's states cover it.
        m.d.comb += self.status.busy.eq(ingest.in_row | banks.busy | row_max.busy | norm_reader.o.valid
                                        | norm_distances.busy | scale.busy)
        return m
