"""The wide profile's row normaliser in hardware: L int16 lanes per beat in, L Q15 lanes out, bit-exact with
``somatile.model.wide.wide_softmax`` (docs/numerics.md, "Wide normalisers") for each of its normalisers
(``exp``, ``hccs``, ``pwl2``), chosen per head.

Ports (``amaranth.lib.stream``; Verilog names ``i__payload/i__valid/i__ready`` etc.)

``i``   (in)  :func:`in_beat_layout`: ``data`` L x int16 (logits in 2^-8 bit units), ``mask`` L bits (1 = the
              element takes part; pad a partial last beat with 0), ``first``, ``last``, ``head``. A row is the
              beats up to and including the one with ``last``; its head and that head's parameters are taken
              from the row's first beat.
``o``   (out) :func:`out_beat_layout`: ``data`` L x u16 (Q15, 32768 = 1) with the input row's ``mask``,
              ``first``, ``last`` and ``head``. Masked lanes are 0; a fully masked row is all 0.
``cfg`` (in, always ready) :func:`cfg_layout`: writes ``code`` (``wide.NORM_EXP`` / ``NORM_HCCS`` /
              ``NORM_PWL2``), ``B``, ``S``, ``dmax`` of one head; a row uses what its head had when its first
              beat was accepted. Writes to heads >= ``heads`` are ignored. Parameters outside
              ``wide.check_params`` are outside this contract.
``status`` (out) sticky, cleared by ``clear_status`` or reset: ``overflow`` (a row had more than ``n_max``
              elements: the beats past the capacity were dropped), ``framing`` (``first`` disagreed with the
              framing by ``last``), ``bad_head`` (a row named a head >= ``heads``: it outputs zeros);
              ``busy``: a row is inside the unit.

Structure. The row maximum is known only after the last beat and the reciprocal only after the row sum, so a
row takes four passes, each a stage that owns one of :data:`BANKS` banks of the row memories while it works:

1. ingest (:class:`RowMax` for the maximum): beats into the logit memory, the running maximum of the valid
   lanes;
2. weigh (L x :class:`WideWeight`): the row read back, ``E(m - x)`` per lane into the weight memory and the
   row sum ``total`` (32 bit);
3. reciprocal (:class:`RowReciprocal`): ``k``, ``T`` and ``inv = floor(2^31 / T)`` by a restoring divider,
   ``div_bits`` quotient bits per cycle;
4. normalise (L x :class:`ProbabilityLane`): the weights read again, ``min((E * inv + 2^(15+k)) >> (16+k),
   32768)``, into an output FIFO.

Contract
- Throughput: with ``nb = ceil(n / lanes)`` beats per row, back-to-back rows of equal length settle at one row
  every ``max(nb, R + 2, (3*nb + H) / 4)`` cycles, ``R`` the reciprocal's occupancy (:func:`reciprocal_cycles`,
  ``2 + ceil(17 / div_bits)``) and ``H`` the cycles a bank is held beyond its three passes (the hand-overs,
  :func:`bank_overhead`): rows of at least :func:`streaming_row_beats` beats stream at one beat per cycle.
- Latency of a lone row: ``3*nb + ingest + weigh + R + handover + normalise`` cycles, first beat in to last beat
  out (:func:`expected_cycles` with one row); :func:`expected_cycles` gives the exact count of any number of
  back-to-back rows with ``o`` always ready (the stage recurrence of the design).
- Backpressure: ``o`` stalls only the normalise stage (it reads a weight only while the output FIFO has room
  for everything in flight); the other stages run on until they need a bank it still holds, then
  ``i.ready`` falls. ``i.ready``, ``o.valid`` and ``o.payload`` depend on internal state only (never
  combinationally on ``i`` or ``o.ready``). No beat is lost or duplicated.
- Parameters outside ``wide.check_params`` (a negative HCCS weight) are outside this contract.
"""

from __future__ import annotations

import dataclasses
import operator

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from somatile.hw.pipe import delay, delay_line, reduce_levels, reg
from somatile.hw.row_unit import RowUnit, RowUnitConfig
from somatile.model import wide
from somatile.model.intexp import POLY_A, POLY_B, POLY_C

