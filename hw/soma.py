"""Soma decode unit: one integer decode step of one head, bit-exact with ``somatile.model.soma_int``.

The unit works on the tile's local memory (``hw/tile.py`` owns it and lends the unit a read and a write
port while it runs). A head's state lives there in the layout of :func:`somatile.hw.regmap.state_layout`
(ring and sink keys/values int8, field and gate field int16 with 7 fraction bits, counters u32); q, k and v
come from the tile's staging area and the output goes back there.

It is built for the tile's profile (``TileParams.profile``, docs/numerics.md "Two integer profiles"): "paper"
(int8 logits, uint8 probabilities, int8 output) or "wide" (int16 logits, Q15 probabilities, int16 output,
``regmap.decode_out_bytes``); the wide profile changes steps 3, 4 and the output's saturation below and
nothing else. One step, per head (docs/numerics.md, section Soma, is the contract):

1. LOAD: q, k, v and the gate field into LUT RAMs (ElementRam), the counters into registers; the field (read
   first in step 5) follows as step 4 begins, while the read port is idle.
2. WRITE (first when ``include_self``, else after step 5): k and v into the next sink slot or the ring.
3. SCORES: ``q . K[n]`` for every one of the ``sinks + ring`` slots, ``mac_lanes`` int8 MACs per cycle, then
   ``x = sat(rshift_round(score * score_mult, score_shift) - recency_int * distance)`` to int8 (wide: int16;
   0 where invalid); beside it, one element a cycle, the query gate ``sat(64 + rshift_round((q . G) *
   gate_mult, gate_shift), 0, 128)`` (128 when ungated).
4. NORMALISE: paper: integer HCCS (div/clb) through the streaming HCCS unit of ``hw/hccs.py`` (``hccs_lanes``
   per beat), or the integer exp through an exp-only :class:`RowNormaliser`, uint8 probabilities; wide: the head's
   normaliser (exp, hccs or pwl2) through the wide normaliser of ``hw/wide.py``, Q15 probabilities.
5. WEIGHTED SUM: ``P . V`` per output lane, ``mac_lanes`` MACs per cycle; then (FINAL) per element, in groups
   of :func:`element_lanes` a cycle, ``out = sat(sat16(rshift_round(acc * out_mult, out_shift)) +
   sat16(rshift_round(F * alpha_mult * gate, alpha_shift + 7)))`` to int8 (wide: int16) and the field updates
   ``F <- rshift_round(gamma F + (2^15 - gamma)(x << 7), 15)``.
6. STORE: field, gate field, counters and the output.

Every slot is visited whatever the fill level, so the cycle count depends only on the tile parameters:
:func:`expected_cycles` is exact (the testbench checks it at sequence positions 128 and 65,536). There is no
backpressure inside the unit: ``start`` is a one-cycle pulse, ``done`` a one-cycle pulse ``expected_cycles``
cycles later.
"""

from __future__ import annotations

import functools
import operator
from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from somatile.hw import hccs as hccs_unit
from somatile.hw import regmap
from somatile.hw import wide as wide_unit
from somatile.hw.pipe import (OffsetCounter, Replicated, TagLine, block_ram, delay, floor_log2, lut_mul_pipelined,
                              reduce_levels, reg, round_shift, saturate, skid_buffer, split_mul)
from somatile.hw.regmap import HEAD_INDEX, HEAD_PARAMS, PROFILE_HEAD_PARAMS, TileParams
from somatile.model import hccs, intexp
from somatile.model import soma_fixed as soma
from somatile.model.soma_int import LIMITS, WIDE_NORM_CODES

DIVIDER_BITS = 31
"""Quotient bits of the sequential reciprocal: the largest numerator is 32767 << 15 < 2**30."""

NORM_SUM_DEPTH = 10
"""Cycles from a row index's issue to its score reaching the running total (RowNormaliser's SUM pass)."""
NORM_OUT_DEPTH = 15
"""Cycles from a row index's issue to its probability being written (RowNormaliser's OUT pass)."""
NORM_RECIPROCAL_PREP = 4
"""Cycles between the final total and the divider's first step: leading one (2), pre-shift, divisor."""


PASS_SUM, PASS_OUT = 1, 2


def quotient_bits(exp_only: bool = False) -> int:
    """Quotient bits of :class:`RowNormaliser`'s reciprocal, one a cycle: :data:`DIVIDER_BITS`, or in the
    exp-only normaliser the bit length of its one numerator (``intexp.UINT8_NUMERATOR``: the restoring
    division's steps over the numerator's leading zeros give zero quotient bits and leave the remainder 0)."""
    return intexp.UINT8_NUMERATOR.bit_length() if exp_only else DIVIDER_BITS


def sum_depth(sum_lanes: int = 1) -> int:
    """Cycles from a SUM issue to its scores reaching the running total: :data:`NORM_SUM_DEPTH`, and with
    several lanes one more for the lanes' sum."""
    return NORM_SUM_DEPTH + (sum_lanes > 1)