LANES = (1, 2, 4, 8)
"""int16 lanes per beat the unit is built for."""
BANKS = 4
LOGIT = signed(wide.LOGIT_BITS)
WEIGHT = unsigned(16)        # E and p: 0..32768
TOTAL_BITS = 31              # a row sum below 2^31 (N * 32768, N <= 65535)
INV_BITS = 17                # inv in (2^15, 2^16]
K_LAYOUT = signed(5)         # k = floor(log2 total) - 15 in -15..15
FRAC_SHIFT = wide.LOGIT_FRAC_BITS - wide.PWL2_SEG_BITS   # 6: the pwl2 interpolation offset's bits


@dataclasses.dataclass(frozen=True)
class WideConfig(RowUnitConfig):
    """Elaboration parameters of the unit (validated; a bad value names itself and what was expected)."""
    lanes: int = 4
    heads: int = 2
    n_max: int = 256
    div_bits: int = 2

    def __post_init__(self):
        self.check_fields(LANES, wide.MAX_COLS, (1, 2, 3, 6, 9))

    @property
    def bank_depth(self) -> int:
        return 1 << ceil_log2(self.beats_max)


def in_beat_layout(cfg: WideConfig) -> data.StructLayout:
    return data.StructLayout({"data": data.ArrayLayout(LOGIT, cfg.lanes), "mask": cfg.lanes, "first": 1,
                              "last": 1, "head": cfg.head_bits})


def out_beat_layout(cfg: WideConfig) -> data.StructLayout:
    return data.StructLayout({"data": data.ArrayLayout(WEIGHT, cfg.lanes), "mask": cfg.lanes, "first": 1,
                              "last": 1, "head": cfg.head_bits})


head_params_layout = data.StructLayout({"code": 2, "B": bits_for(wide.B_MAX), "S": bits_for(wide.S_MAX),
                                        "dmax": bits_for(wide.DMAX_MAX)})


def cfg_layout(cfg: WideConfig) -> data.StructLayout:
    return data.StructLayout({"head": cfg.head_bits, "params": head_params_layout})


status_layout = data.StructLayout({"overflow": 1, "framing": 1, "bad_head": 1, "busy": 1})


class WideWeight(wiring.Component):
    """One lane's weight ``E(t)`` of the three normalisers (docs/numerics.md "Wide normalisers", step 3),
    selected by ``params.code``; free-running and fully pipelined: ``t``, ``valid`` and ``params`` are sampled
    together and ``E`` follows :data:`WideWeight.LATENCY` cycles later (each stage carries the parameters its
    successors need, so consecutive beats may belong to rows of different heads).

    ``t`` (u16) is ``m - x``; ``valid`` 0 gives E = 0. Every stage has at most one multiplier or one carry
    chain (and the octave shift its barrel shifter alone), which is what a 100 MHz clock on the ECP5 allows."""

    LATENCY = 8

    def __init__(self):
        super().__init__({"t": In(16), "valid": In(1), "params": In(head_params_layout), "E": Out(WEIGHT)})

    def elaborate(self, platform):
        m = Module()

        def carry(name, value):
            return reg(m, value, name)

        par = self.params
        code, B, S, ok = carry("code1", par.code), carry("B1", par.B), carry("S1", par.S), carry("ok1", self.valid)
        # 1: the clipped distance (hccs, pwl2) and the exp's fraction and octave
        d = carry("d", Mux(self.t > par.dmax, par.dmax, self.t))
        r = carry("r", (self.t[:8] << 7)[:15])
        z_exp = carry("z_exp1", self.t[8:])
        # 2: S * d (u32), the exp's w
        sd = carry("sd", S * d)
        w = carry("w", ((POLY_B - r) >> 1)[:15])
        code, B, z_exp, ok = carry("code2", code), carry("B2", B), carry("z_exp2", z_exp), carry("ok2", ok)
        # 3: u = S*d >> 8; the hccs weight; w * w
        u = carry("u", (sd >> wide.S_FRAC_BITS)[:24])
        hccs_e = carry("hccs_e3", (B - (sd >> wide.S_FRAC_BITS))[:16])
        ww = carry("ww", (w * w)[:30])
        code, z_exp, ok = carry("code3", code), carry("z_exp3", z_exp), carry("ok3", ok)
        # 4: pwl2's knot, knot step and offset; the exp's q
        knots = Array(Const(k, 16) for k in wide.PWL2_KNOTS)
        seg = u[FRAC_SHIFT:wide.LOGIT_FRAC_BITS]
        hi = carry("hi4", knots[seg])
        step = carry("step", (knots[seg] - knots[seg + 1])[:16])
        g = carry("g", u[:FRAC_SHIFT])
        z_pwl = carry("z_pwl4", u[wide.LOGIT_FRAC_BITS:])
        q = carry("q", ww[13:])
        hccs_e, code, z_exp, ok = carry("hccs_e4", hccs_e), carry("code4", code), carry("z_exp4", z_exp), carry("ok4", ok)
        # 5: the two products of the chord and the quadratic
        chord = carry("chord", step * g)
        quad = carry("quad", POLY_A * q)
        hi, z_pwl, z_exp = carry("hi5", hi), carry("z_pwl5", z_pwl), carry("z_exp5", z_exp)
        hccs_e, code, ok = carry("hccs_e5", hccs_e), carry("code5", code), carry("ok5", ok)
        # 6: the pwl2 chord value and the exp quadratic, each before its octave shift
        v = carry("v", (hi - (chord >> FRAC_SHIFT))[:16])
        e = carry("e", ((quad >> 15) + POLY_C)[:16])
        z_pwl, z_exp = carry("z_pwl6", z_pwl), carry("z_exp6", z_exp)
        hccs_e, code, ok = carry("hccs_e6", hccs_e), carry("code6", code), carry("ok6", ok)
        # 7: the octave's rounding half added (an octave of 16 or more leaves 0)
        shifted = [(carry(f"{name}_half", (value + (Const(1, 17) << z[:4] >> 1))[:17]), carry(f"{name}_z", z[:4]),
                    carry(f"{name}_zero", z >= wide.ZERO_SHIFT)) for name, value, z in (("exp", e, z_exp), ("pwl", v, z_pwl))]
        hccs_e, code, ok = carry("hccs_e7", hccs_e), carry("code7", code), carry("ok7", ok)
        # 8: the octave shift and the selection by code
        (exp_half, exp_z, exp_zero), (pwl_half, pwl_z, pwl_zero) = shifted
        exp_w = Mux(exp_zero, 0, exp_half >> exp_z)
        pwl_w = Mux(pwl_zero, 0, pwl_half >> pwl_z)
        weight = Mux(code == wide.NORM_EXP, exp_w, Mux(code == wide.NORM_HCCS, hccs_e, pwl_w))
        m.d.sync += self.E.eq(Mux(ok, weight, 0))
        return m


class RowMax(wiring.Component):
    """The running maximum of a row's valid lanes: ``beat`` (L int16 with ``mask``) when ``take``; ``first``
    restarts it. ``row_max`` is the row's maximum :func:`RowMax.latency` cycles after its last beat was taken
    (``LOGIT_MIN`` for a row without a valid lane, whose weights are all masked anyway): the beat registered,
    one compare level of the lanes' tree per stage, then the running maximum."""

    @staticmethod
    def latency(lanes: int) -> int:
        return 2 + ceil_log2(lanes)

    def __init__(self, lanes: int):
        self.lanes = lanes
        super().__init__({"take": In(1), "first": In(1), "data": In(data.ArrayLayout(LOGIT, lanes)),
                          "mask": In(lanes), "row_max": Out(LOGIT)})

    def elaborate(self, platform):
        m = Module()
        values = [reg(m, Mux(self.mask[j], self.data[j], wide.LOGIT_MIN), f"lane{j}") for j in range(self.lanes)]
        take, first = reg(m, self.take, "take0", reset_less=False), reg(m, self.first, "first0")
        level = 0
        while len(values) > 1:
            level += 1
            values = [reg(m, Mux(a > b, a, b), f"max{level}_{i}") for i, (a, b) in enumerate(zip(values[0::2],
                                                                                               values[1::2]))]
            take, first = reg(m, take, f"take{level}", reset_less=False), reg(m, first, f"first{level}")
        beat_max = values[0]
        with m.If(take):
            m.d.sync += self.row_max.eq(Mux(first | (beat_max > self.row_max), beat_max, self.row_max))
        return m