def normaliser_cycles(n: int, exp_only: bool = False, sum_lanes: int = 1) -> int:
    """Cycles of :class:`RowNormaliser` for a row of ``n`` entries, from the cycle after ``start`` through
    the ``done`` pulse: start register 1, sum ``ceil(n / sum_lanes) + sum_depth(sum_lanes)``, reciprocal
    ``NORM_RECIPROCAL_PREP + quotient_bits(exp_only) + 1``, output ``n + NORM_OUT_DEPTH``, done 1 (the row's
    maximum is taken as the row is written, before ``start``)."""
    reciprocal = NORM_RECIPROCAL_PREP + quotient_bits(exp_only) + 1
    return 1 + (-(-n // sum_lanes) + sum_depth(sum_lanes)) + reciprocal + (n + NORM_OUT_DEPTH) + 1


def normaliser_lead_cycles(n: int, exp_only: bool = False, sum_lanes: int = 1) -> int:
    """Cycles of :class:`RowNormaliser` from the cycle after ``start`` through its ``first_out`` pulse, for a
    row of ``n`` entries: :func:`normaliser_cycles` less the ``n - 1`` cycles in which the OUT pass writes the
    row's other probabilities."""
    return normaliser_cycles(n, exp_only, sum_lanes) - (n - 1)


class NormaliserSignature(wiring.Signature):
    """The ports of a :class:`RowNormaliser` as the normaliser sees them (commands ``In``, ``done`` and
    ``prob`` ``Out``); a unit that drives one has ``In(NormaliserSignature(n_max))`` (the flipped view). An
    exp-only normaliser has no HCCS parameters (``use_exp``, ``clb``, ``out16``, ``B``, ``S``, ``dmax``)."""

    def __init__(self, n_max: int, exp_only: bool = False):
        hccs_ports = {} if exp_only else {"use_exp": In(1), "clb": In(1), "out16": In(1), "B": In(16), "S": In(8),
                                           "dmax": In(8)}
        super().__init__({
            "start": In(1), "done": Out(1), "count": In(range(n_max + 1)), **hccs_ports, "exp_mult": In(16),
            "row_we": In(1), "row_index": In(range(n_max)), "row_x": In(signed(8)), "row_valid": In(1),
            "row_bank": In(1), "prob_index": In(range(n_max)), "prob": Out(16), "first_out": Out(1),
        })


def head_params_layout(profile: str) -> data.StructLayout:
    """One head's parameter registers (``regmap.PROFILE_HEAD_PARAMS[profile]``) as one port: the decode unit's
    ``head``. Same fields in the same order in every profile; the wide profile's are as wide as its ranges."""
    return data.StructLayout({hp.name: range(hp.hi + 1) for hp in PROFILE_HEAD_PARAMS[profile]})


HEAD_PARAMS_LAYOUT = head_params_layout("paper")
"""The paper profile's head parameter port (a tile of the wide profile uses ``head_params_layout("wide")``)."""


def element_bits(params: TileParams) -> int:
    """Bits of a decode row's logit, its probability and an output element in the tile's profile (8 paper, 16
    wide: ``regmap.element_bytes``)."""
    return 8 * regmap.element_bytes(params)


def _lane_scores(m, distance, exp_mult, suffix: str, hccs_operands=None):
    """The integer exp's score of a ``distance`` (s3) to the row's maximum, in a register at s10: ``u =
    distance * exp_mult``, the polynomial of its fraction, shifted right by its integer part and rounded (0 past
    ``EXP_ZERO_SHIFT``); bit-exact with ``intexp``. With ``hccs_operands`` (capped distance at s4, S, B) also
    HCCS's ``B - S * capped`` at s10 (else None), built between the exp's steps."""
    u = reg(m, distance * exp_mult, "u" + suffix, unsigned(25))                               # s4
    if hccs_operands is not None:
        capped, S, B = hccs_operands
        hccs_product = lut_mul_pipelined(m, capped, S, "hccs_product", unsigned(16))         # s5-s6
    w = reg(m, (intexp.POLY_B - u[:intexp.EXP_FRAC_BITS]) >> 1, "w" + suffix, unsigned(17))   # s5
    z = delay(m, u >> intexp.EXP_FRAC_BITS, 3)                                   # s5-s7, used in s8
    hccs_score = None
    if hccs_operands is not None:
        hccs_score = reg(m, (B - hccs_product)[:16], "hccs_score", unsigned(16))      # s7
        hccs_score = delay(m, hccs_score, 3)                                         # s8-s10, used in s10
    square = reg(m, w * w, "square" + suffix, unsigned(34))                                   # s6
    poly = reg(m, intexp.POLY_A * (square >> 13), "poly" + suffix, unsigned(36))              # s7
    e = reg(m, (poly >> 15) + intexp.POLY_C, "e" + suffix, unsigned(22))                      # s8
    rounding = reg(m, (Const(1, 17) << z[:5]) >> 1, "rounding" + suffix, unsigned(17))
    underflow = delay(m, reg(m, z >= intexp.EXP_ZERO_SHIFT, "underflow" + suffix), 1)
    z_shift = delay(m, reg(m, z[:5], "z_shift" + suffix), 1)
    e_rounded = reg(m, e + rounding, "e_rounded" + suffix, unsigned(23))                      # s9
    return reg(m, Mux(underflow, 0, e_rounded >> z_shift), "exp_score" + suffix, unsigned(17)), hccs_score  # s10


class RowNormaliser(wiring.Component):
    """Integer HCCS (div/clb) or integer-exp softmax over one row of up to ``n_max`` int8 logits; with
    ``exp_only`` the integer exp alone (uint8 probabilities: the decode unit's fallback heads, whose HCCS
    heads use the tile's streaming row unit), without the HCCS ports or datapath.

    Bit-exact with ``hccs.hccs_row`` and ``intexp.intexp_row`` (masks included). The row is written through
    ``row_we/row_index/row_x/row_valid`` before ``start``, in index order from 0 through ``count - 1`` (the
    write of index 0 starts the row's running maximum, which each valid element's write updates: the row needs
    no pass of its own for it). The row memory holds two rows: the writes go to bank ``row_bank``, the passes
    read the bank ``row_bank`` named at ``start`` with the maximum as it was then, so that the next row may be
    written while the OUT pass still reads this one (the decode unit's next head's SCORES beside this head's
    weighted sum). The parameters (``count``, ``use_exp``, ``clb``,
    ``out16``, ``B``, ``S``, ``dmax``, ``exp_mult``) are sampled in the ``start`` cycle. After ``done`` the
    probabilities are read through ``prob_index -> prob`` with a one-cycle (synchronous) read; or already
    while the OUT pass writes them: ``first_out`` pulses a cycle after probability 0 is written, and from
    ``i`` cycles after that pulse on probability ``i`` is (:func:`normaliser_lead_cycles`; a reader that
    starts after the pulse and reads the row in index order at most one a cycle never overtakes the writes,
    which come one a cycle). Passes: sum, reciprocal, output, each streaming one element per cycle through a
    pipeline whose depth it adds once (:func:`normaliser_cycles`); with ``sum_lanes`` (exp-only) the SUM pass
    takes that many elements a cycle (the row in as many memory banks, element i in bank ``i % sum_lanes``, and
    an exp pipeline per lane). No register-to-register path holds more than one multiplier, one carry chain or
    one barrel shifter.
    """

    def __init__(self, n_max: int, exp_only: bool = False, sum_lanes: int = 1):
        if sum_lanes != 1 and not (exp_only and sum_lanes & (sum_lanes - 1) == 0):
            raise ValueError(f"RowNormaliser: sum_lanes {sum_lanes}: expected 1, or a power of two when exp_only")
        self.n_max, self.exp_only, self.sum_lanes = n_max, exp_only, sum_lanes
        super().__init__(NormaliserSignature(n_max, exp_only))

    def elaborate(self, platform):
        m = Module()
        n_max, lanes = self.n_max, self.sum_lanes
        lane_bits = (lanes - 1).bit_length()
        # The row's memory banks (one but for a multi-lane SUM pass): element i in bank i % lanes, word i // lanes.
        banks = []
        row_words = -(-n_max // lanes)
        word_bits = (row_words - 1).bit_length()
        for bank in range(lanes):
            m.submodules["row" if lanes == 1 else f"row{bank}"] = row = Memory(
                shape=unsigned(9), depth=2 << word_bits, init=[])
            banks.append(row)
        pass_bank = Signal()  # the row the passes read: row_bank at start

        def row_address(word, row):
            return Cat(Cat(word, Const(0, word_bits))[:word_bits], row)
        probs, prob_r = block_ram(m, "probs", unsigned(16), n_max)
        ports = []
        for row in banks:
            row_w = row.write_port()
            row_r = row.read_port()
            ports.append((row_w, row_r))
        row_reads = [read for _, read in ports]
        prob_w = probs.write_port()
        for bank, (row_w, _) in enumerate(ports):
            if lanes == 1:
                address, enable = self.row_index, self.row_we
            else:
                address = self.row_index >> lane_bits
                enable = self.row_we & (self.row_index[:lane_bits] == bank)
            reads = [prob_r.addr.eq(self.prob_index), self.prob.eq(prob_r.data)] if bank == 0 else []
            m.d.comb += [row_w.addr.eq(row_address(address, self.row_bank)),
                         row_w.data.eq(Cat(self.row_x, self.row_valid)), row_w.en.eq(enable),
                         *reads]

        # Parameters, sampled at start.
        last_index = Signal(signed(len(self.count) + 1))
        exp_mult = Signal(16)
        with m.If(self.start):
            m.d.sync += [last_index.eq(self.count - 1), exp_mult.eq(self.exp_mult)]
        # The SUM pass's last group of lanes (a pass of groups when lanes > 1).
        last_group = Signal.like(last_index)
        if lanes > 1:
            with m.If(self.start):
                m.d.sync += last_group.eq((self.count - 1) >> lane_bits)
        if self.exp_only:
            # Constants: the HCCS datapath below then drives nothing and is not built.
            use_exp, clb, out16, B, S, dmax = Const(1), Const(0), Const(0), Const(0, 16), Const(0, 8), Const(0, 8)
        else:
            use_exp, clb, out16 = Signal(), Signal(), Signal()
            B, S, dmax = Signal(16), Signal(8), Signal(8)
            with m.If(self.start):
                m.d.sync += [use_exp.eq(self.use_exp), clb.eq(self.clb), out16.eq(self.out16), B.eq(self.B),
                             S.eq(self.S), dmax.eq(self.dmax)]

        # Issue: one row index per cycle while `issuing`; the tags (valid, last, pass, index) travel with it,
        # so that a consumer ignores the previous pass's elements still in the pipeline.
        index = Signal(range(n_max + 1))
        issuing = Signal()
        pass_code = Signal(2)
        if lanes == 1:
            is_last = index == last_index
            m.d.comb += row_reads[0].addr.eq(row_address(index, pass_bank))
            selected = row_reads[0].data
        else:
            # SUM issues groups (every bank at word `index`), OUT elements (word index // lanes of each bank, the
            # element's bank selected a cycle later, as its word arrives).
            out_pass = pass_code == PASS_OUT
            is_last = Mux(out_pass, index == last_index, index == last_group)
            m.d.comb += [read.addr.eq(row_address(Mux(out_pass, index >> lane_bits, index), pass_bank))
                         for read in row_reads]
            bank = reg(m, Mux(out_pass, index[:lane_bits], 0), "row_bank")
            selected = Array(read.data for read in row_reads)[bank]
            # Lane l's element of a SUM group is in the row (index * lanes + l <= last_index), with its word.
            in_row = [reg(m, Cat(Const(l, lane_bits), index) <= last_index, f"in_row{l}") for l in range(lanes)]
        tags = TagLine(m, issuing, is_last, pass_code, [index], NORM_OUT_DEPTH, "norm_tag")
        at = tags.at  # (valid, last, index) of the element of a pass issued some cycles ago

        # The row's maximum over its valid elements, kept as the row is written (see the docstring); -256 when
        # none is valid (a fully masked row: every score is then masked to 0).
        row_max = Signal(signed(10), init=-256)
        row_max_next = Signal.like(row_max)  # row_max after this cycle's write
        m.d.comb += row_max_next.eq(row_max)
        with m.If(self.row_we):
            with m.If(self.row_index == 0):
                m.d.comb += row_max_next.eq(Mux(self.row_valid, self.row_x, -256))
            with m.Elif(self.row_valid & (self.row_x > row_max)):
                m.d.comb += row_max_next.eq(self.row_x)
        m.d.sync += row_max.eq(row_max_next)
        # The passes' maximum: the row's at start, with the write of the start cycle (the decode unit's last
        # write comes beside start), held while the next row's writes restart row_max.
        pass_max = Signal.like(row_max)
        with m.If(self.start):
            m.d.sync += [pass_max.eq(row_max_next), pass_bank.eq(self.row_bank)]
        total = Signal(32)
        inv = Signal(32)

        # s1: the element from the row memory (a block RAM, whose clock-to-output alone is over half a cycle
        # on the ECP5); s2: in a register, before any arithmetic.
        x = reg(m, selected[:8].as_signed(), "x")
        valid2 = reg(m, selected[8], "x_valid")
        distance = reg(m, pass_max - x, "distance", unsigned(9))                       # s3
        valid = delay(m, valid2, 1)
        capped = reg(m, Mux(distance > dmax, dmax, distance), "capped")              # s4
        exp_score, hccs_score = _lane_scores(m, distance, exp_mult, "", (capped, S, B))
        valid = delay(m, valid, NORM_SUM_DEPTH - 3)
        score = Signal(17)
        m.d.comb += score.eq(Mux(valid, Mux(use_exp, exp_score, hccs_score), 0))
        if lanes > 1:
            # The other lanes of a SUM group (exp only): the same steps on their banks' words; then the
            # group's sum, a stage of its own (sum_depth).
            scores = [score]
            for lane in range(1, lanes):
                word = row_reads[lane].data
                lane_valid = reg(m, word[8] & in_row[lane], f"x_valid{lane}")
                lane_distance = reg(m, pass_max - reg(m, word[:8].as_signed(), f"x{lane}"), f"distance{lane}",
                                    unsigned(9))
                lane_score, _ = _lane_scores(m, lane_distance, exp_mult, str(lane))
                scores.append(Mux(delay(m, lane_valid, NORM_SUM_DEPTH - 2), lane_score, 0))
            group_score = reg(m, sum(scores), "group_score", unsigned(17 + lane_bits))

        # Reciprocal operands: HCCS divides the numerator by the total (div) or shifts it (clb); the integer
        # exp first brings the total into [2**14, 2**15) with a pre-shift.
        log2_total = floor_log2(m, total, "log2_total")
        pre_shift = reg(m, Mux(use_exp & (log2_total > intexp.SUM_NORM_BITS - 1),
                               log2_total - (intexp.SUM_NORM_BITS - 1), 0), "pre_shift", range(32))
        divisor = reg(m, total >> pre_shift, "divisor", unsigned(32))
        bits = quotient_bits(self.exp_only)
        numerator = Signal(bits)
        m.d.comb += numerator.eq(Mux(use_exp,
                                     Mux(out16, intexp.INT16_NUMERATOR, intexp.UINT8_NUMERATOR),
                                     Mux(out16, hccs.INT16_NUMERATOR, hccs.UINT8_NUMERATOR)))
        clb_inv = reg(m, numerator >> log2_total, "clb_inv", unsigned(DIVIDER_BITS))
        # The total is final from RECIPROCAL's first cycle on, read as zero at its end: a 32-bit comparison in
        # front of the reciprocal's enables was a late group of the ULX3S SoC (norm.total -> norm.inv).
        total_zero = reg(m, total == 0, "total_zero")

        # s11-s15 of the OUT pass: pre-shift, score * inv (split, operands registered), saturate, write.
        shifted = reg(m, Mux(use_exp, score >> pre_shift, score), "shifted", unsigned(17))      # s11
        product = split_mul(m, inv[:bits], shifted, "prob_product")                           # s14
        valid = delay(m, valid, 4)
        hccs_prob = Mux(out16, Mux(product > hccs.INT16_MAX, hccs.INT16_MAX, product),
                        Mux((product >> hccs.INV_SHIFT) > hccs.UINT8_MAX, hccs.UINT8_MAX,
                            product >> hccs.INV_SHIFT))
        prob = reg(m, Mux(valid, Mux(use_exp, product >> 15, hccs_prob), 0), "prob", unsigned(16))  # s15
        _, _, out_index = at(NORM_OUT_DEPTH, PASS_OUT)
        m.d.comb += [prob_w.addr.eq(out_index), prob_w.data.eq(prob)]
        # first_out from a reset-less register of the write enable, outside the state machine: set inside its
        # OUT state (with a reset), the ULX3S tile's ABC9 LUT mapping hit a Yosys assertion in
        # ABC_OPS_REINTEGRATE and the build fell back to classic abc (~1,200 LUTs more).
        m.d.comb += self.first_out.eq(reg(m, prob_w.en & (out_index == 0), "first_out_r", reset_less=True))

        remainder = Signal(33)
        numerator_bits = Signal(bits)
        step = Signal(range(NORM_RECIPROCAL_PREP + bits + 1))

        def next_pass(state, code):
            m.d.sync += [index.eq(0), issuing.eq(1), pass_code.eq(code)]
            m.next = state

        with m.If(issuing):
            m.d.sync += index.eq(index + 1)
            with m.If(is_last):
                m.d.sync += issuing.eq(0)

        # The passes begin a cycle after `start`, from a register: in the tile `start` comes through the
        # selection between the decode unit and the HCCS command, whose select flag is far from here.
        started = reg(m, self.start, "started", reset_less=False)
        m.d.sync += self.done.eq(0)  # a one-cycle pulse from a register, set as the FSM enters DONE
        with m.FSM():
            with m.State("IDLE"):
                with m.If(started):
                    m.d.sync += total.eq(0)
                    next_pass("SUM", PASS_SUM)
            with m.State("SUM"):
                v, last, _ = at(sum_depth(lanes), PASS_SUM)
                with m.If(v):
                    m.d.sync += total.eq(total + (score if lanes == 1 else group_score))
                with m.If(v & last):
                    m.d.sync += step.eq(0)
                    m.next = "RECIPROCAL"
            with m.State("RECIPROCAL"):
                m.d.sync += step.eq(step + 1)
                with m.If(step == NORM_RECIPROCAL_PREP - 1):
                    m.d.sync += [remainder.eq(0), inv.eq(0), numerator_bits.eq(numerator)]
                with m.Elif(step == NORM_RECIPROCAL_PREP + bits):
                    with m.If(total_zero):
                        m.d.sync += inv.eq(0)
                    with m.Elif(~use_exp & clb):
                        m.d.sync += inv.eq(clb_inv)
                    next_pass("OUT", PASS_OUT)
                with m.Elif(step >= NORM_RECIPROCAL_PREP):
                    shifted_rem = Cat(numerator_bits[-1], remainder[:32])
                    m.d.sync += numerator_bits.eq(numerator_bits << 1)
                    with m.If(shifted_rem >= divisor):
                        m.d.sync += [remainder.eq(shifted_rem - divisor), inv.eq(Cat(1, inv[:31]))]
                    with m.Else():
                        m.d.sync += [remainder.eq(shifted_rem), inv.eq(Cat(0, inv[:31]))]
            with m.State("OUT"):
                v, last, _ = at(NORM_OUT_DEPTH, PASS_OUT)
                m.d.comb += prob_w.en.eq(v)
                with m.If(v & last):
                    m.d.sync += self.done.eq(1)
                    m.next = "DONE"
            with m.State("DONE"):
                m.next = "IDLE"
        return m


def near_field_unit(params: TileParams) -> "hccs_unit.HCCSConfig | wide_unit.WideConfig":
    """Configuration of the tile's one streaming row unit, which normalises the decode row and the HCCS
    command's rows: in the paper profile the HCCS unit (hw/hccs.py) with ``hccs_lanes`` lanes and the command's
    ``hccs_out``, in the wide profile the wide normaliser (hw/wide.py) of every head with as many int16 lanes
    as it is built for up to ``hccs_lanes``. One head (loaded with the parameters of the row's head before each
    row), rows of up to the larger of ``sinks + ring`` slots and the command's padded ``n_max`` elements, rounded
    up to whole beats, and a divider of one quotient bit per cycle: the unit takes one row per decode step, so
    its divider's rate does not matter, and two chained subtractors per cycle do not fit one cycle on the ECP5
    tile (the paper's 23-bit reciprocal takes 25 cycles instead of 14)."""
    if params.profile == "wide":
        lanes = max(lanes for lanes in wide_unit.LANES if lanes <= params.hccs_lanes)
    else:
        lanes = params.hccs_lanes
    longest = max(params.slots, regmap.hccs_row_bytes(params, params.n_max) // regmap.element_bytes(params))
    n_max = -(-longest // lanes) * lanes
    if params.profile == "wide":
        return wide_unit.WideConfig(lanes=lanes, heads=1, n_max=n_max, div_bits=1)
    return hccs_unit.HCCSConfig(lanes=lanes, heads=1, n_max=n_max, out_type=params.hccs_out, div_bits=1)


def near_row_beats(params: TileParams) -> int:
    """Beats of the decode row (its ``sinks + ring`` slots, the last beat's spare lanes masked)."""
    return -(-params.slots // near_field_unit(params).lanes)


def near_field_port(params: TileParams) -> wiring.Signature:
    """The row unit's streams as the decode unit offers them to the tile's HCCS command
    (:meth:`somatile.hw.row_unit.RowUnit.port_signature`)."""
    unit = wide_unit.WideNormaliser if params.profile == "wide" else hccs_unit.HCCS
    return unit.port_signature(near_field_unit(params))


PHASE_SCORES, PHASE_GATE, PHASE_WEIGHTED, PHASE_FINAL = range(4)

READ_LATENCY = 3
"""Cycles from an address chosen to its word at the unit: the address register, the memory's read, the
registered word (``rd_word``)."""
FEED_INDEX_COPIES = 8  # copies of the HCCS feed's beat index, each selecting a group of the beat's lanes
# (with 4 at 6db64c4, feed_index_r1 -> the unit's input data was a late path of the ULX3S tile)
ROW_WRITE_COPIES = 4  # copies of the decode row's write registers in NearFieldFeed, each for a group of beats
FEED_LATENCY = 1
"""Cycles the decode row's beats spend in the register slice in front of the HCCS unit."""
SAMPLE_COPIES = 4  # copies of the decode unit's idle flag, each enabling a share of the head parameter registers
PROB_GROUP_COPIES = 4  # copies of the weighted sum's probability group index, each selecting a share of its bits
WEIGHTED_DEPTH = READ_LATENCY + 3
"""WEIGHTED SUM: read, then the probability and value operands registered, then their products (2: partial
products in pairs, then their sum)."""
FINAL_DEPTH = 12
"""FINAL: the near term (its sum selected 1, split product 3, round-shift 3, saturate 1, aligned 3) beside the
far term (the register files' words read 1, elements selected 1, operand 1, a product 1, split product 3,
round-shift 3, saturate 1), their sum saturated (1). Both round-shifts shift in two steps (``round_shift``)."""
FIELD_DEPTH = 7
"""FINAL's field updates: operands read (1) and selected (1), registered twice (2), products (2: a register on
each side of the multiplier's), sum and rounding (1)."""
GATE_DEPTH = 9
"""Query gate after its last element's issue: operands (1), product (2), accumulate (1), split product (3),
round-shift (2); the gate register follows one cycle later."""


class ElementRam:
    """A register file of ``elements`` elements of ``bits`` bits, held as a memory of ``word_bits``-bit words:
    LOAD, STORE and WRITE move whole words, the other phases read and write single elements. The read port
    is asynchronous and the write port has one enable per element, so Yosys maps it to LUT RAM on the ECP5
    (TRELLIS_DPR16X4): no enable or multiplexer reaches every bit of the file, as one did when the files were
    flip-flops (on the ECP5 their rotation enables were the largest group of late endpoints of the tile).

    Each consumer reads through a port of its own (``reader(address)``; on the ECP5 each is one more copy of
    the LUT RAM), so that no read address is a multiplexer steered by the state machine. ``word_of(d)`` is the
    word holding element ``d``; a reader's ``element(d)`` selects it from the word read.

    Writes (``write_word``, ``write_elements``) pass through a register (address, data, enables) in front of
    the write port and land at the second clock edge: a read in the next cycle still returns the old word.
    The register keeps the writers' multiplexer and the enable decoding off the paths to the LUT RAM cells,
    every copy of which the write port reaches (too far for one cycle with the multiplexer). Every word
    written here is read again three or more cycles later: LOAD's words in later phases, FINAL's field
    elements at the next step, its output elements (FINAL_DEPTH) after its last field element
    (FIELD_DEPTH) is four cycles old."""

    def __init__(self, m, name: str, bits: int, elements: int, word_bits: int, banks: int = 1):
        self.m, self.bits, self.banks = m, bits, banks
        self.per_word = word_bits // bits
        self._shift = self.per_word.bit_length() - 1
        self.words = elements // self.per_word
        # banks > 1: copies of the file side by side, the bank the high address bits (a register of the
        # caller's), so that one head's copy is written while another head's is read.
        self._addr_bits = (self.words - 1).bit_length()
        depth = self.words if banks == 1 else banks << self._addr_bits
        m.submodules[name] = self.memory = Memory(shape=unsigned(word_bits), depth=depth, init=[])
        port = self.memory.write_port(granularity=bits)
        self.wr = SimpleNamespace(addr=Signal.like(port.addr, name=f"{name}_wr_addr"),
                                  data=Signal.like(port.data, name=f"{name}_wr_data"),
                                  en=Signal.like(port.en, name=f"{name}_wr_en"))
        m.d.sync += [port.addr.eq(self.wr.addr), port.data.eq(self.wr.data), port.en.eq(self.wr.en)]

    def _address(self, address, bank):
        if self.banks == 1:
            return address
        return Cat(Cat(address, Const(0, self._addr_bits))[:self._addr_bits], bank)

    def word_of(self, d):
        return d >> self._shift

    def reader(self, address, bank=None):
        """A read port at word ``address`` (of ``bank``) (combinational): ``.data`` the word."""
        port = self.memory.read_port(domain="comb")
        self.m.d.comb += port.addr.eq(self._address(address, bank))
        return SimpleNamespace(data=port.data)

    def serve(self, port, bank=None):
        """A read port of its own for a stage's :class:`RegisterFileRead` ``port`` (in ``bank``)."""
        self.m.d.comb += port.data.eq(self.reader(port.addr, bank).data)

    def write_word(self, address, value, bank=None):
        self.m.d.comb += [self.wr.addr.eq(self._address(address, bank)), self.wr.data.eq(value),
                          self.wr.en.eq(-1)]

    def write_elements(self, d, values, bank=None):
        """Elements ``d`` .. ``d + len(values) - 1`` in one write (``d`` a multiple of ``len(values)``, which
        divides the word's elements)."""
        n = len(values)
        assert self.per_word % n == 0
        self.m.d.comb += [self.wr.addr.eq(self._address(self.word_of(d), bank)),
                          self.wr.data.eq(Cat(*values).replicate(self.per_word // n)),
                          self.wr.en.eq(Const((1 << n) - 1, self.per_word) << d[:self._shift])]


def tree_levels(lanes: int) -> int:
    """Registered adder levels that sum ``lanes`` products (one carry chain per stage)."""
    return (lanes - 1).bit_length()


def issue_shape(params: TileParams):
    """The issue counter's shape: a slot (SCORES, WEIGHTED SUM), an element (NORMALISE's gate) or a lane (FINAL)."""
    return range(max(params.slots, params.head_dim, params.mac_lanes) + 1)


def item_layout(params: TileParams) -> data.StructLayout:
    """The tags of one issued item as a stage reads them from the decode unit's tag line, some cycles after its
    issue: valid (for the stage's phase), last (the phase's last item), n (slot, element or lane), c (chunk)."""
    return data.StructLayout({"valid": 1, "last": 1, "n": issue_shape(params),
                              "c": range(params.head_dim // params.mac_lanes + 1)})


def row_layout(params: TileParams) -> data.StructLayout:
    """One logit of the decode row, as SCORES writes it: the write enable, the row's last slot, the slot, whether
    the slot holds a key (an empty slot's logit is 0 and masked) and the logit (int8, int16 in the wide
    profile); ``end`` is ``we & last`` in a register of its own (it starts NORMALISE's counters)."""
    return data.StructLayout({"we": 1, "last": 1, "end": 1, "index": issue_shape(params), "valid": 1,
                              "x": signed(element_bits(params))})


COUNTERS_LAYOUT = data.StructLayout({"write_pos": 32, "fill": 32, "step": 32})
"""The head's counters, in the order of their state word."""


def element_write_layout(params: TileParams, value_shape) -> data.StructLayout:
    """One element written into a register file (:meth:`ElementRam.write_elements`): enable, element, value."""
    element_bits = (params.mac_lanes - 1).bit_length() + len(Signal(range(params.head_dim // params.mac_lanes + 1)))
    return data.StructLayout({"en": 1, "element": element_bits, "value": value_shape})


class RegisterFileRead(wiring.Signature):
    """A read port of an :class:`ElementRam` of head_dim elements of ``bits`` bits as its reader sees it: the word
    address out, the word back in the same cycle (the LUT RAM's read is asynchronous)."""

    def __init__(self, params: TileParams, bits: int):
        words = params.head_dim * bits // (8 * params.word_bytes)
        super().__init__({"addr": Out(range(words)), "data": In(8 * params.word_bytes)})


def element_shift(word_bits: int, bits: int) -> int:
    """log2 of the elements of ``bits`` bits per register-file word."""
    return (word_bits // bits).bit_length() - 1


def element_of(word, d, bits: int):
    """Element ``d`` of ``bits`` bits from a register-file word that holds it."""
    return word.word_select(d[:element_shift(len(word), bits)], bits)


def chunk_word(c, params: TileParams):
    """The word of a K/V/q row that holds chunk c (W / L is a power of two)."""
    return c >> (params.word_bytes // params.mac_lanes).bit_length() - 1


def lane_group(word, c, params: TileParams):
    """Chunk c's ``mac_lanes`` bytes of the memory word holding it."""
    L, W = params.mac_lanes, params.word_bytes
    if L >= W:
        return word
    return word.word_select(c % (W // L), 8 * L)


def parameter_operand(m, head, name: str):
    """A copy of parameter ``name`` for one multiplier, through two registers so that the last one can sit beside
    its DSP block rather than across the die. The copy is two cycles behind ``head``, which is constant from
    start on; no multiplier uses its parameter before LOAD's end."""
    return delay(m, head[name], 2, f"{name}_operand")


def head_choice(head, name: str, choice: str):
    """Whether the head's parameter ``name`` selects ``choice`` (one of its ``choices``; a choice both profiles
    have has the same register value in each, so the paper's table serves the wide head too)."""
    return head[name] == HEAD_PARAMS[HEAD_INDEX[name]].choices.index(choice)


def wide_code(head):
    """The wide normaliser's code (``wide.NORM_*``) of the head's ``normaliser`` register."""
    choices = PROFILE_HEAD_PARAMS["wide"][HEAD_INDEX["normaliser"]].choices
    return Array(Const(WIDE_NORM_CODES[name], 2) for name in choices)[head["normaliser"]]


class ScoreStage(wiring.Component):
    """SCORES' datapath: the logit of every slot, ``sat(rshift_round((q . K[n]) * score_mult, score_shift) -
    recency_int * distance)`` to int8, or to int16 in the wide profile (0 and masked for an empty slot).

    Reads chunk c of slot n's key (``k_word``: the memory word, :data:`READ_LATENCY` cycles after its address)
    and of q (through ``q``), one (slot, chunk) item per cycle as ``read_item`` (the tag line at READ_LATENCY)
    names it; ``counters`` and ``head`` are constant while it runs. Writes ``row`` (:func:`row_layout`), slot by
    slot in issue order, :meth:`depth` cycles after the address of the slot's last chunk. Throughput one chunk
    per cycle; no backpressure. ``accumulate_item`` is the tag line a cycle before :meth:`accumulate_stage`.
    """

    def __init__(self, params: TileParams):
        self.params = params
        super().__init__({
            "head": In(head_params_layout(params.profile)), "counters": In(COUNTERS_LAYOUT),
            "read_item": In(item_layout(params)), "accumulate_item": In(item_layout(params)),
            "k_word": In(8 * params.word_bytes), "q": Out(RegisterFileRead(params, 8)),
            "row": Out(row_layout(params)),
        })

    @staticmethod
    def accumulate_stage(params: TileParams) -> int:
        """Cycles from an item's address to its partial dot product at the accumulator: read, operands, products
        (2: partial products in pairs, then their sum), the adder tree."""
        return READ_LATENCY + 3 + tree_levels(params.mac_lanes)

    @staticmethod
    def depth(params: TileParams) -> int:
        """Cycles from a slot's last (slot, chunk) address to its logit in ``row``: :meth:`accumulate_stage`, the
        accumulator, ``dot * score_mult`` (3), round-shift (2), recency subtraction (1), saturation (1)."""
        return ScoreStage.accumulate_stage(params) + 1 + 7

    @staticmethod
    def cycles(params: TileParams) -> int:
        """SCORES: every (slot, chunk) issued, then the pipeline's depth."""
        return params.slots * (params.head_dim // params.mac_lanes) + ScoreStage.depth(params)

    def elaborate(self, platform):
        m = Module()
        p = self.params
        L, chunks, sinks, ring = p.mac_lanes, p.head_dim // p.mac_lanes, p.sinks, p.ring
        par, write_pos, fill, step = self.head, self.counters.write_pos, self.counters.fill, self.counters.step
        n_bits = len(self.read_item.n)

        # Read, operands, products, adder tree, accumulator.
        s = READ_LATENCY
        c_read = self.read_item.c
        m.d.comb += self.q.addr.eq(chunk_word(c_read, p))
        q_chunk = reg(m, lane_group(self.q.data, c_read, p), "q_chunk")  # chunk c_read
        k_chunk = reg(m, lane_group(self.k_word, c_read, p), "k_chunk")
        s += 1
        terms = [lut_mul_pipelined(m, q_chunk.word_select(l, 8).as_signed(), k_chunk.word_select(l, 8).as_signed(),
                                   f"qk{l}", signed(16)) for l in range(L)]
        s += 2
        while len(terms) > 1:  # one registered adder level per stage
            terms = [reg(m, t, f"dot_tree{s}_{i}") for i, t in enumerate(reduce_levels(terms, operator.add, 1))]
            s += 1
        assert s == self.accumulate_stage(p)
        partial = terms[0]
        acc = Signal(signed(32))
        dot = Signal(signed(32))
        # The item's tags and its chunk comparisons in registers of the accumulator's own, from the tag line a
        # stage early: compared in the accumulator's cycle, the tag line's chunk reached the 32-bit adder and the
        # enables of acc and dot through two levels of logic (the ULX3S array's critical path, static placer).
        item = self.accumulate_item
        v_acc = reg(m, item.valid, "acc_valid", reset_less=False)
        last_acc, n_acc = reg(m, item.last, "acc_last"), reg(m, item.n, "acc_slot")
        first_chunk, last_chunk = reg(m, item.c == 0, "acc_first_chunk"), reg(m, item.c == chunks - 1, "acc_last_chunk")
        dot_tags = Signal(2 + n_bits)  # valid, last, slot of `dot`
        m.d.sync += dot_tags.eq(0)
        with m.If(v_acc):
            with m.If(last_chunk):
                m.d.sync += [dot.eq(Mux(first_chunk, 0, acc) + partial), dot_tags.eq(Cat(1, last_acc, n_acc))]
            with m.Else():
                m.d.sync += acc.eq(Mux(first_chunk, 0, acc) + partial)
        s += 1

        # Logit of the completed dot product: x = sat(rshift_round(dot * score_mult, score_shift) -
        # recency_int * distance) to the profile's logit, 0 for an empty slot.
        dot_slot = dot_tags[2:]
        # The counters' bounds in registers: step and fill change only in WRITE and LOAD, many cycles before
        # a slot's dot product completes (the comparisons of step and fill in the path would not fit a cycle).
        # For a ring slot, dot_slot - sinks < fill is dot_slot < fill + sinks (fill <= ring: LOAD_STATE checks).
        if sinks:
            sink_fill = reg(m, Mux(step < sinks, step, sinks), "sink_fill", range(sinks + 1))
            ring_end = reg(m, fill + sinks, "ring_end", range(ring + sinks + 1))
            slot_valid = Mux(dot_slot < sinks, dot_slot < sink_fill, dot_slot < ring_end)
        else:
            slot_valid = dot_slot < fill
        # age = write_pos - 1 - (dot_slot - sinks) as (write_pos - 1 + sinks) - dot_slot, the first term in a
        # register (write_pos changes only in WRITE and LOAD, like fill): a ring slot's age then is one
        # subtraction from registers (two in one cycle do not fit on the ECP5 tile). In a legal state
        # write_pos < ring (LOAD_STATE checks it), so its low bits hold it and a ring slot's age lies in
        # [-ring, ring).
        pos_bits = max(1, (ring - 1).bit_length())
        age_base = reg(m, write_pos[:pos_bits] - 1 + sinks, "age_base", signed(pos_bits + 2 + sinks.bit_length()))
        age = reg(m, age_base - dot_slot, "age", signed(len(age_base) + 1))
        in_sink = delay(m, dot_slot < sinks, 1)
        wrapped = Mux(age < 0, age + ring, age) + Mux(par["include_self"], 0, 1)
        # A legal state has write_pos < ring (LOAD_STATE checks it), so a ring slot's distance is at most ring:
        # the product fits one multiplier.
        distance = reg(m, Mux(in_sink, 0, wrapped) if sinks else wrapped, "distance", range(ring + 1))
        # In two registered steps (in one, its adder tree behind distance does not fit a cycle), then
        # delayed to meet scaled.
        recency = lut_mul_pipelined(m, parameter_operand(m, par, "recency_int"), distance, "recency",
                                    unsigned(len(par["recency_int"]) + len(distance)))
        scaled = round_shift(m, split_mul(m, dot, parameter_operand(m, par, "score_mult"), "score_product"),
                             par["score_shift"], soma.INT_SHIFT_MAX, "scaled")
        # The saturation's comparisons beside the subtraction, on its operands: logit > hi is scaled > recency
        # + hi (the sums registered while recency waits for scaled), so row_x takes a multiplexer after
        # registers; the comparisons of the registered logit in front of row_x were the ULX3S SoC's latest path.
        lo, hi = LIMITS[p.profile]["logit"]
        bounds = [reg(m, recency + bound, f"recency_{name}", signed(len(recency) + 2))
                  for bound, name in ((hi, "hi"), (lo, "lo"))]
        recency = delay(m, recency, 1)
        logit = reg(m, scaled - recency, "logit", signed(len(scaled) + 1))
        above, below = reg(m, scaled > bounds[0], "logit_above"), reg(m, scaled < bounds[1], "logit_below")
        row_x = reg(m, Mux(delay(m, slot_valid, 6), Mux(above, hi, Mux(below, lo, logit)), 0), "row_x",
                    self.row.x.shape())
        early_tags = delay(m, Cat(dot_tags, slot_valid), 6, reset_less=False)
        row_tags = reg(m, early_tags, "row_tags", reset_less=False)
        s += 7
        assert s == self.depth(p)
        m.d.comb += [self.row.we.eq(row_tags[0]), self.row.last.eq(row_tags[1]),
                     self.row.end.eq(reg(m, early_tags[0] & early_tags[1], "row_end", reset_less=False)),
                     self.row.index.eq(row_tags[2:2 + n_bits]), self.row.valid.eq(row_tags[-1]),
                     self.row.x.eq(row_x)]
        return m


class NearFieldFeed(wiring.Component):
    """The decode row through the tile's streaming row unit (:func:`near_field_unit`): in the paper profile an
    HCCS head's row through the HCCS unit of ``hw/hccs.py``, in the wide profile every head's row through the
    wide normaliser of ``hw/wide.py``, its ``cfg`` written at ``start`` with the code of the head's normaliser
    (:func:`wide_code`) and its B, S and dmax.

    Keeps the row in registers as SCORES writes it (``row``), and from ``start`` (a pulse, the row complete)
    feeds it in :func:`near_row_beats` beats of the unit's lanes through a register slice
    (:data:`FEED_LATENCY`) and collects the unit's probabilities in ``probs`` (slot n at element n: uint8
    paper, Q15 uint16 wide); ``done`` is high in the cycle the last beat arrives (``probs`` holds it the cycle
    after). In the paper profile it does nothing for an integer-exp head (``head``'s normaliser), whose row
    the :class:`RowNormaliser` takes. The unit's own backpressure holds the feed; it never stalls the output.
    Latency from ``start`` through ``done``: :meth:`row_cycles`.

    ``command`` (:func:`near_field_port`) lends the unit to the tile's HCCS command from the cycle after
    ``command.active`` rises until the cycle after it falls (never during a step): its beats go through the
    same register slice, ``cfg`` and ``o`` are the unit's own, and ``done`` and ``probs`` stay as they are.
    """

    def __init__(self, params: TileParams):
        self.params = params
        self.config = near_field_unit(params)
        self.row_beats = near_row_beats(params)
        super().__init__({
            "head": In(head_params_layout(params.profile)), "row": In(row_layout(params)), "start": In(1),
            "probs": Out(element_bits(params) * self.config.lanes * self.row_beats), "done": Out(1),
            "command": Out(near_field_port(params)),
        })

    @staticmethod
    def row_cycles(params: TileParams, hccs_mode: str = "div") -> int:
        """Cycles from the cycle after ``start`` through ``done``: the register slice and the unit's row (the
        wide normaliser's does not depend on the normaliser or ``hccs_mode``)."""
        if params.profile == "wide":
            return FEED_LATENCY + wide_unit.expected_cycles(near_field_unit(params), 1, params.slots)
        return FEED_LATENCY + hccs_unit.expected_cycles(near_field_unit(params), 1, params.slots, mode=hccs_mode,
                                                        out="uint8")

    def elaborate(self, platform):
        m = Module()
        par, unit_config, command = self.head, self.config, self.command
        bits = element_bits(self.params)
        # The command's active a cycle late, in a register beside the feed's slice it selects (from the tile's
        # sequencer it was the ULX3S tile's late path without rip-up at fa1df9c7, 9.2 ns of routing): the
        # command configures the unit CONFIGURE_LATENCY (2) cycles after it raises active. lent, a cycle later
        # still, sits beside the registers it gates (the step's probabilities and done): the unit's answers to
        # a command come many cycles after active rises, a step's many cycles after it falls.
        active = reg(m, command.active, "command_active", reset_less=False)
        lent = reg(m, active, "lent", reset_less=False)
        if self.params.profile == "wide":
            m.submodules.near_wide = near_unit = wide_unit.WideNormaliser(config=unit_config)
            feeds = Const(1)
            decode_cfg = Signal(near_unit.cfg.payload.shape())
            unit_params = [decode_cfg.params.code.eq(wide_code(par))]
        else:
            m.submodules.near_hccs = near_unit = hccs_unit.HCCS(config=unit_config)
            # From a register: par is sampled at the step's start, hundreds of cycles before this start; as a
            # comparison in front of cfg.valid it reached the unit's 29 head-parameter enables (the two-tile
            # ULX3S array's widest group of endpoints after 9 ns).
            feeds = reg(m, ~head_choice(par, "normaliser", "exp_int"), "feeds")
            decode_cfg = Signal(near_unit.cfg.payload.shape())
            unit_params = [decode_cfg.params.mode.eq(par["hccs_mode"]), decode_cfg.params.out.eq(hccs.OUT_UINT8)]
        hl, row_beats = unit_config.lanes, self.row_beats
        # Data registers without a reset (every slot is written in each step before it is read).
        row_bits = Signal(bits * hl * row_beats, reset_less=True)
        row_valid_bits = Signal(hl * row_beats, reset_less=True)
        prob_bits = Signal(bits * hl * row_beats, reset_less=True)
        m.d.comb += self.probs.eq(prob_bits)
        feed_beat = Signal(range(row_beats + 1))
        # The beat the unit returns next, one-hot: each word of prob_bits is enabled by one of its flip-flops
        # (decoded from a counter, the enables would not fit a cycle).
        drain_sel = Signal(row_beats)
        # SCORES's writes reach the row a cycle late, through copies of their registers, each beside the slots of
        # a group of beats: one write enable for every slot's register was the two-tile ULX3S array's late path
        # at 8cd4eb3 (row.we -> row_bits, 10.6 ns of routing). The last write (beside start: row.end) is in
        # the row two cycles after start; the feed takes the last beat, the only one it reaches, row_beats
        # cycles after start. A row of one beat is written directly.
        copies = min(ROW_WRITE_COPIES, row_beats) if row_beats >= 2 else 0
        if copies:
            late = {name: Replicated(self.row[name].shape(), copies, f"row_{name}_late")
                    for name in ("we", "index", "x", "valid")}
            for name, copy in late.items():
                m.d.sync += copy.eq(self.row[name])
            per_copy = -(-row_beats // copies) * hl
            for slot in range(hl * row_beats):
                c = slot // per_copy
                with m.If(late["we"].copy(c) & (late["index"].copy(c) == slot)):
                    m.d.sync += [row_bits.word_select(slot, bits).eq(late["x"].copy(c)),
                                 row_valid_bits[slot].eq(late["valid"].copy(c))]
        else:
            with m.If(self.row.we):
                m.d.sync += [row_bits.word_select(self.row.index, bits).eq(self.row.x),
                             row_valid_bits.bit_select(self.row.index, 1).eq(self.row.valid)]
        # The beats reach the unit through a register slice (FEED_LATENCY): the beat multiplexer, the
        # counter's comparisons and the choice between the step's row and the command's would otherwise sit in
        # front of the unit's first stage and its bank enables.
        feeding = Signal()
        # The beat's elements are selected in groups of lanes, each by a copy of feed_beat of its own (one index
        # steering every element's multiplexer would span the unit's row memory in one cycle).
        groups = min(hl, FEED_INDEX_COPIES)
        feed_index = Replicated(range(row_beats + 1), groups, "feed_index")
        group_bits = bits * hl // groups
        beat_bits = [row_bits[bits * hl * b:bits * hl * (b + 1)] for b in range(row_beats)]
        feed_data = Cat(*[Array(beat[g * group_bits:(g + 1) * group_bits] for beat in beat_bits)[feed_index.copy(g)]
                          for g in range(groups)])
        # The mask in the same groups, each by its copy (by feed_beat, it was the ULX3S tile's late path
        # feed_beat -> the slice's mask at 6db64c4).
        group_lanes = hl // groups
        valid_beats = [row_valid_bits[hl * b:hl * (b + 1)] for b in range(row_beats)]
        feed_mask = Cat(*[Array(beat[g * group_lanes:(g + 1) * group_lanes] for beat in valid_beats)[feed_index.copy(g)]
                          for g in range(groups)])
        step_beat = Cat(feed_data, feed_mask, feed_beat == 0, feed_beat == row_beats - 1)
        given = command.i.payload
        command_beat = Cat(given.data.as_value(), given.mask, given.first, given.last)
        feed_ready, feed_valid, fed = skid_buffer(m, Mux(active, command.i.valid, feeding),
                                                  Mux(active, command_beat, step_beat), near_unit.i.ready, "feed")
        m.d.comb += command.i.ready.eq(feed_ready & active)
        with m.If(feeding & feed_ready & ~active):
            m.d.sync += [feed_beat.eq(feed_beat + 1), *feed_index.increment()]
            with m.If(feed_beat == row_beats - 1):
                m.d.sync += feeding.eq(0)
        m.d.comb += [decode_cfg.head.eq(0), decode_cfg.params.B.eq(par["hccs_B"]),
                     decode_cfg.params.S.eq(par["hccs_S"]), decode_cfg.params.dmax.eq(par["hccs_dmax"]), *unit_params]
        m.d.comb += [near_unit.i.valid.eq(feed_valid), near_unit.i.payload.data.eq(fed[:bits * hl]),
                     near_unit.i.payload.mask.eq(fed[bits * hl:(bits + 1) * hl]),
                     near_unit.i.payload.first.eq(fed[(bits + 1) * hl]),
                     near_unit.i.payload.last.eq(fed[(bits + 1) * hl + 1]),
                     near_unit.i.payload.head.eq(0),
                     near_unit.cfg.payload.eq(Mux(active, command.cfg.payload, decode_cfg)),
                     near_unit.cfg.valid.eq(Mux(active, command.cfg.valid, self.start & feeds)),
                     command.cfg.ready.eq(near_unit.cfg.ready),
                     near_unit.o.ready.eq(~active | command.o.ready),
                     command.o.valid.eq(near_unit.o.valid & active), command.o.payload.eq(near_unit.o.payload),
                     self.done.eq(near_unit.o.valid & near_unit.o.payload.last & ~lent)]
        # The step's probabilities: the low element bits of each lane (a paper unit built for the command's
        # int16 output answers the step's uint8 heads zero-extended).
        step_probs = Cat(*[lane[:bits] for lane in near_unit.o.payload.data])
        with m.If(near_unit.o.valid & ~lent):
            m.d.sync += drain_sel.eq(drain_sel << 1)
            for j in range(row_beats):
                with m.If(drain_sel[j]):
                    m.d.sync += prob_bits.word_select(j, bits * hl).eq(step_probs)
        with m.If(self.start):  # after the counters' own updates, which it overrides
            m.d.sync += [feed_beat.eq(0), *feed_index.eq(0), drain_sel.eq(1), feeding.eq(feeds)]
        return m


class GateStage(wiring.Component):
    """The query gate, beside SCORES: ``z = q . G`` over the head_dim elements, then
    ``gate = sat(64 + rshift_round(z * gate_mult, gate_shift), 0, 128)``, 128 (:data:`soma.GATE_ONE`) when the
    head is ungated.

    ``restart`` (a pulse) sets the element counter to 0; each ``advance`` cycle issues the next element, read
    from q and the gate field through ``q`` and ``gate_field``; ``accumulate_item`` is the tag line 2 cycles
    after an element's issue. ``busy`` rises with ``restart`` and falls :data:`GATE_DEPTH` cycles after the last
    element's issue (``done_item``: the tag line there); ``latch`` (a pulse, after ``busy`` fell) moves the
    value into ``gate``, which holds it through the weighted sum and FINAL. One element per cycle.
    """

    def __init__(self, params: TileParams):
        self.params = params
        super().__init__({
            "head": In(head_params_layout(params.profile)), "restart": In(1), "advance": In(1), "latch": In(1),
            "accumulate_item": In(item_layout(params)), "done_item": In(item_layout(params)),
            "q": Out(RegisterFileRead(params, 8)), "gate_field": Out(RegisterFileRead(params, 16)),
            "busy": Out(1), "gate": Out(range(soma.GATE_ONE + 1)),
        })

    @staticmethod
    def cycles(params: TileParams) -> int:
        """From the first element's issue through the gate value's cycle before ``latch``."""
        return params.head_dim + GATE_DEPTH

    def elaborate(self, platform):
        m = Module()
        D, par = self.params.head_dim, self.head
        word_bits = 8 * self.params.word_bytes
        # The element issued in a copy per register file read. Two copies per register file: one addresses
        # its LUT RAM, one selects the element from the word read (one copy for both has too many loads to
        # reach in a cycle).
        gate_index = Replicated(range(D + 1), 4, "gate_index")
        with m.If(self.restart):
            m.d.sync += gate_index.eq(0)
        with m.If(self.advance):
            m.d.sync += gate_index.increment()
        s = 0
        reads = ((self.q, 8, "g_q"), (self.gate_field, 16, "g_f"))
        m.d.comb += [port.addr.eq(gate_index.copy(i) >> element_shift(word_bits, bits))
                     for i, (port, bits, _) in enumerate(reads)]
        g_q, g_f = (reg(m, element_of(port.data, gate_index.copy(i + 2), bits).as_signed(), name)
                    for i, (port, bits, name) in enumerate(reads))
        s += 1
        g_product = lut_mul_pipelined(m, g_f, g_q, "g_product", signed(24))
        s += 2
        z = Signal(signed(24 + (D - 1).bit_length() + 1))
        z_en, z_first = reg(m, self.accumulate_item.valid, "z_en", reset_less=False), \
            reg(m, self.accumulate_item.n == 0, "z_first")
        with m.If(z_en):
            m.d.sync += z.eq(Mux(z_first, 0, z) + g_product)
        s += 1
        gate_scaled = round_shift(m, split_mul(m, z, parameter_operand(m, par, "gate_mult"), "gate_product"),
                                  par["gate_shift"], soma.INT_SHIFT_MAX, "gate_scaled")
        s += 3 + 2
        assert s == GATE_DEPTH
        # sat(64 + x, 0, 128) as 64 + sat(x, -64, 64): the comparisons on the register, the adder on 8 bits.
        half = soma.GATE_ONE // 2
        gate_value = reg(m, half + saturate(gate_scaled, -half, half), "gate_value", range(soma.GATE_ONE + 1))
        gate, busy = Signal.like(self.gate), Signal()
        with m.If(self.restart):
            m.d.sync += busy.eq(1)
        with m.If(self.done_item.valid & self.done_item.last):
            m.d.sync += busy.eq(0)
        with m.If(self.latch):
            m.d.sync += gate.eq(Mux(head_choice(par, "gating", "query"), gate_value, soma.GATE_ONE))
        m.d.comb += [self.gate.eq(gate), self.busy.eq(busy)]
        return m


class WeightedStage(wiring.Component):
    """WEIGHTED SUM's datapath: ``acc[l] = sum_n P[n] * V[n][c * L + l]`` over the slots, for chunk c (its items' tags)
    of the values, ``mac_lanes`` MACs per cycle; P uint8 (paper) or Q15 uint16 (wide).

    One slot per cycle: slot n's value word arrives in ``v_word`` :data:`READ_LATENCY` cycles after its address
    (``n_issue``, the slot issued, and the tag line's items at ``READ_LATENCY - 2``, ``READ_LATENCY - 1``,
    ``WEIGHTED_DEPTH - 1`` and ``WEIGHTED_DEPTH``); its probability comes from ``probs`` (the
    :class:`NearFieldFeed`'s elements), or in the paper profile for an integer-exp head from the
    :class:`RowNormaliser` (``prob_index -> prob``, one-cycle read; the wide profile has no such ports).
    ``acc`` holds the chunk's sums from the cycle after its ``chunk_done`` (high as the last slot's product is
    added, :data:`WEIGHTED_DEPTH` cycles after its issue) until the cycle after the next chunk's ``chunk_done``:
    the accumulators of the next chunk run beside it, so FINAL reads a chunk's sums while the next chunk's
    weighted sum runs (:func:`final_overlaps`). The chunk of a value word is the one its item's tags name (the
    ``prob_item`` tag line), so a chunk's first slot may be issued in the cycle after the previous chunk's last.
    """

    def __init__(self, params: TileParams):
        self.params = params
        item = item_layout(params)
        ports = {
            "head": In(head_params_layout(params.profile)), "n_issue": In(issue_shape(params)),
            "prob_address_item": In(item), "prob_item": In(item),
            "accumulate_item": In(item), "done_item": In(item),
            "probs": In(element_bits(params) * near_field_unit(params).lanes * near_row_beats(params)),
            "v_word": In(8 * params.word_bytes),
            "acc": Out(data.ArrayLayout(signed(32), params.mac_lanes)), "chunk_done": Out(1),
        }
        if params.profile == "paper":
            ports.update(prob_index=Out(range(params.slots)), prob=In(16))
        super().__init__(ports)

    @staticmethod
    def cycles(params: TileParams) -> int:
        """One chunk's WEIGHTED SUM, from its first slot's issue through its last product's sum."""
        return params.slots + WEIGHTED_DEPTH

    def elaborate(self, platform):
        m = Module()
        p, L = self.params, self.params.mac_lanes
        bits = element_bits(p)
        n_prob_read = self.prob_item.n
        # The near-field probability of slot n in two registered steps (a group of 8 slots addressed a stage
        # early, then the slot): in one step, a 72:1 byte select behind the tag line's index does not fit a cycle.
        group_bits = 3
        # n_group: the n of at(READ_LATENCY - 2) in registers of its own (the tag line's reaches many loads), a
        # copy for each share of the group's bits (one index steering all of their multiplexers was the ULX3S
        # tile's third-longest path).
        assert READ_LATENCY - 2 == 1
        group_width = bits << group_bits
        padded = Cat(self.probs, Const(0, -len(self.probs) % group_width))
        shares = PROB_GROUP_COPIES
        share_bits = group_width // shares
        n_group = Replicated(range(len(padded) // group_width), shares, "prob_group_index")
        m.d.sync += n_group.eq(self.n_issue >> group_bits)
        prob_group = Signal(group_width, name="prob_group", reset_less=True)
        for share in range(shares):
            choices = Array(padded[g * group_width + share * share_bits:][:share_bits]
                            for g in range(len(padded) // group_width))
            m.d.sync += prob_group[share * share_bits:(share + 1) * share_bits].eq(choices[n_group.copy(share)])
        prob_reg = reg(m, prob_group.word_select(n_prob_read[:group_bits], bits), "prob_bits_sel")
        # The probability in one copy per value lane (each copy feeds one multiplier).
        prob = Replicated(unsigned(bits), L, "prob")
        if p.profile == "paper":
            # The normaliser's probability (a block RAM, over half a cycle from clock to output on the ECP5) is
            # addressed a cycle earlier and registered as it leaves the RAM.
            m.d.comb += self.prob_index.eq(self.prob_address_item.n)
            n_prob = reg(m, self.prob[:8], "n_prob")
            m.d.sync += prob.eq(Mux(head_choice(self.head, "normaliser", "exp_int"), n_prob, prob_reg))
        else:
            m.d.sync += prob.eq(prob_reg)
        # The word's chunk from the item's tags (a copy of the tag line's for the value lanes), not from the
        # issue counter: the next chunk's issue begins while this chunk's last words are still being read.
        s = READ_LATENCY
        v_group = reg(m, lane_group(self.v_word, reg(m, self.prob_item.c, "c_group"), p), "v_group")
        s += 1
        if p.profile == "paper":
            products = [lut_mul_pipelined(m, v_group.word_select(l, 8).as_signed(), prob.copy(l), f"pv{l}",
                                          signed(17)) for l in range(L)]
        else:
            # One partial product per bit of the int8 value (the sign bit's subtracted) rather than per bit of
            # the 16-bit probability: the same adder levels as the paper's.
            products = [lut_mul_pipelined(m, prob.copy(l), v_group.word_select(l, 8).as_signed(), f"pv{l}",
                                          signed(bits + 9)) for l in range(L)]
        s += 2
        assert s == WEIGHTED_DEPTH
        lane_acc = [Signal(signed(32), name=f"lane_acc{l}", reset_less=True) for l in range(L)]
        # The accumulators' enable and clear are registered one stage early, a copy per lane: decoded from the
        # tag line in the same cycle they reached 256 flip-flop enables across the die.
        w_en, w_first = Replicated(1, L, "w_en"), Replicated(1, L, "w_first")
        w_last = Replicated(1, L, "w_last")
        m.d.sync += [*w_en.eq(self.accumulate_item.valid), *w_first.eq(self.accumulate_item.n == 0),
                     *w_last.eq(self.accumulate_item.last)]
        # The chunk's sums, loaded from the accumulator's adder with its last product (the accumulator itself
        # restarts with the next chunk's first slot while FINAL still reads these).
        held = [Signal(signed(32), name=f"chunk_acc{l}", reset_less=True) for l in range(L)]
        for l in range(L):
            total = Signal(signed(32), name=f"lane_total{l}")
            m.d.comb += total.eq(Mux(w_first.copy(l), 0, lane_acc[l]) + products[l])
            with m.If(w_en.copy(l)):
                m.d.sync += lane_acc[l].eq(total)
                with m.If(w_last.copy(l)):
                    m.d.sync += held[l].eq(total)
        m.d.comb += [self.acc[l].eq(held[l]) for l in range(L)]
        m.d.comb += self.chunk_done.eq(w_en.copy(0) & self.done_item.last)
        return m


class OutputStage(wiring.Component):
    """FINAL's near and far terms and the output: for element ``d = c * L + e`` (e the lane issued),
    ``out = sat(sat16(rshift_round(acc[e] * out_mult, out_shift)) + sat16(rshift_round(F[d] * alpha_mult *
    gate, alpha_shift + 7)))`` to int8, or to int16 in the wide profile, written into the output register file
    (``out_write``) :data:`FINAL_DEPTH` cycles after the element's issue.

    ``d_restart`` sets the element counter to 0 (once per step, before the first chunk), ``lane_restart`` the
    lane counter (once per chunk); each ``advance`` cycle issues the next element. Reads the element of the
    field, the gate field, k and v (``field``, ``gate_field``, ``k``, ``v``) and hands the field update its
    operands, registered one cycle after the issue (``f_old``, ``g_old``, ``k_d``) and two (``src``: k or v,
    the head's field source). ``acc`` and ``gate`` are constant while a chunk's elements run. The tag line's
    items at ``FINAL_DEPTH - 1`` (``write_item``) and ``FINAL_DEPTH`` (``element_item``) steer the write;
    ``end`` is high from the cycle the last chunk's last element is written.

    One element per cycle: element ``offset`` of each group of :func:`element_lanes` issued together (the
    decode unit has one stage per element of the group; the tags' n counts groups).
    """

    def __init__(self, params: TileParams, offset: int = 0):
        self.params, self.offset = params, offset
        item = item_layout(params)
        super().__init__({
            "head": In(head_params_layout(params.profile)), "d_restart": In(1), "lane_restart": In(1),
            "advance": In(1),
            "acc": In(data.ArrayLayout(signed(32), params.mac_lanes)), "gate": In(range(soma.GATE_ONE + 1)),
            "field": Out(RegisterFileRead(params, 16)), "gate_field": Out(RegisterFileRead(params, 16)),
            "k": Out(RegisterFileRead(params, 8)), "v": Out(RegisterFileRead(params, 8)),
            "f_old": Out(signed(16)), "g_old": Out(signed(16)), "k_d": Out(signed(8)), "src": Out(signed(8)),
            "write_item": In(item), "element_item": In(item),
            "out_write": Out(element_write_layout(params, signed(element_bits(params)))), "end": Out(1),
        })

    @staticmethod
    def chunk_cycles(params: TileParams) -> int:
        """FINAL's issue of one chunk's elements, :func:`element_lanes` a cycle (their pipeline drains during the
        next chunk's weighted sum)."""
        return params.mac_lanes // element_lanes(params)

    def elaborate(self, platform):
        m = Module()
        p, par = self.params, self.head
        D, L, word_bits = p.head_dim, p.mac_lanes, 8 * p.word_bytes
        # d_issue (the element issued) is kept as two copies per register file read (one addresses the LUT RAM,
        # one is registered beside the word read to select the element from it a cycle later: the address
        # copies carry nothing but the LUT RAM's address loads), and
        # the lane issued as a counter of its own: each addresses a few hundred LUT RAM cells
        # or a 32-bit multiplexer.
        group = element_lanes(p)
        d_issue = Replicated(range(D + group), 8, "d_issue")
        fin_lane = Signal(max(1, (L - 1).bit_length()))
        with m.If(self.d_restart):
            m.d.sync += d_issue.eq(self.offset)
        with m.If(self.lane_restart):
            m.d.sync += fin_lane.eq(self.offset)
        with m.If(self.advance):
            m.d.sync += [fin_lane.eq(fin_lane + group), *d_issue.increment(group)]
        s = 0
        acc_sel = reg(m, Array(self.acc[l] for l in range(L))[fin_lane], "acc_sel")
        # Element d_issue of the fields, k and v: each word read is registered as it leaves the LUT RAM, and
        # the element is selected from it a cycle later (by d_issue's low bits, registered beside it). The
        # read and the selection in one cycle were the ULX3S tile's longest path (d_issue -> v_d, mostly
        # routing between the LUT RAM cells and the FINAL pipeline).
        reads = ((self.field, 16), (self.gate_field, 16), (self.k, 8), (self.v, 8))
        m.d.comb += [port.addr.eq(d_issue.copy(i) >> element_shift(word_bits, bits))
                     for i, (port, bits) in enumerate(reads)]
        f_old, g_old, k_elem, v_elem = (
            element_of(reg(m, port.data, f"{name}_word"), reg(m, d_issue.copy(i + 4), f"{name}_element"),
                       bits).as_signed()
            for i, ((port, bits), name) in enumerate(zip(reads, ("f", "g", "k", "v"))))
        f_old, g_old = reg(m, f_old, "f_old"), reg(m, g_old, "g_old")
        k_d, v_d = reg(m, k_elem, "k_d"), reg(m, v_elem, "v_d")
        # The field's source selected from the registered elements, a stage after f_old (the field update
        # delays it one register less): behind the LUT RAM reads, the selection would not fit the cycle.
        src = reg(m, Mux(head_choice(par, "field_source", "keys"), k_d, v_d), "src")
        m.d.comb += [self.f_old.eq(f_old), self.g_old.eq(g_old), self.k_d.eq(k_d), self.src.eq(src)]
        s += 2
        # Both round-shifts in two steps: a 6-bit amount in one barrel shifter was the ULX3S tile's late path
        # (near_scaled_amount -> near_scaled at 90b7896, far_scaled_amount -> far_scaled at d85ab8a; seed 2).
        near = round_shift(m, split_mul(m, acc_sel, parameter_operand(m, par, "out_mult"), "near_product"),
                           par["out_shift"], soma.INT_SHIFT_MAX, "near_scaled", steps=2)
        near = delay(m, reg(m, saturate(near, -32768, 32767), "near", signed(17)), 2)
        s += 3 + 3 + 1 + 1
        far_f = reg(m, reg(m, f_old, "far_f_a") * parameter_operand(m, par, "alpha_mult"), "far_f", signed(32))
        # Sums of parameters are registered (the parameters are constant from start on): an adder in front of
        # a shifter or a multiplier would be two slow steps in one cycle.
        alpha_shift = reg(m, par["alpha_shift"] + 7, "alpha_shift_7")
        far = round_shift(m, split_mul(m, far_f, self.gate, "far_product"), alpha_shift,
                          soma.INT_SHIFT_MAX + 7, "far_scaled", steps=2)
        far = reg(m, saturate(far, -32768, 32767), "far", signed(17))
        # sat(near + far) with its bounds moved onto near a stage early: near + far > hi is far > hi - near
        # (registered beside far), so the comparisons run beside the output-wide sum rather than after an
        # 18-bit one.
        lo, hi = LIMITS[p.profile]["out"]
        above, below = (reg(m, bound - near, f"out_{name}", signed(18))
                        for bound, name in ((hi, "above"), (lo, "below")))
        near = reg(m, near, "near_final")
        s += 1
        out_shape = self.out_write.value.shape()
        out_element = reg(m, Mux(far > above, hi, Mux(far < below, lo, (near + far)[:out_shape.width])),
                          "out_element", out_shape)
        s += 1
        assert s == FINAL_DEPTH
        # The output elements' enable (and FINAL's end, the last element's output) from registers set a stage
        # early; the element d = c * L + n of the item's tags (L a power of two: TileParams checks it).
        w = self.write_item
        m.d.comb += [self.out_write.en.eq(reg(m, w.valid, "out_write", reset_less=False)),
                     self.out_write.element.eq(element_index(self.element_item, p, self.offset)),
                     self.out_write.value.eq(out_element),
                     self.end.eq(reg(m, w.valid & w.last & (w.c == p.head_dim // L - 1), "final_end",
                                     reset_less=False))]
        return m


def element_index(item, params: TileParams, offset: int = 0):
    """The element d = c * L + n * E + offset of a FINAL item's tags, E = :func:`element_lanes` (the group n
    of chunk c; L and E powers of two: TileParams checks L)."""
    group = element_lanes(params)
    lane_bits = (params.mac_lanes // group - 1).bit_length()
    parts = [Const(offset, (group - 1).bit_length())] if group > 1 else []
    return Cat(*parts, item.n[:lane_bits], item.c)


class FieldUpdate(wiring.Component):
    """FINAL's field updates: ``F <- rshift_round(gamma F + (2^15 - gamma)(x << 7), 15)`` for the field
    (x: the head's field source, ``src``) and, when the head is gated, the gate field (x: ``k_d``), written into
    their register files (``field_write``, ``gate_write``) :data:`FIELD_DEPTH` cycles after the element's issue.

    The operands come from the :class:`OutputStage` (``f_old``, ``g_old`` and ``k_d`` one cycle after the
    element's issue, ``src`` two); ``write_item`` and ``element_item`` are the tag line at ``FIELD_DEPTH - 1``
    and ``FIELD_DEPTH``. One element per cycle: element ``offset`` of each group (:class:`OutputStage`).
    """

    def __init__(self, params: TileParams, offset: int = 0):
        self.params, self.offset = params, offset
        item = item_layout(params)
        super().__init__({
            "head": In(head_params_layout(params.profile)), "f_old": In(signed(16)), "g_old": In(signed(16)),
            "k_d": In(signed(8)), "src": In(signed(8)), "write_item": In(item), "element_item": In(item),
            "field_write": Out(element_write_layout(params, 16)), "gate_write": Out(element_write_layout(params, 16)),
        })

    def update(self, m, f, x, name, x_delay=2):
        """F <- rshift_round(gamma F + (2^15 - gamma)(x << 7), 15): operands (2), products (1), products
        again (1), sum and rounding (1). ``x`` may arrive ``2 - x_delay`` cycles after ``f``."""
        # 2^15 - gamma is a register of its own per update, beside its multiplier. Two registers on each
        # side of the DSP block: with one, nextpnr may place them far from the block on either side; the
        # second lets the placer split each route.
        par = self.head
        gamma_rest = reg(m, soma.GAMMA_Q15_ONE - par["gamma_q15"], f"{name}_gamma_rest")
        f, x = (delay(m, v, n, f"{name}_{v_name}") for v, v_name, n in ((f, "f", 2), (x, "x", x_delay)))
        kept = delay(m, parameter_operand(m, par, "gamma_q15") * f, 2, f"{name}_kept")
        added = delay(m, gamma_rest * (x << soma.FIELD_FRAC_BITS), 2, f"{name}_added")
        return reg(m, (kept + added + (1 << 14)) >> 15, f"{name}_new", signed(20))[:16]

    def elaborate(self, platform):
        m = Module()
        f_new = self.update(m, self.f_old, self.src, "field", x_delay=1)
        g_new = self.update(m, self.g_old, self.k_d, "gate_field")
        assert 2 + 2 + 2 + 1 == FIELD_DEPTH  # the word's and f_old's registers, then the update's
        # The enables from registers set a stage early; the gate field's in a register of its own, gating
        # included (it steers the LUT RAM's write address between LOAD's words and FINAL's elements).
        element = element_index(self.element_item, self.params, self.offset)
        m.d.comb += [self.field_write.en.eq(reg(m, self.write_item.valid, "fin_write", reset_less=False)),
                     self.gate_write.en.eq(reg(m, self.write_item.valid & head_choice(self.head, "gating", "query"),
                                               "gate_write", reset_less=False)),
                     self.field_write.element.eq(element), self.gate_write.element.eq(element),
                     self.field_write.value.eq(f_new), self.gate_write.value.eq(g_new)]
        return m


def output_words(params: TileParams) -> int:
    """Local-memory words of one head's output (``regmap.decode_out_bytes``: int8, or int16 in the wide
    profile, little-endian, element d at bytes ``d * element_bytes`` on from ``out_base``)."""
    return regmap.decode_out_bytes(params) // params.word_bytes


def word_write_layout(params: TileParams, bits: int) -> data.StructLayout:
    """One word written into a register file of head_dim elements of ``bits`` bits (:meth:`ElementRam.write_word`):
    enable, word address, word."""
    words = params.head_dim * bits // (8 * params.word_bytes)
    return data.StructLayout({"en": 1, "addr": range(words), "data": 8 * params.word_bytes})


def slot_regions_layout(mem_words: int) -> data.StructLayout:
    """The local-memory word of the first slot of each of the head's four slot regions."""
    return data.StructLayout({region: range(mem_words) for region in ("sink_k", "ring_k", "sink_v", "ring_v")})


class StateMover(wiring.Component):
    """LOAD, WRITE and STORE: a head's state and its q, k, v between the tile's local memory and the decode unit's
    register files and counters (steps 1, 2 and 6 of the module docstring).

    The sequencer starts a phase with its ``begin_*`` pulse (the cycle before the phase's first) and holds the
    phase's level (``loading``, ``writing``, ``storing``) through its last cycle, which the unit marks:

    - LOAD (:meth:`load_cycles`, ``load_done`` in the last): 3 w words of q, k, v from ``stage_base`` (sampled at
      ``begin_load``), then the gate field (2 w) and the counters (one word) from the state; each word goes,
      :data:`READ_LATENCY` cycles after its address, into its register file (``q_load`` ... ``gate_field_load``,
      :func:`word_write_layout`) or into ``counters``. The field's 2 w words follow ``begin_field`` (a pulse,
      one word a cycle into ``field_load``) in a phase of their own: the sequencer sends it as NORMALISE begins,
      when the read port is idle, and the field is first read in FINAL, after a weighted sum. ``field_busy``
      is high from the cycle after ``begin_field`` through the cycle its last word arrives.
    - WRITE (:meth:`write_cycles`, ``write_last`` in the last): k and v (read through ``k``, ``v``) into the next
      sink slot while step < sinks, else the ring's slot ``write_pos``; the counters advance in the last cycle
      (write_pos and fill only past the sinks, every count saturating as ``soma.COUNTER_MAX`` says).
    - STORE (:meth:`store_cycles`, ``store_done`` in the last): the field, the gate field (through ``field``,
      ``gate_field``) and the counters to consecutive state words from the field's, then the output (through
      ``out``, :func:`output_words`) from ``out_base``; ``wr_out`` marks the output's words.

    - ``take`` (a pulse) sets the counters to ``counters_in``: a mover that does not LOAD (the decode unit's
      second, for the WRITE and STORE of the head whose LOAD the first did) takes them from the first.

    ``state_base`` and ``out_base`` are held from ``begin_load`` (or ``take``) through STORE. The memory ports (``rd_addr``,
    ``wr_addr/wr_data/wr_en``) are the next values of the unit's port registers, 0 outside the phases;
    ``rd_word`` is the word read :data:`READ_LATENCY` cycles after its address. ``rows`` (:func:`slot_regions_layout`)
    names the slot regions' first words, ``counters`` the head's counters from LOAD's end on. One word per
    cycle; no backpressure. LOAD and STORE count their words with one counter.
    """

    def __init__(self, params: TileParams, mem_words: int):
        self.params, self.mem_words = params, mem_words
        word_bits = 8 * params.word_bytes
        super().__init__({
            "begin_load": In(1), "begin_field": In(1), "begin_write": In(1), "begin_store": In(1),
            "loading": In(1), "writing": In(1), "storing": In(1),
            "load_done": Out(1), "write_last": Out(1), "store_done": Out(1),
            "state_base": In(range(mem_words)), "stage_base": In(range(mem_words)), "out_base": In(range(mem_words)),
            "rd_addr": Out(range(mem_words)), "rd_word": In(word_bits),
            "wr_addr": Out(range(mem_words)), "wr_data": Out(word_bits), "wr_en": Out(params.word_bytes),
            "wr_out": Out(1),
            "counters": Out(COUNTERS_LAYOUT), "rows": Out(slot_regions_layout(mem_words)),
            "take": In(1), "counters_in": In(COUNTERS_LAYOUT), "field_busy": Out(1),
            "q_load": Out(word_write_layout(params, 8)), "k_load": Out(word_write_layout(params, 8)),
            "v_load": Out(word_write_layout(params, 8)), "field_load": Out(word_write_layout(params, 16)),
            "gate_field_load": Out(word_write_layout(params, 16)),
            "k": Out(RegisterFileRead(params, 8)), "v": Out(RegisterFileRead(params, 8)),
            "field": Out(RegisterFileRead(params, 16)), "gate_field": Out(RegisterFileRead(params, 16)),
            "out": Out(RegisterFileRead(params, element_bits(params))),
        })

    @staticmethod
    def load_cycles(params: TileParams) -> int:
        """LOAD: 5 w + 1 addresses (w = head_dim / word), the last word's read, and the cycle that ends it (the
        field's 2 w words are loaded during NORMALISE)."""
        return 5 * (params.head_dim // params.word_bytes) + 2 + READ_LATENCY

    @staticmethod
    def write_cycles(params: TileParams) -> int:
        """WRITE: the 2 w words of k and v."""
        return 2 * (params.head_dim // params.word_bytes)

    @staticmethod
    def store_cycles(params: TileParams) -> int:
        """STORE: the field and gate field (4 w words), the counters' word and the output's words."""
        return 4 * (params.head_dim // params.word_bytes) + 1 + output_words(params)

    def elaborate(self, platform):
        m = Module()
        p = self.params
        layout = {name: offset // p.word_bytes for name, offset, _, _ in regmap.state_layout(p)}
        write_pos, fill, step = Signal(32, name="write_pos"), Signal(32, name="fill"), Signal(32, name="step")
        m.d.comb += self.counters.eq(Cat(write_pos, fill, step))
        with m.If(self.take):
            m.d.sync += [write_pos.eq(self.counters_in.write_pos), fill.eq(self.counters_in.fill),
                         step.eq(self.counters_in.step)]
        for region in ("sink_k", "ring_k", "sink_v", "ring_v"):
            m.d.comb += self.rows[region].eq(reg(m, self.state_base + layout[region], f"{region}_row",
                                                 range(self.mem_words)))
        state_row = reg(m, self.state_base + layout["field"], "state_row", range(self.mem_words))
        self.gate_row = reg(m, self.state_base + layout["gate_field"], "gate_row", range(self.mem_words))
        # LOAD's count ends at load_cycles - 1, STORE's after its last word at store_cycles.
        counter = Signal(range(max(self.load_cycles(p) - 1, self.store_cycles(p)) + 1))
        self.load(m, counter, state_row, (write_pos, fill, step))
        # wr_data: the one source whose select register is set (each is 0 outside its phase), as an AND-OR
        # rather than a priority chain of multiplexers behind the state machine (store_sel -> wr_data through
        # that chain was late on the ULX3S tile).
        sources = self.write(m, (write_pos, fill, step)) + self.store(m, counter, state_row)
        m.d.comb += self.wr_data.eq(functools.reduce(operator.or_, (Mux(sel, word, 0) for sel, word in sources)))
        return m

    def load(self, m, counter, state_row, counters):
        """LOAD reads two runs of consecutive addresses (from stage_base, then from the gate field's), so the
        address advances in a register; the field's run follows begin_field. The word addressed in cycle i
        arrives in cycle i + READ_LATENCY with a one-hot tag naming its register file (None: the counters); each
        file's words arrive in order and are written at load_word, which restarts at 0 after a file's last
        word."""
        words = self.params.head_dim // self.params.word_bytes
        targets = [(self.q_load, words), (self.k_load, words), (self.v_load, words), (self.field_load, 2 * words),
                   (self.gate_field_load, 2 * words), None]
        load_targets = [0] * words + [1] * words + [2] * words + [4] * (2 * words) + [5]
        load_addr = Signal(range(self.mem_words))
        load_word = Signal(range(2 * words))
        with m.If(self.begin_load):
            m.d.sync += [counter.eq(0), load_addr.eq(self.stage_base), load_word.eq(0)]
        load_tag = Signal(len(targets))
        arrived = delay(m, load_tag, READ_LATENCY, "load_tag", reset_less=False)
        for index, target in enumerate(targets):
            with m.If(arrived[index]):
                if target is None:
                    m.d.sync += [c.eq(self.rd_word[32 * i:32 * (i + 1)]) for i, c in enumerate(counters)]
                else:
                    port, file_words = target
                    m.d.comb += [port.en.eq(1), port.addr.eq(load_word), port.data.eq(self.rd_word)]
                    m.d.sync += load_word.eq(Mux(load_word == file_words - 1, 0, load_word + 1))
        with m.If(self.loading):
            with m.Switch(counter):
                for i, target in enumerate(load_targets):
                    with m.Case(i):
                        m.d.comb += [self.rd_addr.eq(load_addr), load_tag.eq(1 << target)]
            m.d.sync += [counter.eq(counter + 1),
                         load_addr.eq(Mux(counter == 3 * words - 1, self.gate_row, load_addr + 1))]
            m.d.comb += self.load_done.eq(counter == len(load_targets) + READ_LATENCY)
        # The field's run: 2 w addresses from the field's first word, one a cycle, with its own count (LOAD's
        # counter is STORE's too).
        field_left = Signal(range(2 * words + 1))
        field_addr = Signal(range(self.mem_words))
        with m.If(self.begin_field):
            m.d.sync += [field_left.eq(2 * words), field_addr.eq(state_row)]
        with m.If(field_left != 0):
            m.d.comb += [self.rd_addr.eq(field_addr), load_tag.eq(1 << 3)]
            m.d.sync += [field_left.eq(field_left - 1), field_addr.eq(field_addr + 1)]
        # field_busy: from begin_field through the cycle the field's last word arrives (a register).
        with m.If(self.begin_field):
            m.d.sync += self.field_busy.eq(1)
        with m.If(arrived[3] & (load_word == 2 * words - 1)):
            m.d.sync += self.field_busy.eq(0)

    def write(self, m, counters):
        """WRITE: the slot's addresses (both candidates and the comparison in registers, valid in WRITE: LOAD
        ends one cycle after the counters arrive, so that no comparison sits in front of the address adders),
        k and v read a cycle ahead (write_read: 0 outside WRITE, write_slot_word + 1 in it) into registers, so
        that the word written is one AND away from wr_data: write_k and write_v, set the cycle before, name the
        source (decoded from the counter, the selection would not fit the cycle). Returns wr_data's (select,
        source) pairs."""
        p = self.params
        words, sinks, ring = p.head_dim // p.word_bytes, p.sinks, p.ring
        write_pos, fill, step = counters
        write_slot_word = Signal(range(2 * words + 1))
        write_last = Signal()  # write_slot_word == 2 * words - 1, set the cycle before
        in_sink = reg(m, step < sinks, "in_sink")

        def slot_row(region):
            ring_row = reg(m, self.rows[f"ring_{region}"] + write_pos * words, f"slot_ring_{region}",
                           range(self.mem_words))
            if not sinks:
                return ring_row
            sink_row = reg(m, self.rows[f"sink_{region}"] + step * words, f"slot_sink_{region}",
                           range(self.mem_words))
            return Mux(in_sink, sink_row, ring_row)
        slot_k, slot_v = slot_row("k"), slot_row("v")
        write_read = OffsetCounter(write_slot_word.shape(), (0, words), "write_read")
        k_write, v_write = (reg(m, port.data, f"{name}_write_word")
                            for port, name in ((self.k, "k"), (self.v, "v")))
        m.d.comb += [self.k.addr.eq(write_read.at(0)), self.v.addr.eq(write_read.at(1))]
        write_k, write_v = Signal(), Signal()  # wr_data's source in the next WRITE cycle (0 outside WRITE)
        # The counters' comparisons in registers (32-bit comparisons in front of their enables would not fit a
        # cycle): LOAD writes the counters at least three cycles before WRITE's last cycle advances them.
        pos_wraps, filling, counting = reg(m, Cat(write_pos == ring - 1, fill < ring, step < soma.COUNTER_MAX),
                                           "counter_flags")
        with m.If(self.begin_write):
            m.d.sync += [write_slot_word.eq(0), write_last.eq(0), write_k.eq(1), write_v.eq(0), *write_read.set(1)]
        with m.If(self.writing):
            with m.Switch(write_slot_word):
                for i in range(2 * words):
                    with m.Case(i):
                        m.d.comb += [self.wr_addr.eq(slot_k + i if i < words else slot_v + i - words),
                                     self.wr_en.eq((1 << p.word_bytes) - 1)]
            m.d.comb += self.write_last.eq(write_last)
            m.d.sync += [write_slot_word.eq(write_slot_word + 1), *write_read.increment(),
                         write_last.eq(write_slot_word == 2 * words - 2),
                         write_k.eq(write_slot_word < words - 1),
                         write_v.eq((write_slot_word >= words - 1) & ~write_last)]
            with m.If(write_last):
                m.d.sync += write_read.set(0)
                with m.If(~in_sink):
                    m.d.sync += [write_pos.eq(Mux(pos_wraps, 0, write_pos + 1)),
                                 fill.eq(Mux(filling, fill + 1, fill))]
                m.d.sync += step.eq(Mux(counting, step + 1, step))
        return [(write_k, k_write), (write_v, v_write)]

    def store(self, m, counter, state_row):
        """STORE: the address advances in a register; the source is named by a one-hot register set the cycle
        before (not decoded from the counter). The register files are read a cycle ahead, at store_read (0
        outside STORE, counter + 1 in it), into registers; the word for `counter` is then one AND away from
        wr_data. Returns wr_data's (select, source) pairs."""
        p = self.params
        words = p.head_dim // p.word_bytes
        store_rams = ((self.field, 0), (self.gate_field, 2 * words), (self.out, 4 * words + 1))
        store_read = OffsetCounter(counter.shape(), [offset for _, offset in store_rams], "store_read")
        store_words = []
        for i, (port, _) in enumerate(store_rams):
            m.d.comb += port.addr.eq(store_read.at(i))
            store_words.append(reg(m, port.data, f"store_word{i}"))
        store_groups = [store_words[0], store_words[1], self.counters.as_value(), store_words[2]]
        store_sources = [0] * (2 * words) + [1] * (2 * words) + [2] + [3] * output_words(p)
        assert len(store_sources) == self.store_cycles(p)
        store_sel = Signal(len(store_groups))
        store_addr = Signal(range(self.mem_words))
        with m.If(self.begin_store):
            m.d.sync += [counter.eq(0), *store_read.set(1), store_addr.eq(state_row),
                         store_sel.eq(1 << store_sources[0])]
        with m.If(self.storing):
            m.d.comb += [self.wr_addr.eq(store_addr), self.wr_en.eq((1 << p.word_bytes) - 1)]
            with m.Switch(counter):
                for i in range(len(store_sources)):
                    with m.Case(i):
                        following = store_sources[i + 1] if i + 1 < len(store_sources) else None
                        m.d.sync += store_sel.eq(0 if following is None else 1 << following)
            m.d.sync += [counter.eq(counter + 1), *store_read.increment(),
                         store_addr.eq(Mux(counter == 4 * words, self.out_base, store_addr + 1))]
            with m.If(counter == len(store_sources) - 1):
                m.d.sync += store_read.set(0)
                m.d.comb += self.store_done.eq(1)
        m.d.comb += self.wr_out.eq(self.storing & store_sel[3])
        # STORE's data: word `counter` of the stored sequence, from the source store_sel names.
        return list(zip(store_sel, store_groups))


MAC_LANES_PER_ELEMENT = 8
"""The decode unit's per-element work runs one element a cycle per this many MAC lanes (:func:`element_lanes`)."""


def element_lanes(params: TileParams) -> int:
    """Elements a cycle of the decode unit's per-element work, one per :data:`MAC_LANES_PER_ELEMENT` MAC lanes
    (one at 8 lanes or fewer, eight at the Versal boards' 64): FINAL (``mac_lanes`` elements a chunk, each about
    five multiplications: one :class:`OutputStage` and :class:`FieldUpdate` per element, side by side) and the
    exp-only :class:`RowNormaliser`'s SUM pass (``sinks + ring`` elements, three multiplications each), so that
    neither grows with the MAC array's width into a per-head overhead beside SCORES and WEIGHTED SUM."""
    return max(1, params.mac_lanes // MAC_LANES_PER_ELEMENT)


def final_overlaps(params: TileParams) -> bool:
    """Whether the chunks' WEIGHTED SUMs run back to back, each chunk's FINAL beside the next chunk's weighted
    sum: a chunk's first slot is issued in the cycle after the previous chunk's last, so the next chunk's sums
    replace a chunk's ``sinks + ring`` cycles after its end, and FINAL's issues of the chunk's ``mac_lanes``
    elements (:meth:`OutputStage.chunk_cycles`, reading the chunk's sums in ``WeightedStage.acc``) must fit in
    them. Otherwise each chunk's weighted sum waits for the previous chunk's sums and its FINAL issue."""
    return OutputStage.chunk_cycles(params) <= params.slots


def normalise_row_cycles(params: TileParams, normaliser: str = "hccs_int", hccs_mode: str = "div") -> int:
    """The normaliser's row latency in NORMALISE (:func:`decode_phases`' N): :meth:`NearFieldFeed.row_cycles`
    for every head of the wide profile and the paper's HCCS heads, :func:`normaliser_lead_cycles` for the
    paper's integer exp."""
    if params.profile == "wide" or normaliser == "hccs_int":
        return NearFieldFeed.row_cycles(params, hccs_mode)
    return normaliser_lead_cycles(params.slots, exp_only=True, sum_lanes=element_lanes(params))


def decode_phases(params: TileParams, normaliser: str = "hccs_int", hccs_mode: str = "div") -> dict[str, int]:
    """Cycles of each phase of one head's decode step in :class:`SomaDecode` (load, write, scores, normalise,
    weighted, final, store, done; their sum is :func:`expected_cycles`), for a head with this normaliser (and
    HCCS mode).

    Depends on ring, sinks, head_dim, lanes (``mac_lanes = min(lanes, head_dim)`` and the local-memory word
    ``max(16, mac_lanes)`` bytes), hccs_lanes, the profile and (paper) the normaliser only; not on the sequence
    position or the fill level. Each phase is the latency its stage states: LOAD ``5 w + 5``
    (w = head_dim / word) and WRITE ``2 w`` (:meth:`StateMover.load_cycles`, :meth:`StateMover.write_cycles`),
    SCORES (:meth:`ScoreStage.cycles`, S), NORMALISE ``max(N, G + 1 - S) + 1`` with
    N the normaliser's row latency (:meth:`NearFieldFeed.row_cycles`: every head of the wide profile, the
    paper's HCCS heads; :func:`normaliser_lead_cycles` for the paper's integer exp, whose probabilities the
    weighted sum reads behind the normaliser's writes) and G the gate's (:meth:`GateStage.cycles`, issued from
    SCORES's second cycle on), WEIGHTED SUM (where :func:`final_overlaps`, the chunks' slots issued back to
    back, then the last one's pipeline: ``chunks * slots + WEIGHTED_DEPTH``; else per chunk
    :meth:`WeightedStage.cycles` and, but for the last, its FINAL issue), then the last
    chunk's FINAL issue (:meth:`OutputStage.chunk_cycles`) and pipeline (:data:`FINAL_DEPTH`), STORE
    ``4 w + 1 + o`` (o =
    :func:`output_words`: w paper, 2 w wide; :meth:`StateMover.store_cycles`), DONE 1.
    """
    chunks = params.head_dim // params.mac_lanes
    row = normalise_row_cycles(params, normaliser, hccs_mode)
    final_issue = OutputStage.chunk_cycles(params)
    if final_overlaps(params):
        weighted = (chunks - 1) * params.slots + WeightedStage.cycles(params)
    else:  # each chunk's FINAL issue before the next chunk's weighted sum
        weighted = chunks * WeightedStage.cycles(params) + (chunks - 1) * final_issue
    return {"load": StateMover.load_cycles(params), "write": StateMover.write_cycles(params),
            "scores": ScoreStage.cycles(params),
            "normalise": max(row, GateStage.cycles(params) + 1 - ScoreStage.cycles(params)) + 1,
            "weighted": weighted, "final": final_issue + FINAL_DEPTH, "store": StateMover.store_cycles(params),
            "done": 1}


def expected_cycles(params: TileParams, normaliser: str = "hccs_int", hccs_mode: str = "div") -> int:
    """Cycles of one head's decode step in :class:`SomaDecode`, from the cycle after the ``start`` pulse through
    the cycle of the ``done`` pulse: the sum of :func:`decode_phases`."""
    return sum(decode_phases(params, normaliser, hccs_mode).values())


def step_parts(params: TileParams, config) -> tuple[int, int, int]:
    """(front, normalise, back): the cycles of a head's step in :class:`SomaDecode`'s front before NORMALISE
    (LOAD, WRITE when ``include_self``, SCORES), in NORMALISE (through the hand-over) and in the back (WEIGHTED
    SUM, FINAL, WRITE without ``include_self``, STORE, DONE), for ``config`` (anything with ``normaliser``,
    ``hccs_mode`` and ``include_self``); their sum is :func:`expected_cycles`."""
    ph = decode_phases(params, config.normaliser, config.hccs_mode)
    write_front = ph["write"] if config.include_self else 0
    front = ph["load"] + write_front + ph["scores"]
    back = ph["weighted"] + ph["final"] + ph["write"] - write_front + ph["store"] + ph["done"]
    return front, ph["normalise"], back


RELEASE_TO_START = 3
"""Cycles from the release (the front lets a head go during its NORMALISE) to the next head's ``start`` pulse in
the tile: the copies are taken and ``handed`` set the cycle after, the tile sees it a cycle later and pulses
``start`` in its next state."""


def overlapped_cycles(params: TileParams, configs) -> int:
    """Cycles of a run of heads (``configs``, anything :func:`step_parts` takes) through :class:`SomaDecode`,
    each head after the first started :data:`RELEASE_TO_START` cycles after the previous one's release: from
    the cycle after the first ``start`` through the last head's ``done``. Per head h (cycles from the first
    start; ``L`` LOAD, ``Wf`` the front's WRITE, ``S`` SCORES, ``R`` the normaliser's row latency
    (:func:`normalise_row_cycles`), ``G`` the gate's (:meth:`GateStage.cycles`), ``w`` = head_dim / word,
    ``B`` the back and ``W`` its weighted sum (:func:`step_parts`, :func:`decode_phases`))::

        SC[h] = max(start[h] + L + Wf, Hn[h-1] + 1) + 1     SCORES's first cycle (after the previous hand-over)
        N0[h] = max(SC[h] + S - 1, T[h-1] + 1) + 1          NORMALISE's (once the back is past its weighted sum)
        rel[h] = max(N0[h] + 2 w + 3, SC[h] + G + 1, D[h-1] + 1)   release: field loaded, gate done, back idle
        Hn[h] = max(N0[h] + R, rel[h] + 2)                  hand-over to the back (the copies taken)
        T[h] = Hn[h] + W[h], D[h] = Hn[h] + B[h]            the back's last FINAL; done
        start[h+1] = rel[h] + RELEASE_TO_START

    with start[0] = 0 and nothing before head 0. The front's WRITE never waits here (checked: it ends before
    the back's weighted sum does)."""
    ph = decode_phases(params)
    if ph["weighted"] <= ph["load"] + RELEASE_TO_START:
        raise ValueError(f"overlapped_cycles: a weighted sum of {ph['weighted']} cycles ends before the next "
                         f"head's LOAD ({ph['load']}): the front's WRITE would wait, which this count leaves out")
    words = params.head_dim // params.word_bytes
    gate = GateStage.cycles(params)
    start, handed, tail, done = 0, None, None, None
    for config in configs:
        phases = decode_phases(params, config.normaliser, config.hccs_mode)
        row = normalise_row_cycles(params, config.normaliser, config.hccs_mode)
        front, _, back = step_parts(params, config)
        ready = start + front - phases["scores"]  # LOAD and the front's WRITE done
        scores = ready + 1 if handed is None else max(ready, handed + 1) + 1
        row_end = scores + phases["scores"] - 1
        norm = row_end + 1 if tail is None else max(row_end, tail + 1) + 1
        release = max(norm + 2 * words + 3, scores + gate + 1, 0 if done is None else done + 1)
        handed = max(norm + row, release + 2)
        tail, done = handed + phases["weighted"], handed + back
        start = release + RELEASE_TO_START
    return done


class SomaDecode(wiring.Component):
    """One head's integer decode step over the tile's local memory (see the module docstring).

    The profile is ``params.profile``: "paper" (int8 logits, uint8 probabilities, int8 output) or "wide" (int16
    logits, Q15 probabilities from the wide normaliser for every head, int16 output; docs/numerics.md, "Two
    integer profiles").

    Ports: ``start`` (pulse; the head's parameters on ``head`` (:func:`head_params_layout` of the profile) and
    the three base addresses are sampled in that cycle), ``state_base`` (word address of the head's state),
    ``stage_base`` (word address of q, k, v: three vectors of head_dim bytes), ``out_base`` (word address of the
    output, :func:`output_words` words); memory ports ``rd_addr -> rd_data`` and ``v_rd_addr -> v_rd_data``
    (two synchronous read ports: the word arrives the cycle after the address; WEIGHTED SUM reads the V rows
    through the second, every other phase through the first) and ``wr_addr/wr_data/wr_en`` (``wr_en`` one bit
    per byte); the memory ports' outputs come from registers. The unit works in two halves (docs/hardware.md):
    the front (LOAD, WRITE when ``include_self``, SCORES, NORMALISE) and the back (WEIGHTED SUM, FINAL, WRITE
    otherwise, STORE). During NORMALISE, once the field is loaded, the gate computed and the back idle, the
    front releases the head (the back's copies are taken) and ``handed`` pulses (from a register) the cycle
    after: from then on the front takes the next ``start``, whose LOAD runs beside this head's normaliser and
    whose SCORES beside its back. ``done`` pulses (from a register) as the back's STORE ends: the heads are done
    in the order they started. ``start`` is allowed while the unit is idle or from the cycle after ``handed``
    on, for a head other than the ones it holds (another ``state_base``); no head is started twice before its
    ``done``. ``busy`` is high from the cycle after ``start`` through the last ``done``; while it is high the
    unit owns the first read port, and the write port in the cycles after those with ``writes`` high (the
    front's WRITE or the back's WRITE or STORE, the only phases whose next cycle may write; the tile holds its
    payload's beats then); ``wr_out`` (beside ``wr_en``) marks the writes of the output's words,
    :func:`output_words` a head in order from the head's ``out_base``. ``head`` and the bases are sampled at
    ``start`` and may change from the cycle after it on. ``command`` (:func:`near_field_port`) lends the tile's
    one streaming row unit to the HCCS command while ``command.active`` is high, which the tile keeps low while
    ``busy``.

    The unit itself sequences the step (LOAD, WRITE, STORE, the issue counter and the tag line every stage
    reads its items from) and composes the datapath stages: :class:`ScoreStage` (SCORES), :class:`NearFieldFeed`
    (the row through the streaming row unit), in the paper profile an exp-only :class:`RowNormaliser` (the
    integer-exp heads) and :class:`GateStage` (NORMALISE), :class:`WeightedStage`
    (WEIGHTED SUM), :class:`OutputStage` and :class:`FieldUpdate` (FINAL). :func:`expected_cycles` is the sum of
    their latencies (one head on its own), :func:`overlapped_cycles` the count of heads started at ``handed``.
    """

    def __init__(self, params: TileParams, mem_words: int):
        self.params = params
        word = params.word_bytes
        ports = {
            "start": In(1), "done": Out(1), "handed": Out(1), "busy": Out(1),
            "state_base": In(range(mem_words)), "stage_base": In(range(mem_words)),
            "out_base": In(range(mem_words)),
            "rd_addr": Out(range(mem_words)), "rd_data": In(8 * word),
            "v_rd_addr": Out(range(mem_words)), "v_rd_data": In(8 * word),
            "wr_addr": Out(range(mem_words)), "wr_data": Out(8 * word), "wr_en": Out(word), "writes": Out(1),
            "wr_out": Out(1),
        }
        ports["head"] = In(head_params_layout(params.profile))
        ports["command"] = Out(near_field_port(params))
        super().__init__(ports)
        self.mem_words = mem_words

    def elaborate(self, platform):
        m = Module()
        p = self.params

        # The head's parameters and the base addresses, sampled at start.
        paper = p.profile == "paper"
        par = Signal(self.head.shape())
        state_base, out_base = (Signal(range(self.mem_words), name=n) for n in ("state_base", "out_base"))
        # They load in every cycle while the front is idle (from the cycle after ``handed``: the back has its
        # copies), so that the last load is the start cycle's: their enables come from copies of an idle flag,
        # each beside a group of them, instead of from start (one net from the tile's state machine to all 180
        # flip-flops, the ULX3S tile's critical path without rip-up).
        idle = Replicated(1, SAMPLE_COPIES, "idle", init=1)
        with m.If(self.handed):
            m.d.sync += idle.eq(1)
        with m.If(self.start):
            m.d.sync += idle.eq(0)
        loads = [par[name].eq(self.head[name]) for name, _ in self.head.shape()]
        loads += [state_base.eq(self.state_base), out_base.eq(self.out_base)]
        for copy in range(SAMPLE_COPIES):
            with m.If(idle.copy(copy)):
                m.d.sync += loads[copy::SAMPLE_COPIES]
        # In the paper profile an integer-exp head's row goes to the exp-only RowNormaliser (the wide profile
        # has none: its row unit computes every normaliser).
        use_exp = head_choice(par, "normaliser", "exp_int")
        norm = None
        if paper:
            m.submodules.norm = norm = RowNormaliser(p.slots, exp_only=True, sum_lanes=element_lanes(p))
            m.d.comb += [norm.count.eq(p.slots), norm.exp_mult.eq(par["exp_mult"])]

        # Memory ports from registers: the phases set the *_next values. The word read is registered as it
        # leaves the block RAM (whose clock-to-output alone is over half a cycle on the ECP5).
        rd_word, v_word = reg(m, self.rd_data, "rd_word"), reg(m, self.v_rd_data, "v_rd_word")
        rd_addr_next = Signal.like(self.rd_addr)
        m.d.sync += [self.rd_addr.eq(rd_addr_next)]

        # The step's two halves: the front (LOAD, WRITE before attention, SCORES, NORMALISE) and the back
        # (WEIGHTED SUM, FINAL, WRITE after attention, STORE). The back works from copies of what it needs,
        # taken as the front hands the head over (end of NORMALISE): the head's parameters, its bases, its
        # counters (in a state mover of its own) and the bank of the register files LOAD wrote.
        front = SimpleNamespace(par=par, bank=Signal(name="front_bank"))
        back = SimpleNamespace(par=Signal(self.head.shape(), name="back_par"), bank=Signal(name="back_bank"),
                               state_base=Signal.like(state_base, name="back_state_base"),
                               out_base=Signal.like(out_base, name="back_out_base"))
        with m.If(self.start):
            m.d.sync += front.bank.eq(~front.bank)

        # q, k, v, the field, the gate field, their updates and the output: LUT RAMs of memory-word rows
        # (ElementRam). LOAD writes k, v and the gate field in the front's bank, and NORMALISE the field; FINAL
        # and the back's WRITE read the back's. The updated fields have files of their own (fld_new, gate_new:
        # FINAL's writes, STORE's reads), so that each banked file has one writer.
        banked = ("k", "v", "fld", "gate_fld")
        rams = SimpleNamespace(**{name: ElementRam(m, f"{name}_ram", bits, p.head_dim, 8 * p.word_bytes,
                                                   banks=2 if name in banked else 1)
                                  for name, bits in (("q", 8), ("k", 8), ("v", 8), ("fld", 16), ("gate_fld", 16),
                                                     ("fld_new", 16), ("gate_new", 16), ("out", element_bits(p)))})

        # LOAD, WRITE and STORE: the memory's words into and out of the register files and the counters. The
        # front's mover LOADs (and WRITEs before attention); the back's WRITEs after attention and STOREs,
        # from the counters it takes at the hand-over. Each drives the memory's write port only in its phases
        # (0 outside them), which never overlap.
        m.submodules.mover = mover = StateMover(p, self.mem_words)
        m.submodules.back_mover = back.mover = StateMover(p, self.mem_words)
        front.mover = mover
        m.d.comb += [mover.state_base.eq(state_base), mover.stage_base.eq(self.stage_base),
                     mover.out_base.eq(out_base), mover.rd_word.eq(rd_word), rd_addr_next.eq(mover.rd_addr),
                     back.mover.state_base.eq(back.state_base), back.mover.out_base.eq(back.out_base),
                     back.mover.counters_in.eq(mover.counters)]
        m.d.sync += [self.wr_addr.eq(mover.wr_addr | back.mover.wr_addr),
                     self.wr_data.eq(mover.wr_data | back.mover.wr_data),
                     self.wr_en.eq(mover.wr_en | back.mover.wr_en), self.wr_out.eq(back.mover.wr_out)]
        for ram, port, bank in ((rams.k, mover.k, front.bank), (rams.v, mover.v, front.bank),
                                (rams.k, back.mover.k, back.bank), (rams.v, back.mover.v, back.bank),
                                (rams.fld_new, back.mover.field, None), (rams.out, back.mover.out, None)):
            ram.serve(port, bank)
        # STORE's gate field: FINAL's update for a gated head (it writes none for an ungated one), else the one
        # LOAD read.
        gated = head_choice(back.par, "gating", "query")
        m.d.comb += back.mover.gate_field.data.eq(
            Mux(gated, rams.gate_new.reader(back.mover.gate_field.addr).data,
                rams.gate_fld.reader(back.mover.gate_field.addr, back.bank).data))

        # WEIGHTED SUM's issue counter steps through the back's head's rows: a copy of the front's, taken at
        # the hand-over (the front's mover moves on to the next head).
        back.rows = Signal(slot_regions_layout(self.mem_words), name="back_rows")
        issue = SimpleNamespace(k=_Issue(m, p, self.mem_words, mover.rows, "k"),
                                v=_Issue(m, p, self.mem_words, back.rows, "v"))
        fin = _CountIssue(m, p, OutputStage.chunk_cycles(p), PHASE_FINAL, max(FINAL_DEPTH, FIELD_DEPTH) + 1, "fin")
        gate_issue = _CountIssue(m, p, p.head_dim, PHASE_GATE, GATE_DEPTH + 1, "gate")
        stages = self._stages(m, front, back, rams, issue, fin, gate_issue, rd_word, v_word, norm)
        # WEIGHTED SUM's port: its issue counter's address in every cycle (read only while it issues).
        m.d.sync += self.v_rd_addr.eq(issue.v.read_address())

        self._sequence(m, front, back, issue, fin, gate_issue, stages, rd_addr_next, use_exp, norm)
        return m

    def _stages(self, m, front, back, rams, issue, fin, gate_issue, rd_word, v_word, norm) -> SimpleNamespace:
        """The datapath stages, each fed the tags of the item it holds (SCORES's and WEIGHTED SUM's from their
        issue counters, ``issue.k.item`` and ``issue.v.item``; FINAL's and the gate's from theirs, ``fin.item``
        and ``gate_issue.item``) and served by the register files; their
        FINAL element writes and LOAD's word writes into the register files."""
        p = self.params
        paper = p.profile == "paper"
        par, mover = front.par, front.mover
        m.submodules.scores = scores = ScoreStage(p)
        m.d.comb += [scores.head.eq(par), scores.counters.eq(mover.counters), scores.k_word.eq(rd_word),
                     scores.read_item.eq(issue.k.item(READ_LATENCY)),
                     scores.accumulate_item.eq(issue.k.item(ScoreStage.accumulate_stage(p) - 1))]
        rams.q.serve(scores.q)
        row = scores.row
        if paper:
            m.d.comb += [norm.row_index.eq(row.index), norm.row_valid.eq(row.valid), norm.row_x.eq(row.x),
                         norm.row_we.eq(row.we), norm.row_bank.eq(front.bank)]

        # Paper: HCCS heads normalise through the streaming HCCS unit (hw/hccs.py), exp heads through the
        # RowNormaliser (norm); wide: every head through the wide normaliser (hw/wide.py). The query gate runs
        # beside SCORES (from q and the gate field, both loaded in LOAD) and is latched as NORMALISE ends. The
        # row unit serves the tile's HCCS command between steps (command).
        m.submodules.near_field = near_field = NearFieldFeed(p)
        # NORMALISE's counters start from the row's end register alone (only SCORES writes the row): decoded
        # with the state, the state register's routes to their copies were the ULX3S array's latest.
        m.d.comb += [near_field.head.eq(par), near_field.row.eq(row)]
        wiring.connect(m, wiring.flipped(self.command), near_field.command)
        m.submodules.gate = gate = GateStage(p)
        m.d.comb += [gate.head.eq(par), gate.accumulate_item.eq(gate_issue.item(2)),
                     gate.done_item.eq(gate_issue.item(GATE_DEPTH)), gate.advance.eq(gate_issue.issuing)]
        rams.q.serve(gate.q)
        rams.gate_fld.serve(gate.gate_field, front.bank)
        # WEIGHTED SUM over slots for chunk c (issue.v.c holds the chunk); then FINAL over its L elements.
        m.submodules.weighted = weighted = WeightedStage(p)
        m.d.comb += [weighted.head.eq(back.par), weighted.n_issue.eq(issue.v.n),
                     weighted.prob_address_item.eq(issue.v.item(READ_LATENCY - 2)),
                     weighted.prob_item.eq(issue.v.item(READ_LATENCY - 1)),
                     weighted.accumulate_item.eq(issue.v.item(WEIGHTED_DEPTH - 1)),
                     weighted.done_item.eq(issue.v.item(WEIGHTED_DEPTH)),
                     weighted.probs.eq(near_field.probs), weighted.v_word.eq(v_word)]
        if paper:
            m.d.comb += [norm.prob_index.eq(weighted.prob_index), weighted.prob.eq(norm.prob)]
        # FINAL: one OutputStage and FieldUpdate per element of a group issued together (element_lanes); the
        # sequencer drives the first's restarts, the others follow them.
        group = element_lanes(p)
        outputs, updates = [], []
        for e in range(group):
            suffix = str(e) if group > 1 else ""
            m.submodules["output" + suffix] = output = OutputStage(p, e)
            m.d.comb += [output.head.eq(back.par), output.acc.eq(weighted.acc), output.gate.eq(gate.gate),
                         output.write_item.eq(fin.item(FINAL_DEPTH - 1)),
                         output.element_item.eq(fin.item(FINAL_DEPTH)), output.advance.eq(fin.issuing)]
            if e:
                m.d.comb += [output.d_restart.eq(outputs[0].d_restart),
                             output.lane_restart.eq(outputs[0].lane_restart)]
            for ram, port, bank in ((rams.fld, output.field, back.bank), (rams.gate_fld, output.gate_field, back.bank),
                                    (rams.k, output.k, back.bank), (rams.v, output.v, back.bank)):
                ram.serve(port, bank)
            m.submodules["field_update" + suffix] = field_update = FieldUpdate(p, e)
            m.d.comb += [field_update.head.eq(back.par), field_update.f_old.eq(output.f_old),
                         field_update.g_old.eq(output.g_old), field_update.k_d.eq(output.k_d),
                         field_update.src.eq(output.src),
                         field_update.write_item.eq(fin.item(FIELD_DEPTH - 1)),
                         field_update.element_item.eq(fin.item(FIELD_DEPTH))]
            outputs.append(output)
            updates.append(field_update)
        # LOAD's (and NORMALISE's field) word writes, into the front's bank; FINAL's element writes into the
        # updates' files.
        for ram, write in ((rams.q, mover.q_load), (rams.k, mover.k_load), (rams.v, mover.v_load),
                           (rams.fld, mover.field_load), (rams.gate_fld, mover.gate_field_load)):
            with m.If(write.en):
                ram.write_word(write.addr, write.data, front.bank if ram.banks > 1 else None)
        # A group's elements are written together (their enables are equal): the first's element and enable.
        for ram, writes in ((rams.fld_new, [u.field_write for u in updates]),
                            (rams.gate_new, [u.gate_write for u in updates]),
                            (rams.out, [o.out_write for o in outputs])):
            with m.If(writes[0].en):
                ram.write_elements(writes[0].element, [w.value for w in writes])
        return SimpleNamespace(row=row, near_field=near_field, gate=gate, weighted=weighted, output=outputs[0])

    def _sequence(self, m, front, back, issue, fin, gate_issue, stages, rd_addr_next, use_exp, norm):
        """The step's two state machines. The front: LOAD, WRITE (before SCORES when ``include_self``; it waits
        while the back is past its last weighted sum), SCORES (after the previous head's hand-over), NORMALISE
        (once the back is past its last weighted sum), from which it releases the head (``release``: the back's
        copies, ``handed``) once the field is loaded, the gate done and the back idle. The hand-over, when the
        normaliser is done, starts the back: WEIGHTED per chunk (each chunk's FINAL issued by ``fin`` from its
        end; where :func:`final_overlaps` the chunks are issued back to back and FINAL runs beside the next
        chunk's WEIGHTED, else the next chunk waits in FINAL for its issue), the last chunk's FINAL, WRITE
        (without ``include_self``), STORE, DONE; ``done`` a pulse from a register."""
        p = self.params
        D, L = p.head_dim, p.mac_lanes
        chunks, slots = D // L, p.slots
        row, near_field, gate, weighted, output = (stages.row, stages.near_field, stages.gate, stages.weighted,
                                                   stages.output)
        keys, values = issue.k, issue.v
        par, mover = front.par, front.mover
        norm_busy = Signal()

        def enter_scores():
            # sink_last was set for slot 0 at the step's start (IDLE): here, behind the choice between WRITE
            # and SCORES, it was the end of a path from the head's include_self longer than the ULX3S clock.
            keys.first_chunk()
            keys.begin_rows()
            keys.begin(rows=False)
            # The gate's elements beside SCORES's items (q and the gate field are loaded; the gate has its own
            # issue counter and reads q through a read port of its own), from SCORES's second cycle, through a
            # register: from LOAD's end (mover.counter) the restart of the gate's index copies was the ULX3S
            # tile's late path at c4742e5 (seed 1).
            m.d.sync += gate_go.eq(1)
            m.next = "SCORES"

        gate_go = Signal()  # a pulse in SCORES's first cycle: the gate's first element issues in the next
        m.d.sync += gate_go.eq(0)
        with m.If(gate_go):
            gate_issue.begin()
            m.d.comb += gate.restart.eq(1)
        chunk_wrap = Signal()
        m.d.sync += chunk_wrap.eq(0)
        m.d.sync += [self.done.eq(0), self.handed.eq(0)]  # one-cycle pulses from registers
        # back_idle: the back holds no head (a register: set as the back leaves DONE, cleared at the hand-over).
        # back_late: the back is past its last weighted sum (the last chunk's FINAL through DONE): it reads no
        # more probabilities, so the front's NORMALISE may start; and it may write the memory within FINAL_DEPTH
        # cycles, so the front's WRITE starts only before that.
        back_idle, back_late = Signal(init=1), Signal()
        # writes: one register, the next values of the front's and the back's flags (an OR of the two in front of
        # the intake's hold was the ULX3S tile's late path at a12f589, decode -> payload_addr).
        front_writes, back_writes = Signal(), Signal()
        front_writes_next, back_writes_next = Signal(), Signal()
        m.d.comb += [front_writes_next.eq(front_writes), back_writes_next.eq(back_writes)]
        m.d.sync += [front_writes.eq(front_writes_next), back_writes.eq(back_writes_next),
                     self.writes.eq(front_writes_next | back_writes_next)]
        # busy: the front holds a head (from start through the hand-over) or the back does.
        front_busy = Signal()
        with m.If(self.start):
            m.d.sync += front_busy.eq(1)
        # nstage_busy: a head is in NORMALISE (from its start through its hand-over to the back), released: its
        # copies are taken (the front moved on to the next head), norm_use_exp: its normaliser is the exp one.
        nstage_busy, released, norm_use_exp = Signal(), Signal(), Signal()
        m.d.comb += self.busy.eq(front_busy | nstage_busy | ~back_idle)
        hand_over = Signal()  # the back takes the head (NORMALISE done and the head released)
        release = Signal()  # the front lets the head go: the back's copies are taken, handed pulses
        write_fits = StateMover.write_cycles(p) <= FINAL_DEPTH
        front_may_write = ~back_late if write_fits else back_idle

        def begin_write():
            m.d.comb += [mover.begin_write.eq(1), front_writes_next.eq(1)]
            m.next = "WRITE"

        def to_scores():
            # SCORES writes the row the normaliser of the previous head may still read: it waits for that
            # head's hand-over.
            with m.If(nstage_busy):
                m.next = "SCORES_WAIT"
            with m.Else():
                enter_scores()

        def begin_normalise():
            # NORMALISE overwrites the probabilities the back's weighted sum reads, so it starts only once the
            # back is past it (back_late) or idle; the field it loads goes to the front's bank. WEIGHTED's first
            # row address is set here (NORMALISE issues nothing): at NORMALISE's end, behind the gate's and the
            # normaliser's busy flags, it was the ULX3S tile's late path at 57ce153 (seed 2: gate.busy ->
            # row_addr).
            m.d.sync += [norm_busy.eq(1), nstage_busy.eq(1), norm_use_exp.eq(use_exp)]
            values.begin_rows(mover.rows)
            m.d.comb += [mover.begin_field.eq(1), near_field.start.eq(1)]
            if p.profile == "paper":
                m.d.comb += norm.start.eq(use_exp)
            m.next = "NORMALISE"

        with m.FSM(name="front") as front_fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    keys.first_rows()
                    m.d.comb += mover.begin_load.eq(1)
                    m.next = "LOAD"
            with m.State("LOAD"):
                with m.If(mover.load_done):
                    with m.If(par["include_self"]):
                        m.next = "WRITE_WAIT"
                        with m.If(front_may_write):
                            begin_write()
                    with m.Else():
                        to_scores()
            with m.State("WRITE_WAIT"):
                with m.If(front_may_write):
                    begin_write()
            with m.State("WRITE"):
                with m.If(mover.write_last):
                    m.d.comb += front_writes_next.eq(0)
                    to_scores()
            with m.State("SCORES_WAIT"):
                with m.If(~nstage_busy):
                    enter_scores()
            with m.State("SCORES"):
                with m.If(keys.issuing):
                    m.d.comb += rd_addr_next.eq(keys.read_address())
                    with m.If(keys.c_last):
                        keys.first_chunk()
                        keys.next_row()
                    with m.Else():
                        keys.next_chunk()
                with m.If(row.end):
                    with m.If(back_idle | back_late):
                        begin_normalise()
                    with m.Else():
                        m.next = "ROW_WAIT"
            with m.State("ROW_WAIT"):
                with m.If(back_idle | back_late):
                    begin_normalise()
            with m.State("NORMALISE"):
                # The release: once the field is loaded, the gate is done and the back is idle, the head's copies
                # go to the back and the front takes the next head (its LOAD beside this NORMALISE), while the
                # normaliser finishes (the hand-over, below).
                with m.If(~mover.field_busy & ~gate.busy & back_idle):
                    m.d.comb += release.eq(1)
                    m.next = "IDLE"
        # The copies a cycle after the release, from a register (decoded from the front's state, the release
        # reached the back's counters and FINAL's element counters late at a12f589): the front's registers
        # hold the head until the next start, RELEASE_TO_START cycles after the release.
        release_d = Signal()
        m.d.sync += release_d.eq(release)
        with m.If(release_d):
            m.d.comb += [gate.latch.eq(1), back.mover.take.eq(1)]
            m.d.sync += [back.par.eq(par), back.bank.eq(front.bank), back.state_base.eq(mover.state_base),
                         back.out_base.eq(mover.out_base), back.rows.eq(mover.rows), released.eq(1),
                         self.handed.eq(1), front_busy.eq(0)]
        # The normaliser's row is done (an exp row as its first probability is written: the weighted sum reads
        # behind the OUT pass, RowNormaliser.first_out), for the head in NORMALISE (par has moved on).
        norm_done = near_field.done
        if p.profile == "paper":
            norm_done = Mux(norm_use_exp, norm.first_out, near_field.done)
        with m.If(norm_done):
            m.d.sync += norm_busy.eq(0)
        with m.If(nstage_busy & ~norm_busy & released):
            # The hand-over: the back starts its weighted sum.
            values.first_chunk()
            values.begin()
            m.d.comb += [hand_over.eq(1), output.d_restart.eq(1)]
            m.d.sync += [back_idle.eq(0), nstage_busy.eq(0), released.eq(0)]

        def enter_weighted():
            values.begin_rows()
            values.begin()
            m.next = "WEIGHTED"

        def enter_move(begin, state: str):
            m.d.comb += [begin.eq(1), back_writes_next.eq(1)]
            m.next = state

        with m.FSM(name="back") as back_fsm:
            with m.State("IDLE"):
                with m.If(hand_over):
                    m.next = "WEIGHTED"
            with m.State("WEIGHTED"):
                with m.If(values.issuing):
                    values.next_row()
                    if final_overlaps(p):
                        # The next chunk's first slot follows this chunk's last (its rows and sink_last set
                        # after next_row's, so that they win). chunk_wrap: this issue is a chunk's last slot
                        # and a chunk follows, decided a slot early (a chunk's slots issue in consecutive
                        # cycles); from the issue counter's comparisons in this cycle, the row address's and
                        # the phase's inputs were the ULX3S tile's longest paths.
                        if slots >= 2:
                            m.d.sync += chunk_wrap.eq((values.n == slots - 2) & ~values.c_last)
                            wrap = chunk_wrap
                        else:
                            wrap = values.last & ~values.c_last
                        with m.If(wrap):
                            values.next_chunk()
                            enter_weighted()
                with m.If(weighted.chunk_done):
                    # The chunk whose sums are complete: from its tags (the issue may be a chunk further on).
                    m.d.comb += output.lane_restart.eq(1)
                    fin.begin(weighted.done_item.c)
                    if final_overlaps(p):
                        with m.If(weighted.done_item.c == chunks - 1):
                            m.d.sync += back_late.eq(1)
                            m.next = "FINAL"
                    else:
                        m.d.sync += back_late.eq(values.c_last)
                        m.next = "FINAL"
            with m.State("FINAL"):
                # A chunk's elements drain through the FINAL pipeline while the next chunk's weighted sum runs
                # (their writes are in _stages); without final_overlaps the next chunk waits here for FINAL's
                # issue, and after the last chunk the unit waits for the elements.
                # With final_overlaps only the last chunk's FINAL is waited for here (no path from FINAL's
                # issue counter to the weighted sum's issue).
                not_last = Const(0) if final_overlaps(p) else ~values.c_last
                with m.If(not_last):
                    with m.If(fin.issuing & fin.last):
                        values.next_chunk()
                        enter_weighted()
                with m.Elif(output.end):  # the last element leaves FINAL
                    with m.If(back.par["include_self"]):
                        enter_move(back.mover.begin_store, "STORE")
                    with m.Else():
                        enter_move(back.mover.begin_write, "WRITE")
            with m.State("WRITE"):
                with m.If(back.mover.write_last):
                    enter_move(back.mover.begin_store, "STORE")
            with m.State("STORE"):
                with m.If(back.mover.store_done):
                    m.d.sync += self.done.eq(1)
                    m.d.comb += back_writes_next.eq(0)
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.sync += [back_idle.eq(1), back_late.eq(0)]
                m.next = "IDLE"
        m.d.comb += [mover.loading.eq(front_fsm.ongoing("LOAD")), mover.writing.eq(front_fsm.ongoing("WRITE")),
                     back.mover.writing.eq(back_fsm.ongoing("WRITE")),
                     back.mover.storing.eq(back_fsm.ongoing("STORE"))]


class _CountIssue:
    """An issue counter of its own over ``count`` items (n = 0 .. count - 1, of chunk c), one a cycle while
    ``issuing``, with a tag line of its own (:meth:`item`) for phase ``phase``: FINAL's over one chunk's
    ``mac_lanes`` elements (FINAL runs beside the next chunk's WEIGHTED SUM, which holds the main issue counter),
    the gate's over head_dim elements (the gate runs beside SCORES)."""

    def __init__(self, m, params: TileParams, count: int, phase: int, depth: int, name: str):
        self.m, self.phase = m, phase
        self.n = Signal(issue_shape(params), name=f"{name}_n")
        self.c = Signal(range(params.head_dim // params.mac_lanes + 1), name=f"{name}_c")
        self.issuing, self.last = Signal(name=f"{name}_issuing"), Signal(name=f"{name}_last")
        m.d.comb += self.last.eq(self.n == count - 1)
        with m.If(self.issuing):
            m.d.sync += self.n.eq(self.n + 1)
            with m.If(self.last):
                m.d.sync += self.issuing.eq(0)
        self.tags = TagLine(m, self.issuing, self.last, Const(phase, 2), [self.n, self.c], depth, f"{name}_tag")

    def item(self, stage: int):
        """The tags (item_layout) of the item issued ``stage`` cycles ago."""
        return Cat(*self.tags.at(stage, self.phase))

    def begin(self, chunk=0):
        """Issuing starts at item 0 of ``chunk``."""
        self.m.d.sync += [self.n.eq(0), self.c.eq(chunk), self.issuing.eq(1)]


class _Issue:
    """The issue counter of one MAC phase over (slot n, chunk c), one item per cycle while ``issuing``: SCORES's
    over the K rows (``region`` "k", phase :data:`PHASE_SCORES`: each slot's chunks in turn) and WEIGHTED SUM's
    over the V rows ("v", :data:`PHASE_WEIGHTED`: a chunk's slots in turn). Each phase has its own, so that the
    two never share a register (the step towards running one head's WEIGHTED SUM beside the next head's
    SCORES). The tags (valid, last, n, c) travel down a delay line of the phase's depth (:class:`TagLine`) so
    that every pipeline stage knows which item it holds (:meth:`item`). Beside it the row address of slot n's
    row: slots are issued in order (sinks, then the ring), so it advances in a register (by a row's words, or to
    the ring's first row after the last sink) instead of being computed from n. Slot n's chunk c is word
    ``row_addr + (c * L) // W``, lane group ``(c * L % W) // L``; W / L is a power of two."""

    def __init__(self, m, params: TileParams, mem_words: int, rows, region: str):
        self.m, self.params, self.rows, self.region = m, params, rows, region
        self.code = PHASE_SCORES if region == "k" else PHASE_WEIGHTED
        prefix = "" if region == "k" else "v_"  # SCORES's keep the names the build reports knew
        self.row_addr = Signal(range(mem_words), name=f"{prefix}row_addr")
        self.n = Signal(issue_shape(params), name=f"{prefix}n_issue")
        # n == sinks - 1, set with n (it steers the row address)
        self.sink_last = Signal(name=f"{prefix}sink_last")
        self.chunks = params.head_dim // params.mac_lanes
        self.c = Signal(range(self.chunks + 1), name=f"{prefix}c_issue")
        # c == chunks - 1, a register set with c (first_chunk, next_chunk): compared in the cycle, c steered
        # the slot counter n and the sequencer's branches (the ULX3S tile's late path at 57ce153, seed 2:
        # c_issue -> n_issue).
        self.c_last = Signal(name=f"{prefix}c_last", init=self.chunks == 1)
        self.issuing = Signal(name=f"{prefix}issuing")
        self.last = Signal(name=f"{prefix}last_issue")
        depth = (ScoreStage.depth(params) if region == "k" else WEIGHTED_DEPTH) + 1
        self.tags = TagLine(m, self.issuing, self.last, Const(self.code, 2), [self.n, self.c], depth,
                            f"{prefix}tag")
        # n counts by itself: SCORES issues each slot's chunks in turn (the sequencer steps c) and its last item
        # is slot slots - 1's last chunk; WEIGHTED SUM's is slot slots - 1. n is 0 whenever nothing issues, so
        # begin need not clear it: with the sequencer's begin conditions in its input, the fsm_state -> n path
        # was the ULX3S tile's longest.
        slot_end = self.c_last if region == "k" else Const(1)
        m.d.comb += self.last.eq((self.n == params.slots - 1) & slot_end)
        with m.If(~self.issuing | self.last):
            m.d.sync += self.n.eq(0)
        with m.Elif(slot_end):
            m.d.sync += self.n.eq(self.n + 1)
        with m.If(self.last):
            m.d.sync += self.issuing.eq(0)

    def item(self, stage: int):
        """The tags (item_layout) of the item issued ``stage`` cycles ago."""
        return Cat(*self.tags.at(stage, self.code))

    def begin(self, *, rows: bool = True):
        """Issuing starts at item 0 (n is 0 between phases); ``rows``: ``sink_last`` back to slot 0's value too
        (SCORES passes False: :meth:`first_rows` did it at the step's start)."""
        self.m.d.sync += self.issuing.eq(1)
        if rows:
            self.first_rows()

    def first_rows(self):
        """``sink_last`` at slot 0's value (n = 0 is the last sink when there is one sink)."""
        self.m.d.sync += self.sink_last.eq(self.params.sinks == 1)

    def first_chunk(self):
        """c to chunk 0."""
        self.m.d.sync += [self.c.eq(0), self.c_last.eq(self.chunks == 1)]

    def next_chunk(self):
        """c to the next chunk (c is not the last)."""
        self.m.d.sync += [self.c.eq(self.c + 1), self.c_last.eq(self.c == self.chunks - 2)]

    def begin_rows(self, rows=None):
        """The row address at the first slot's row (of ``rows``, by default the counter's own)."""
        rows = self.rows if rows is None else rows
        self.m.d.sync += self.row_addr.eq(rows[("sink_" if self.params.sinks else "ring_") + self.region])

    def next_row(self):
        """The row address to the next slot's row and ``sink_last`` to the next slot's value."""
        step = self.row_addr + self.params.head_dim // self.params.word_bytes
        following = Mux(self.sink_last, self.rows["ring_" + self.region], step) if self.params.sinks else step
        self.m.d.sync += [self.row_addr.eq(following), self.sink_last.eq(self.n + 2 == self.params.sinks)]

    def read_address(self):
        """The memory word of the item issued in this cycle."""
        return self.row_addr + chunk_word(self.c, self.params)