def quotient_bits(cfg: WideConfig) -> int:
    """Quotient bits the divider computes: the 17 of ``inv`` rounded up to whole steps of ``div_bits`` (the
    ones above bit 16 come out 0, since 2^31 / T <= 2^16)."""
    return -(-INV_BITS // cfg.div_bits) * cfg.div_bits


def reciprocal_cycles(cfg: WideConfig) -> int:
    """Cycles the reciprocal stage holds a row: the leading-one step, the normalising shift, then the
    quotient at ``div_bits`` bits per cycle."""
    return 2 + quotient_bits(cfg) // cfg.div_bits


def _leading_one(value):
    """The position of the highest set bit of ``value`` (0 for 0), by halving: is anything set in the upper
    half, then in the upper half of the half that holds it, ... (log2 levels, not a chain of one mux per bit)."""
    width = 1 << ceil_log2(len(value))
    part = value.as_unsigned() if len(value) == width else Cat(value, Const(0, width - len(value)))
    bits = []
    while width > 1:
        width //= 2
        upper = part[width:].any()
        bits.append(upper)
        part = Mux(upper, part[width:], part[:width])
    return Cat(*reversed(bits))


class RowReciprocal(wiring.Component):
    """Steps 5-7 of the wide normalisation for one row: ``k = floor(log2 total) - 15``, ``T = total >> k`` (or
    ``<< -k``) in [2^15, 2^16) and ``inv = floor(2^31 / T)`` by restoring division, ``div_bits`` quotient bits
    per cycle. ``start`` with ``total`` (u31) begins a row when ``idle``; ``done`` pulses with ``k`` and ``inv``
    valid :func:`reciprocal_cycles` cycles later (they hold until the next start). A total of 0 (no valid
    element) gives inv = 0, so every probability of the row is 0."""

    def __init__(self, config: WideConfig):
        self.config = config
        super().__init__({"start": In(1), "total": In(TOTAL_BITS), "idle": Out(1, init=1), "done": Out(1),
                          "k": Out(K_LAYOUT), "inv": Out(INV_BITS)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        total = Signal(TOTAL_BITS)
        top = Signal(range(TOTAL_BITS))     # floor(log2 total)
        normalised = Signal(16)
        rem = Signal(17)
        quotient = Signal(quotient_bits(cfg))
        steps = Signal(range(quotient_bits(cfg) + 1))
        zero = Signal()
        leading = _leading_one(total)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.idle.eq(1)
                with m.If(self.start):
                    m.d.sync += total.eq(self.total)
                    m.next = "LEAD"
            with m.State("LEAD"):
                m.d.sync += [top.eq(leading), zero.eq(total == 0)]
                m.next = "SHIFT"
            with m.State("SHIFT"):
                k = top - (wide.SUM_NORM_BITS - 1)
                m.d.sync += [self.k.eq(k), normalised.eq(Mux(top >= 15, total >> (top - 15).as_unsigned()[:5],
                                                                 total << (15 - top).as_unsigned()[:4])),
                             rem.eq(1 << (wide.RECIP_BITS - quotient_bits(cfg))), quotient.eq(0), steps.eq(0)]
                m.next = "DIVIDE"
            with m.State("DIVIDE"):
                r, q = rem, quotient
                for _ in range(cfg.div_bits):
                    shifted = r << 1
                    fits = shifted >= normalised
                    r = Mux(fits, shifted - normalised, shifted)[:17]
                    q = Cat(fits, q)[:len(quotient)]
                m.d.sync += [rem.eq(r), quotient.eq(q), steps.eq(steps + cfg.div_bits)]
                with m.If(steps + cfg.div_bits == quotient_bits(cfg)):
                    m.d.sync += [self.inv.eq(Mux(zero, 0, q[:INV_BITS])), self.done.eq(1)]
                    m.next = "IDLE"
        with m.If(self.done):
            m.d.sync += self.done.eq(0)
        return m


class ProbabilityLane(wiring.Component):
    """Step 8 for one lane: ``p = min((E * inv + 2^(15+k)) >> (16+k), 32768)``; free-running,
    :data:`ProbabilityLane.LATENCY` cycles from ``E`` (sampled with ``inv`` and ``k``) to ``p``: the product,
    the rounding half added, the shift, the bound."""

    LATENCY = 4

    def __init__(self):
        super().__init__({"E": In(WEIGHT), "inv": In(INV_BITS), "k": In(K_LAYOUT), "p": Out(WEIGHT)})

    def elaborate(self, platform):
        m = Module()
        product = reg(m, self.E * self.inv, "product", unsigned(33))
        shift = reg(m, (self.k + wide.SUM_NORM_BITS)[:5], "shift")
        rounded = reg(m, product + (Const(1, 33) << shift >> 1), "rounded", unsigned(33))
        shift2 = reg(m, shift, "shift2")
        scaled = reg(m, rounded >> shift2, "scaled", unsigned(33))
        m.d.sync += self.p.eq(Mux(scaled > wide.PROB_ONE, wide.PROB_ONE, scaled))
        return m


@dataclasses.dataclass
class _Bank:
    """The registers a row keeps with its bank from ingest to normalise."""
    head: Signal
    params: Signal
    zero: Signal
    beats: Signal
    row_max: Signal
    total: Signal
    k: Signal
    inv: Signal


WEIGH_READ = 3
"""The logit memory's read, the read register and the distance register in front of the weight lanes."""
SUM_TREE_LEVELS = 2
"""Adder levels of the beat's sum over the lanes per register stage (three 19-bit levels and the routing across
8 lanes did not fit 10 ns on the ECP5)."""
SUM_STAGES = 2
"""Register stages of the beat's sum: enough for the 3 levels of 8 lanes (the most the unit takes)."""
SUM_LATENCY = SUM_STAGES + 1
"""The beat's sum over the lanes, then the running total."""
NORMALISE_READ = 3
"""The weight memory's read, the read register and the lanes' operand register in front of their multipliers
(the block RAM's clock-to-output and a multiplier in one cycle was the unit's longest path)."""
OUTPUT_FIFO = 16
"""Beats the output FIFO holds: the normalise stage reads a weight only while it has a credit (a place in the
FIFO for everything in flight); with ``o`` always ready the credits never run out."""


def ingest_latency(cfg: WideConfig) -> int:
    """Cycles from a row's last beat accepted to the weigh stage's first read of it."""
    return RowMax.latency(cfg.lanes) + 2


def weigh_latency() -> int:
    """Cycles from the weigh stage's read of a row's last beat to the reciprocal's start on it."""
    return WEIGH_READ + WideWeight.LATENCY + SUM_LATENCY + 1


RECIPROCAL_HANDOVER = 3
"""Cycles from the reciprocal's last step to the normalise stage's first read: the ``done`` register, the bank's
k, inv and row count, the normalise stage's start."""


def normalise_latency() -> int:
    """Cycles from the normalise stage's read of a beat to that beat at ``o`` (read, read register, the lane
    pipeline, the FIFO's write and its output buffer)."""
    return NORMALISE_READ + ProbabilityLane.LATENCY + 2


def expected_cycles(cfg: WideConfig, rows: int, n: int) -> int:
    """Cycles from the first input beat accepted to the last output beat taken, inclusive, for ``rows``
    back-to-back rows of ``n`` elements (input valid and output ready on every cycle): the stage recurrence of
    the design (each stage starts a row when the previous stage has finished it and it is free; bank
    ``r mod 4`` is taken again once the normalise stage has read row ``r - 4``)."""
    if rows < 1 or not 1 <= n <= cfg.n_max:
        raise ValueError(f"rows must be >= 1 and n within 1..{cfg.n_max}, got rows={rows}, n={n}")
    nb = -(-n // cfg.lanes)
    recip = reciprocal_cycles(cfg)
    ingest, weigh, recips, norm = [], [], [], []
    for r in range(rows):
        i_start = 0 if r == 0 else ingest[r - 1] + nb
        if r >= BANKS:
            i_start = max(i_start, norm[r - BANKS] + nb)
        w_start = max(i_start + nb - 1 + ingest_latency(cfg), weigh[r - 1] + nb if r else 0)
        d_start = max(w_start + nb - 1 + weigh_latency(), recips[r - 1] + recip + RECIPROCAL_HANDOVER - 1 if r else 0)
        n_start = max(d_start + recip + RECIPROCAL_HANDOVER, norm[r - 1] + nb if r else 0)
        ingest.append(i_start)
        weigh.append(w_start)
        recips.append(d_start)
        norm.append(n_start)
    return norm[-1] + nb - 1 + normalise_latency() + 1


def bank_overhead(cfg: WideConfig) -> int:
    """``H`` of the throughput bound: the cycles a bank is held beyond its row's three passes of ``nb`` beats
    (the ingest and weigh pipelines, the reciprocal and the hand-overs between the stages)."""
    return (ingest_latency(cfg) - 1) + (weigh_latency() - 1) + reciprocal_cycles(cfg) + RECIPROCAL_HANDOVER


def streaming_row_beats(cfg: WideConfig) -> int:
    """The shortest row (in beats) that back-to-back streams at one beat per cycle: ``nb >= R + 2`` and
    ``4*nb >= 3*nb + H`` (see the module docstring)."""
    return max(reciprocal_cycles(cfg) + RECIPROCAL_HANDOVER - 1, bank_overhead(cfg))


class WideNormaliser(RowUnit):
    """The wide profile's row normaliser; see the module docstring for ports, structure and contract.

    ``WideNormaliser(lanes=4, heads=2, n_max=256, div_bits=2)`` or ``WideNormaliser(config=WideConfig(...))``.
    """

    config_class = WideConfig

    @classmethod
    def layouts(cls, config):
        return in_beat_layout(config), out_beat_layout(config), cfg_layout(config), status_layout

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        self._banks = [_Bank(Signal(cfg.head_bits, name=f"b{b}_head"), Signal(head_params_layout, name=f"b{b}_par"),
                             Signal(name=f"b{b}_zero"), Signal(range(cfg.beats_max + 1), name=f"b{b}_beats"),
                             Signal(LOGIT, name=f"b{b}_max"), Signal(TOTAL_BITS, name=f"b{b}_total"),
                             Signal(K_LAYOUT, name=f"b{b}_k"), Signal(INV_BITS, name=f"b{b}_inv"))
                       for b in range(BANKS)]
        # Rows counted modulo 8 at each hand-over: started by ingest (its bank taken), ingested (maximum final),
        # weighed (total final), inverted (k, inv final) and read (the normaliser's last read: bank free).
        self._rows = {name: Signal(3, name=f"rows_{name}")
                      for name in ("started", "ingested", "weighed", "inverted", "read")}
        word = data.StructLayout({"lanes": data.ArrayLayout(16, cfg.lanes), "mask": cfg.lanes})
        depth = BANKS * cfg.bank_depth
        m.submodules.logits = logits = Memory(shape=word, depth=depth, init=[])
        m.submodules.weights = weights = Memory(shape=word, depth=depth, init=[])
        params = Array(Signal(head_params_layout, name=f"head{h}_params") for h in range(cfg.heads))
        with m.If(self.cfg.valid & (self.cfg.payload.head < cfg.heads)):
            m.d.sync += params[self.cfg.payload.head].eq(self.cfg.payload.params)
        m.d.comb += self.cfg.ready.eq(1)
        self._sticky = sticky = {name: Signal(name=name) for name in ("overflow", "framing", "bad_head")}
        with m.If(self.clear_status):
            m.d.sync += [flag.eq(0) for flag in sticky.values()]
        m.d.comb += [getattr(self.status, name).eq(flag) for name, flag in sticky.items()]
        self._ingest(m, params, logits.write_port())
        self._weigh(m, logits.read_port(), weights.write_port())
        self._reciprocal(m)
        self._normalise(m, weights.read_port())
        rows = self._rows
        m.d.comb += self.status.busy.eq((rows["started"] != rows["read"]) | self._ingest_busy)
        return m

    def _bank(self, index, name: str) -> _Bank:
        """Field ``name`` of bank ``index`` (a signal), selected."""
        return Array(getattr(b, name) for b in self._banks)[index[:2]]

    def _address(self, bank, beat):
        return Cat(beat[:ceil_log2(self.config.bank_depth)], bank[:2])

    def _ingest(self, m: Module, params, write) -> None:
        cfg = self.config
        rows = self._rows
        beat = Signal(range(cfg.beats_max + 1))
        busy = Signal()            # inside a row (its first beat taken, its last not yet)
        self._ingest_busy = busy
        m.d.comb += self.i.ready.eq(busy | ((rows["started"] - rows["read"])[:3] < BANKS))
        take = self.i.valid & self.i.ready
        p = self.i.payload
        bank = rows["started"]
        starts = ~busy             # a row starts after a last beat, whatever its ``first`` says
        index = Mux(starts, 0, beat)
        keep = take & (index < cfg.beats_max)
        with m.If(take):
            m.d.sync += [busy.eq(~p.last), beat.eq(Mux(keep, index + 1, index))]
            with m.If(p.first != starts):
                m.d.sync += self._sticky['framing'].eq(1)
            with m.If(~keep):
                m.d.sync += self._sticky['overflow'].eq(1)
            with m.If(starts):
                bad = p.head >= cfg.heads
                m.d.sync += [self._bank(bank, "head").eq(p.head), self._bank(bank, "params").eq(params[p.head]),
                             self._bank(bank, "zero").eq(bad)]
                with m.If(bad):
                    m.d.sync += self._sticky['bad_head'].eq(1)
            with m.If(p.last):
                m.d.sync += [self._bank(bank, "beats").eq(Mux(keep, index + 1, index)),
                             rows["started"].eq(rows["started"] + 1)]
        m.d.comb += [write.addr.eq(self._address(bank, index)), write.data.lanes.eq(p.data.as_value()),
                     write.data.mask.eq(p.mask), write.en.eq(keep)]
        m.submodules.row_max = row_max = RowMax(cfg.lanes)
        m.d.comb += [row_max.take.eq(take), row_max.first.eq(starts), row_max.data.eq(p.data),
                     row_max.mask.eq(Mux(keep, p.mask, 0))]
        # The row's last beat (and its bank), delayed until its maximum is final: then the row is handed on.
        ended = [Signal(name=f"ended{i}") for i in range(RowMax.latency(cfg.lanes))]
        ended_bank = [Signal(2, name=f"ended_bank{i}") for i in range(RowMax.latency(cfg.lanes))]
        m.d.sync += [ended[0].eq(take & p.last), ended_bank[0].eq(bank[:2])]
        m.d.sync += [a.eq(b) for a, b in zip(ended[1:] + ended_bank[1:], ended[:-1] + ended_bank[:-1])]
        with m.If(ended[-1]):
            m.d.sync += [self._bank(ended_bank[-1], "row_max").eq(row_max.row_max),
                         rows["ingested"].eq(rows["ingested"] + 1)]

    def _weigh(self, m: Module, read, write) -> None:
        cfg = self.config
        rows = self._rows
        row = Signal(3)            # the row being read
        active = Signal()
        beat = Signal(range(cfg.beats_max + 1))
        beats = self._bank(row, "beats")
        with m.If(~active & (rows["ingested"] != row)):
            m.d.sync += [active.eq(1), beat.eq(0)]
        issue = active & (beat < beats)
        with m.If(issue):
            m.d.sync += beat.eq(beat + 1)
        finished = active & (beat + 1 >= beats)   # every row keeps its first beat: beats >= 1
        with m.If(finished):
            # The next row's reads follow without a gap when it is ready.
            m.d.sync += [active.eq(rows["ingested"] != (row + 1)[:3]), beat.eq(0), row.eq(row + 1)]
        m.d.comb += read.addr.eq(self._address(row, beat))
        # The beat read, registered out of the block RAM; its address (bank and beat) and flags travel beside
        # it, the address on to the weight memory's write WEIGH_READ + WideWeight.LATENCY cycles after the read.
        word = reg(m, read.data, "weigh_word")
        tag = Signal(data.StructLayout({"valid": 1, "last": 1, "addr": len(read.addr)}))
        m.d.comb += [tag.valid.eq(issue), tag.last.eq(finished), tag.addr.eq(read.addr)]
        tags = delay_line(m, tag, WEIGH_READ + WideWeight.LATENCY, "weigh_tag", reset_less=False)
        bank = tags[WEIGH_READ - 1].addr[-2:]       # the word's bank
        # The distances, the lanes' valid bits and the row's parameters into registers in front of the lanes.
        row_max, zero = self._bank(bank, "row_max"), self._bank(bank, "zero")
        params = reg(m, self._bank(bank, "params"), "weigh_params")
        weights = []
        for j in range(cfg.lanes):
            m.submodules[f"weight{j}"] = lane = WideWeight()
            m.d.comb += [lane.t.eq(reg(m, (row_max - word.lanes[j].as_signed())[:16], f"t{j}")),
                         lane.valid.eq(reg(m, word.mask[j] & ~zero, f"valid{j}")), lane.params.eq(params)]
            weights.append(lane.E)
        out = tags[-1]
        mask = delay(m, word.mask, WideWeight.LATENCY + 1, "weigh_mask")
        done = out.valid
        m.d.comb += [write.addr.eq(out.addr), write.data.lanes.eq(Cat(*weights)), write.data.mask.eq(mask),
                     write.en.eq(done)]
        # The beat's sum over the lanes (SUM_TREE_LEVELS adder levels per stage), then the running total; the
        # row's total is handed on after its last beat.
        partial, flags = list(weights), Cat(done, out.last, out.addr[-2:])
        for stage in range(SUM_STAGES):
            partial = [reg(m, value, f"beat_sum{stage}_{i}", unsigned(16 + ceil_log2(cfg.lanes) + 1))
                       for i, value in enumerate(reduce_levels(partial, operator.add, SUM_TREE_LEVELS))]
            flags = reg(m, flags, f"beat_sum{stage}_flags", reset_less=False)
        beat_sum, (summed, summed_last, summed_bank) = partial[0], (flags[0], flags[1], flags[2:4])
        total, open_row = Signal(TOTAL_BITS), Signal()
        handed, handed_bank = Signal(), Signal(2)
        with m.If(summed):
            m.d.sync += [total.eq(Mux(open_row, total, 0) + beat_sum), open_row.eq(~summed_last)]
        m.d.sync += [handed.eq(summed & summed_last), handed_bank.eq(summed_bank)]
        with m.If(handed):
            m.d.sync += [self._bank(handed_bank, "total").eq(total), rows["weighed"].eq(rows["weighed"] + 1)]

    def _reciprocal(self, m: Module) -> None:
        rows = self._rows
        m.submodules.reciprocal = unit = RowReciprocal(self.config)
        row = rows["inverted"]
        waiting = Signal()
        start = unit.idle & ~waiting & (rows["weighed"] != row)
        m.d.comb += [unit.start.eq(start), unit.total.eq(self._bank(row, "total"))]
        with m.If(start):
            m.d.sync += waiting.eq(1)
        with m.If(unit.done):
            m.d.sync += [self._bank(row, "k").eq(unit.k), self._bank(row, "inv").eq(unit.inv),
                         rows["inverted"].eq(row + 1), waiting.eq(0)]

    def _normalise(self, m: Module, read) -> None:
        cfg = self.config
        rows = self._rows
        row = rows["read"]
        m.submodules.out_fifo = fifo = SyncFIFOBuffered(width=len(self.o.payload.as_value()), depth=OUTPUT_FIFO)
        active = Signal()
        beat = Signal(range(cfg.beats_max + 1))
        beats = self._bank(row, "beats")
        pipeline = NORMALISE_READ + ProbabilityLane.LATENCY
        # A read takes a credit, a beat leaving the FIFO gives one back: a register, not a sum over the pipeline.
        credits = Signal(range(OUTPUT_FIFO + 1), init=OUTPUT_FIFO)
        with m.If(~active & (rows["inverted"] != row)):
            m.d.sync += [active.eq(1), beat.eq(0)]
        issue = active & (beat < beats) & (credits != 0)
        m.d.sync += credits.eq(credits - issue + (self.o.valid & self.o.ready))
        with m.If(issue):
            m.d.sync += beat.eq(beat + 1)
        with m.If(issue & (beat + 1 == beats)):
            m.d.sync += [active.eq(rows["inverted"] != (row + 1)[:3]), beat.eq(0), row.eq(row + 1)]
        m.d.comb += read.addr.eq(self._address(row, beat))
        # The beat's flags and the row's k and inv travel beside the read; each lane's probability follows.
        word = reg(m, reg(m, read.data, "norm_read"), "norm_word")
        flags = data.StructLayout({"valid": 1, "first": 1, "last": 1, "head": cfg.head_bits, "inv": INV_BITS,
                                   "k": K_LAYOUT})
        tag = Signal(flags)
        m.d.comb += [tag.valid.eq(issue), tag.first.eq(beat == 0), tag.last.eq(beat + 1 == beats),
                     tag.head.eq(self._bank(row, "head")),
                     tag.inv.eq(Mux(self._bank(row, "zero"), 0, self._bank(row, "inv"))),
                     tag.k.eq(self._bank(row, "k"))]
        tags = delay_line(m, tag, pipeline, "norm_tag", reset_less=False)
        at_word = tags[NORMALISE_READ]
        probs = []
        for j in range(cfg.lanes):
            m.submodules[f"prob{j}"] = lane = ProbabilityLane()
            m.d.comb += [lane.E.eq(word.lanes[j]), lane.inv.eq(at_word.inv), lane.k.eq(at_word.k)]
            probs.append(lane.p)
        out = tags[-1]
        payload = Signal(out_beat_layout(cfg))
        m.d.comb += [payload.data.eq(Cat(*probs)), payload.mask.eq(delay(m, word.mask, ProbabilityLane.LATENCY)),
                     payload.first.eq(out.first), payload.last.eq(out.last), payload.head.eq(out.head),
                     fifo.w_data.eq(payload.as_value()), fifo.w_en.eq(out.valid)]
        m.d.comb += [self.o.valid.eq(fifo.r_rdy), self.o.payload.eq(fifo.r_data), fifo.r_en.eq(self.o.ready)]
