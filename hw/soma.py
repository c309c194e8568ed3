"""Soma decode unit: one integer decode step of one head, bit-exact with ``somatile.model.soma_int``.

The unit works on the tile's local memory (``hw/tile.py`` owns it and lends the unit a read and a write
port while it runs). A head's state lives there in the layout of :func:`somatile.hw.regmap.state_layout`
(ring and sink keys/values int8, field and gate field int16 with 7 fraction bits, counters u32); q, k and v
come from the tile's staging area and the int8 output goes back there.

One step, per head (docs/numerics.md, section Soma, is the contract):

1. LOAD: q, k, v, the field, the gate field and the counters into registers.
2. WRITE (first when ``include_self``, else after step 5): k and v into the next sink slot or the ring.
3. SCORES: ``q . K[n]`` for every one of the ``sinks + ring`` slots, ``mac_lanes`` int8 MACs per cycle, then
   ``x8 = sat8(rshift_round(score * score_mult, score_shift) - recency_int * distance)`` (0 where invalid).
4. NORMALISE: integer HCCS (div/clb) through the streaming HCCS unit of ``hw/hccs.py`` (``hccs_lanes``
   per beat), or the integer exp through :class:`RowNormaliser`; uint8 probabilities; and, in parallel, the query gate ``sat(64 + rshift_round((q . G) * gate_mult, gate_shift), 0, 128)`` (128 when
   ungated).
5. WEIGHTED SUM: ``P . V`` per output lane, ``mac_lanes`` MACs per cycle; per element
   ``out = sat8(sat16(rshift_round(acc * out_mult, out_shift)) + sat16(rshift_round(F * alpha_mult *
   gate, alpha_shift + 7)))`` and the field updates ``F <- rshift_round(gamma F + (2^15 - gamma)(x << 7), 15)``.
6. STORE: field, gate field, counters and the output.

Every slot is visited whatever the fill level, so the cycle count depends only on the tile parameters:
:func:`expected_cycles` is exact (the testbench checks it at sequence positions 128 and 65,536). There is no
backpressure inside the unit: ``start`` is a one-cycle pulse, ``done`` a one-cycle pulse ``expected_cycles``
cycles later.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from somatile.hw import hccs as hccs_unit
from somatile.hw import regmap
from somatile.hw.regmap import HEAD_INDEX, HEAD_PARAMS, TileParams
from somatile.model import hccs, intexp, soma

DIVIDER_BITS = 31
"""Quotient bits of the sequential reciprocal: the largest numerator is 32767 << 15 < 2**30."""


def rshift_round(x, shift, width: int = 64):
    """Round-half-up arithmetic right shift of a signed value by a variable amount (soma_int.rshift_round)."""
    half = ((Const(1, width) << shift) >> 1)[:width]
    return (x.as_signed() + half.as_signed()) >> shift


def saturate(x, lo: int, hi: int):
    return Mux(x < lo, lo, Mux(x > hi, hi, x))


def _floor_log2(value, width: int):
    """Position of the leading one of a positive unsigned value (0 for 0 and 1)."""
    result = Const(0, range(width))
    for bit in range(width):
        result = Mux(value[bit], bit, result)
    return result


def normaliser_cycles(n: int) -> int:
    """Cycles of :class:`RowNormaliser` for a row of ``n`` entries, from the cycle after ``start`` through
    the ``done`` pulse: max n, sum n, reciprocal DIVIDER_BITS + 1, output n, done 1."""
    return 3 * n + DIVIDER_BITS + 2


class RowNormaliser(wiring.Component):
    """Integer HCCS (div/clb) or integer-exp softmax over one row of up to ``n_max`` int8 logits.

    Bit-exact with ``hccs.hccs_row`` and ``intexp.intexp_row`` (masks included). The row is written through
    ``row_we/row_index/row_x/row_valid`` before ``start``; the probabilities are read through
    ``prob_index -> prob`` (combinational) after ``done``. Passes: max (n cycles), sum (n), reciprocal
    (DIVIDER_BITS + 1), output (n): :func:`normaliser_cycles`. One element per cycle: the decode unit's MACs,
    not the normaliser, dominate a decode step.
    """

    def __init__(self, n_max: int):
        self.n_max = n_max
        super().__init__({
            "start": In(1), "done": Out(1), "count": In(range(n_max + 1)),
            "use_exp": In(1), "clb": In(1), "out16": In(1),
            "B": In(16), "S": In(8), "dmax": In(8), "exp_mult": In(16),
            "row_we": In(1), "row_index": In(range(n_max)), "row_x": In(signed(8)), "row_valid": In(1),
            "prob_index": In(range(n_max)), "prob": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        n_max = self.n_max
        m.submodules.row = row = Memory(shape=unsigned(9), depth=n_max, init=[])
        m.submodules.probs = probs = Memory(shape=unsigned(16), depth=n_max, init=[])
        row_w = row.write_port()
        row_r = row.read_port(domain="comb")
        prob_w = probs.write_port()
        prob_r = probs.read_port(domain="comb")
        m.d.comb += [row_w.addr.eq(self.row_index), row_w.data.eq(Cat(self.row_x, self.row_valid)),
                     row_w.en.eq(self.row_we), prob_r.addr.eq(self.prob_index), self.prob.eq(prob_r.data)]

        index = Signal(range(n_max + 1))
        row_max = Signal(signed(10))
        total = Signal(32)
        inv = Signal(32)
        remainder = Signal(33)
        bit = Signal(range(DIVIDER_BITS + 1))
        m.d.comb += row_r.addr.eq(index)
        x = row_r.data[:8].as_signed()
        valid = row_r.data[8]

        # Per-element score: HCCS B - S * min(m - x, dmax), or the integer exponential E of m - x.
        distance = Signal(9)
        m.d.comb += distance.eq(row_max - x)
        capped = Mux(distance > self.dmax, self.dmax, distance)
        hccs_score = (self.B - self.S * capped)[:16]
        u = Signal(25)
        m.d.comb += u.eq(distance * self.exp_mult)
        z = u >> intexp.EXP_FRAC_BITS
        r = u[:intexp.EXP_FRAC_BITS]
        w = Signal(17)
        m.d.comb += w.eq((intexp.POLY_B - r) >> 1)
        square = Signal(34)
        m.d.comb += square.eq(w * w)
        e = ((intexp.POLY_A * (square >> 13)) >> 15) + intexp.POLY_C
        exp_score = Signal(17)
        m.d.comb += exp_score.eq(Mux(z >= intexp.EXP_ZERO_SHIFT, 0,
                                     (e + ((Const(1, 17) << z[:5]) >> 1)) >> z[:5]))
        score = Signal(17)
        m.d.comb += score.eq(Mux(valid, Mux(self.use_exp, exp_score, hccs_score), 0))

        # Reciprocal operands: HCCS divides the numerator by the total (div) or shifts it (clb); the integer
        # exp first brings the total into [2**14, 2**15) with a pre-shift.
        log2_total = _floor_log2(total, 32)
        pre_shift = Signal(range(32))
        m.d.comb += pre_shift.eq(Mux(self.use_exp & (log2_total > intexp.SUM_NORM_BITS - 1),
                                     log2_total - (intexp.SUM_NORM_BITS - 1), 0))
        divisor = Signal(32)
        m.d.comb += divisor.eq(total >> pre_shift)
        numerator = Signal(DIVIDER_BITS)
        m.d.comb += numerator.eq(Mux(self.use_exp,
                                     Mux(self.out16, intexp.INT16_NUMERATOR, intexp.UINT8_NUMERATOR),
                                     Mux(self.out16, hccs.INT16_NUMERATOR, hccs.UINT8_NUMERATOR)))
        product = Signal(48)
        m.d.comb += product.eq(Mux(self.use_exp, score >> pre_shift, score) * inv)
        hccs_prob = Mux(self.out16, Mux(product > hccs.INT16_MAX, hccs.INT16_MAX, product),
                        Mux((product >> hccs.INV_SHIFT) > hccs.UINT8_MAX, hccs.UINT8_MAX,
                            product >> hccs.INV_SHIFT))
        m.d.comb += [prob_w.addr.eq(index),
                     prob_w.data.eq(Mux(valid, Mux(self.use_exp, product >> 15, hccs_prob), 0))]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [index.eq(0), row_max.eq(-256), total.eq(0)]
                    m.next = "MAX"
            with m.State("MAX"):
                with m.If(valid & (x > row_max)):
                    m.d.sync += row_max.eq(x)
                m.d.sync += index.eq(index + 1)
                with m.If(index == self.count - 1):
                    m.d.sync += index.eq(0)
                    m.next = "SUM"
            with m.State("SUM"):
                m.d.sync += [total.eq(total + score), index.eq(index + 1)]
                with m.If(index == self.count - 1):
                    m.d.sync += [index.eq(0), remainder.eq(0), inv.eq(0), bit.eq(DIVIDER_BITS)]
                    m.next = "RECIPROCAL"
            with m.State("RECIPROCAL"):
                with m.If(bit == 0):
                    with m.If(total == 0):
                        m.d.sync += inv.eq(0)
                    with m.Elif(~self.use_exp & self.clb):
                        m.d.sync += inv.eq(numerator >> log2_total)
                    m.next = "OUT"
                with m.Else():
                    shifted = Cat(numerator.bit_select((bit - 1)[:5], 1), remainder[:32])
                    with m.If(shifted >= divisor):
                        m.d.sync += [remainder.eq(shifted - divisor), inv.eq(Cat(1, inv[:31]))]
                    with m.Else():
                        m.d.sync += [remainder.eq(shifted), inv.eq(Cat(0, inv[:31]))]
                    m.d.sync += bit.eq(bit - 1)
            with m.State("OUT"):
                m.d.comb += prob_w.en.eq(1)
                m.d.sync += index.eq(index + 1)
                with m.If(index == self.count - 1):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"
        return m


def head_param_ports() -> dict:
    """Ports of the decode unit that carry the head's parameter registers (one per HEAD_PARAMS entry)."""
    return {f"p_{p.name}": In(range(p.hi + 1)) for p in HEAD_PARAMS}


def near_field_unit(params: TileParams) -> "hccs_unit.HCCSConfig":
    """Configuration of the streaming HCCS unit (hw/hccs.py) that normalises the decode row of HCCS heads:
    ``hccs_lanes`` lanes, one head (loaded with the current head's parameters before each row), rows of up
    to ``sinks + ring`` slots rounded up to whole beats."""
    lanes = params.hccs_lanes
    return hccs_unit.HCCSConfig(lanes=lanes, heads=1, n_max=-(-params.slots // lanes) * lanes, out_type="uint8")


def expected_cycles(params: TileParams, normaliser: str = "hccs_int", hccs_mode: str = "div") -> int:
    """Cycles of one head's decode step in :class:`SomaDecode`: from the cycle after the ``start`` pulse
    through the cycle of the ``done`` pulse, for a head with this normaliser (and HCCS mode).

    Depends on ring, sinks, head_dim, lanes (``mac_lanes = min(lanes, head_dim)`` and the local-memory word
    ``max(16, mac_lanes)`` bytes), hccs_lanes and the normaliser only; not on the sequence position or the
    fill level. Per phase: LOAD ``7 w + 2`` (w = head_dim / word), WRITE ``2 w``, SCORES
    ``slots * chunks + 3`` (chunks = head_dim / mac_lanes), NORMALISE ``max(N, head_dim) + 1`` with N the
    normaliser's row latency (the HCCS unit's ``expected_cycles`` for one row of ``slots``, or
    :func:`normaliser_cycles` for the integer exp), WEIGHTED SUM ``chunks * (slots + 2 + mac_lanes)``,
    STORE ``5 w + 1``, DONE 1.
    """
    words = params.head_dim // params.word_bytes
    slots, chunks = params.slots, params.head_dim // params.mac_lanes
    if normaliser == "hccs_int":
        row = hccs_unit.expected_cycles(near_field_unit(params), 1, slots, mode=hccs_mode, out="uint8")
    else:
        row = normaliser_cycles(slots)
    load = 7 * words + 2
    write = 2 * words
    scores = slots * chunks + 3
    normalise = max(row, params.head_dim) + 1
    weighted = chunks * (slots + 2 + params.mac_lanes)
    store = 5 * words + 1
    return load + write + scores + normalise + weighted + store + 1


class SomaDecode(wiring.Component):
    """One head's integer decode step over the tile's local memory (see the module docstring).

    Ports: ``start`` (pulse; the head's parameters on ``p_<name>`` and the addresses must hold until
    ``done``), ``state_base`` (word address of the head's state), ``stage_base`` (word address of q, k, v:
    three vectors of head_dim bytes), ``out_base`` (word address for the int8 output); memory ports
    ``rd_addr -> rd_data`` (synchronous read, one cycle) and ``wr_addr/wr_data/wr_en`` (``wr_en`` one bit
    per byte); and the :class:`RowNormaliser` it drives (``norm`` submodule, shared with the tile's HCCS
    command through ``norm_*`` pass-through when the unit is idle).
    """

    def __init__(self, params: TileParams, mem_words: int):
        self.params = params
        word = params.word_bytes
        super().__init__({
            "start": In(1), "done": Out(1), "busy": Out(1),
            "state_base": In(range(mem_words)), "stage_base": In(range(mem_words)),
            "out_base": In(range(mem_words)),
            "rd_addr": Out(range(mem_words)), "rd_data": In(8 * word),
            "wr_addr": Out(range(mem_words)), "wr_data": Out(8 * word), "wr_en": Out(word),
            # The normaliser's ports, driven by this unit while busy.
            "n_start": Out(1), "n_done": In(1), "n_count": Out(range(params.n_max + 1)),
            "n_use_exp": Out(1), "n_clb": Out(1), "n_out16": Out(1),
            "n_row_we": Out(1), "n_row_index": Out(range(params.n_max)), "n_row_x": Out(signed(8)),
            "n_row_valid": Out(1), "n_prob_index": Out(range(params.n_max)), "n_prob": In(16),
            **head_param_ports(),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        D, L, W = p.head_dim, p.mac_lanes, p.word_bytes
        words = D // W
        chunks = D // L
        slots, sinks, ring = p.slots, p.sinks, p.ring
        layout = {name: offset // W for name, offset, _, _ in regmap.state_layout(p)}
        par = {hp.name: getattr(self, f"p_{hp.name}") for hp in HEAD_PARAMS}
        gated = par["gating"] == HEAD_PARAMS[HEAD_INDEX["gating"]].choices.index("query")
        field_of_keys = par["field_source"] == HEAD_PARAMS[HEAD_INDEX["field_source"]].choices.index("keys")

        q = Signal(8 * D)
        k = Signal(8 * D)
        v = Signal(8 * D)
        fld = Signal(16 * D)
        gate_fld = Signal(16 * D)
        write_pos = Signal(32)
        fill = Signal(32)
        step = Signal(32)
        out = Signal(8 * D)
        wrote = Signal()

        # LOAD reads words 0..7*words (q, k, v, F, G, counters); the word read in cycle i arrives in i+1.
        load_sources = ([(self.stage_base + i, q, i) for i in range(words)] +
                        [(self.stage_base + words + i, k, i) for i in range(words)] +
                        [(self.stage_base + 2 * words + i, v, i) for i in range(words)] +
                        [(self.state_base + layout["field"] + i, fld, i) for i in range(2 * words)] +
                        [(self.state_base + layout["gate_field"] + i, gate_fld, i) for i in range(2 * words)] +
                        [(self.state_base + layout["counters"], None, 0)])
        counter = Signal(range(max(len(load_sources), slots * chunks, 5 * words + 1, D) + 2))
        m.d.comb += self.n_count.eq(slots)
        m.d.comb += [self.n_use_exp.eq(par["normaliser"] == 1), self.n_clb.eq(par["hccs_mode"] == 1),
                     self.n_out16.eq(0)]

        # SCORES: item i = (slot n, chunk c); K[n] chunk c sits at word key_base(n) + (c * L) // W, lane
        # group (c * L % W) // L of that word.
        n_issue = Signal(range(slots + 1))
        c_issue = Signal(range(chunks + 1))
        n_arrive = Signal(range(slots + 1))
        c_arrive = Signal(range(chunks + 1))
        arriving = Signal()
        acc = Signal(signed(32))
        dot = Signal(signed(32))
        dot_slot = Signal(range(slots + 1))
        dot_ready = Signal()

        def slot_word(region_sink: str, region_ring: str, n, c):
            in_sink = n < sinks
            base = Mux(in_sink, layout[region_sink], layout[region_ring])
            row_index = Mux(in_sink, n, n - sinks) if sinks else n
            return self.state_base + base + row_index * words + (c * L) // W

        def lane_group(data, c):
            if L >= W:
                return data
            return data.word_select(c % (W // L), 8 * L)

        def dot_lanes(a, b):
            terms = [a.word_select(l, 8).as_signed() * b.word_select(l, 8).as_signed() for l in range(L)]
            while len(terms) > 1:
                terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                         for i in range(0, len(terms), 2)]
            return terms[0]

        # Slot validity and distance from the current counters (after the write when include_self).
        sink_fill = Mux(step < sinks, step, sinks)

        def slot_valid(n):
            if sinks:
                return Mux(n < sinks, n < sink_fill, (n - sinks) < fill)
            return n < fill

        def slot_distance(n):
            j = (n - sinks).as_signed()
            age = Signal(signed(34))
            m.d.comb += age.eq(write_pos.as_signed() - 1 - j)
            wrapped = Mux(age < 0, age + ring, age)
            dist = wrapped + Mux(par["include_self"], 0, 1)
            return Mux(n < sinks, 0, dist) if sinks else dist

        # Logit of the completed dot product (registered in dot/dot_slot).
        scaled = rshift_round(dot * par["score_mult"], par["score_shift"])
        logit = Signal(signed(64))
        m.d.comb += logit.eq(scaled - par["recency_int"] * slot_distance(dot_slot))
        dot_valid = slot_valid(dot_slot)
        m.d.comb += [self.n_row_index.eq(dot_slot), self.n_row_valid.eq(dot_valid),
                     self.n_row_x.eq(Mux(dot_valid, saturate(logit, -128, 127), 0)),
                     self.n_row_we.eq(dot_ready)]

        # HCCS heads normalise through the streaming HCCS unit (hw/hccs.py): the row is kept in registers as
        # it is scored, fed in beats of hccs_lanes, and the probabilities come back in beats.
        unit_config = near_field_unit(p)
        hl = unit_config.lanes
        row_beats = unit_config.n_max // hl
        m.submodules.near_hccs = near_unit = hccs_unit.HCCS(config=unit_config)
        row_bits = Signal(8 * unit_config.n_max)
        row_valid = Signal(unit_config.n_max)
        prob_bits = Signal(8 * unit_config.n_max)
        feed_beat = Signal(range(row_beats + 1))
        drain_beat = Signal(range(row_beats + 1))
        use_exp = par["normaliser"] == HEAD_PARAMS[HEAD_INDEX["normaliser"]].choices.index("exp_int")
        with m.If(dot_ready):
            m.d.sync += [row_bits.word_select(dot_slot, 8).eq(self.n_row_x), row_valid.bit_select(dot_slot, 1).eq(dot_valid)]
        m.d.comb += [near_unit.i.payload.data.eq(row_bits.word_select(feed_beat, 8 * hl)),
                     near_unit.i.payload.mask.eq(row_valid.word_select(feed_beat, hl)),
                     near_unit.i.payload.first.eq(feed_beat == 0), near_unit.i.payload.last.eq(feed_beat == row_beats - 1),
                     near_unit.i.payload.head.eq(0), near_unit.o.ready.eq(1),
                     near_unit.cfg.payload.head.eq(0), near_unit.cfg.payload.params.B.eq(par["hccs_B"]),
                     near_unit.cfg.payload.params.S.eq(par["hccs_S"]), near_unit.cfg.payload.params.dmax.eq(par["hccs_dmax"]),
                     near_unit.cfg.payload.params.mode.eq(par["hccs_mode"]), near_unit.cfg.payload.params.out.eq(hccs.OUT_UINT8)]
        with m.If(near_unit.o.valid):
            m.d.sync += [prob_bits.word_select(drain_beat, 8 * hl).eq(near_unit.o.payload.data.as_value()),
                         drain_beat.eq(drain_beat + 1)]

        # Gate: z = q . G serially, in parallel with the normaliser.
        z = Signal(signed(48))
        gate = Signal(range(soma.GATE_ONE + 1))
        gate_index = Signal(range(D + 1))
        gate_busy = Signal()
        norm_busy = Signal()

        # WEIGHTED SUM: per chunk c, slots n; the final per-element stage runs over the chunk's L lanes.
        lane_acc = [Signal(signed(32), name=f"lane_acc{l}") for l in range(L)]
        lane_acc_array = Array(lane_acc)
        element = Signal(range(L + 1))
        d_index = Signal(range(D + 1))
        m.d.comb += self.n_prob_index.eq(n_arrive)

        gamma = par["gamma_q15"]
        f_old = fld.word_select(d_index, 16).as_signed()
        g_old = gate_fld.word_select(d_index, 16).as_signed()
        src = Mux(field_of_keys, k.word_select(d_index, 8), v.word_select(d_index, 8)).as_signed()
        k_d = k.word_select(d_index, 8).as_signed()

        def field_update(f, x):
            acc_f = gamma * f + (soma.GAMMA_Q15_ONE - gamma) * (x.as_signed() << soma.FIELD_FRAC_BITS)
            return rshift_round(acc_f, 15)[:16]

        near = saturate(rshift_round(lane_acc_array[element] * par["out_mult"], par["out_shift"]), -32768, 32767)
        far = saturate(rshift_round(f_old * par["alpha_mult"] * gate, par["alpha_shift"] + 7), -32768, 32767)
        out_element = saturate(near + far, -128, 127)[:8]

        # WRITE / STORE word sources.
        write_slot_word = Signal(range(2 * words + 1))

        def do_write_word(i):
            """Write word i of (k, v) into the slot the counters select; returns the memory address."""
            in_sink = step < sinks
            if sinks:
                k_base = Mux(in_sink, layout["sink_k"] + step * words, layout["ring_k"] + write_pos * words)
                v_base = Mux(in_sink, layout["sink_v"] + step * words, layout["ring_v"] + write_pos * words)
            else:
                k_base = layout["ring_k"] + write_pos * words
                v_base = layout["ring_v"] + write_pos * words
            if i < words:
                address, data = k_base + i, k.word_select(i, 8 * W)
            else:
                address, data = v_base + i - words, v.word_select(i - words, 8 * W)
            m.d.comb += [self.wr_addr.eq(self.state_base + address), self.wr_data.eq(data),
                         self.wr_en.eq((1 << W) - 1)]

        def advance_counters():
            with m.If(step >= sinks):
                m.d.sync += [write_pos.eq(Mux(write_pos == ring - 1, 0, write_pos + 1)),
                             fill.eq(Mux(fill < ring, fill + 1, fill))]
            m.d.sync += step.eq(Mux(step < soma.COUNTER_MAX, step + 1, step))

        store_sources = ([(self.state_base + layout["field"] + i, fld.word_select(i, 8 * W)) for i in range(2 * words)]
                         + [(self.state_base + layout["gate_field"] + i, gate_fld.word_select(i, 8 * W))
                            for i in range(2 * words)]
                         + [(self.state_base + layout["counters"], Cat(write_pos, fill, step))]
                         + [(self.out_base + i, out.word_select(i, 8 * W)) for i in range(words)])

        def enter_scores():
            m.d.sync += [n_issue.eq(0), c_issue.eq(0), arriving.eq(0), dot_ready.eq(0)]
            m.next = "SCORES"

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [counter.eq(0), wrote.eq(0)]
                    m.next = "LOAD"
            with m.State("LOAD"):
                m.d.comb += self.busy.eq(1)
                with m.Switch(counter):
                    for i, (addr, _, _) in enumerate(load_sources):
                        with m.Case(i):
                            m.d.comb += self.rd_addr.eq(addr)
                with m.Switch(counter):
                    for i, (_, target, part) in enumerate(load_sources):
                        with m.Case(i + 1):
                            if target is None:
                                m.d.sync += [write_pos.eq(self.rd_data[:32]), fill.eq(self.rd_data[32:64]),
                                             step.eq(self.rd_data[64:96])]
                            else:
                                m.d.sync += target.word_select(part, 8 * W).eq(self.rd_data)
                m.d.sync += counter.eq(counter + 1)
                with m.If(counter == len(load_sources)):
                    m.d.sync += write_slot_word.eq(0)
                    with m.If(par["include_self"]):
                        m.next = "WRITE"
                    with m.Else():
                        enter_scores()
            with m.State("WRITE"):
                m.d.comb += self.busy.eq(1)
                with m.Switch(write_slot_word):
                    for i in range(2 * words):
                        with m.Case(i):
                            do_write_word(i)
                m.d.sync += write_slot_word.eq(write_slot_word + 1)
                with m.If(write_slot_word == 2 * words - 1):
                    advance_counters()
                    m.d.sync += wrote.eq(1)
                    with m.If(wrote):
                        m.d.sync += counter.eq(0)
                        m.next = "STORE"
                    with m.Else():
                        enter_scores()
            with m.State("SCORES"):
                m.d.comb += self.busy.eq(1)
                issuing = n_issue < slots
                with m.If(issuing):
                    m.d.comb += self.rd_addr.eq(slot_word("sink_k", "ring_k", n_issue, c_issue))
                    with m.If(c_issue == chunks - 1):
                        m.d.sync += [c_issue.eq(0), n_issue.eq(n_issue + 1)]
                    with m.Else():
                        m.d.sync += c_issue.eq(c_issue + 1)
                m.d.sync += [arriving.eq(issuing), n_arrive.eq(n_issue), c_arrive.eq(c_issue)]
                partial = dot_lanes(q.word_select(c_arrive, 8 * L), lane_group(self.rd_data, c_arrive))
                m.d.sync += dot_ready.eq(0)
                with m.If(arriving):
                    with m.If(c_arrive == chunks - 1):
                        m.d.sync += [dot.eq(Mux(c_arrive == 0, 0, acc) + partial), dot_slot.eq(n_arrive),
                                     dot_ready.eq(1)]
                    with m.Else():
                        m.d.sync += acc.eq(Mux(c_arrive == 0, 0, acc) + partial)
                with m.If(~issuing & ~arriving & ~dot_ready):
                    m.d.sync += [gate_index.eq(0), z.eq(0), gate_busy.eq(1), norm_busy.eq(1), feed_beat.eq(0),
                                 drain_beat.eq(0)]
                    m.d.comb += [self.n_start.eq(use_exp), near_unit.cfg.valid.eq(~use_exp)]
                    m.next = "NORMALISE"
            with m.State("NORMALISE"):
                m.d.comb += self.busy.eq(1)
                with m.If(gate_busy):
                    m.d.sync += [z.eq(z + q.word_select(gate_index, 8).as_signed() *
                                      gate_fld.word_select(gate_index, 16).as_signed()),
                                 gate_index.eq(gate_index + 1)]
                    with m.If(gate_index == D - 1):
                        m.d.sync += gate_busy.eq(0)
                with m.If(~use_exp & (feed_beat < row_beats)):
                    m.d.comb += near_unit.i.valid.eq(1)
                    with m.If(near_unit.i.ready):
                        m.d.sync += feed_beat.eq(feed_beat + 1)
                with m.If(Mux(use_exp, self.n_done, near_unit.o.valid & near_unit.o.payload.last)):
                    m.d.sync += norm_busy.eq(0)
                with m.If(~gate_busy & ~norm_busy):
                    gate_value = soma.GATE_ONE // 2 + rshift_round(z * par["gate_mult"], par["gate_shift"])
                    m.d.sync += [gate.eq(Mux(gated, saturate(gate_value, 0, soma.GATE_ONE), soma.GATE_ONE)),
                                 n_issue.eq(0), c_issue.eq(0), arriving.eq(0), d_index.eq(0)]
                    m.next = "WEIGHTED"
            with m.State("WEIGHTED"):
                m.d.comb += self.busy.eq(1)
                issuing = n_issue < slots
                with m.If(issuing):
                    m.d.comb += self.rd_addr.eq(slot_word("sink_v", "ring_v", n_issue, c_issue))
                    m.d.sync += n_issue.eq(n_issue + 1)
                m.d.sync += [arriving.eq(issuing), n_arrive.eq(n_issue)]
                v_group = lane_group(self.rd_data, c_issue)
                with m.If(arriving):
                    prob = Mux(use_exp, self.n_prob[:8], prob_bits.word_select(n_arrive, 8))  # uint8
                    for l in range(L):
                        product = prob * v_group.word_select(l, 8).as_signed()
                        m.d.sync += lane_acc[l].eq(Mux(n_arrive == 0, 0, lane_acc[l]) + product)
                with m.If(~issuing & ~arriving):
                    m.d.sync += element.eq(0)
                    m.next = "FINAL"
            with m.State("FINAL"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [out.word_select(d_index, 8).eq(out_element),
                             fld.word_select(d_index, 16).eq(field_update(f_old, src)),
                             element.eq(element + 1), d_index.eq(d_index + 1)]
                with m.If(gated):
                    m.d.sync += gate_fld.word_select(d_index, 16).eq(field_update(g_old, k_d))
                with m.If(element == L - 1):
                    m.d.sync += [n_issue.eq(0), arriving.eq(0), c_issue.eq(c_issue + 1)]
                    with m.If(c_issue == chunks - 1):
                        m.d.sync += write_slot_word.eq(0)
                        with m.If(par["include_self"]):
                            m.d.sync += counter.eq(0)
                            m.next = "STORE"
                        with m.Else():
                            m.d.sync += wrote.eq(1)
                            m.next = "WRITE"
                    with m.Else():
                        m.next = "WEIGHTED"
            with m.State("STORE"):
                m.d.comb += self.busy.eq(1)
                with m.Switch(counter):
                    for i, (addr, data) in enumerate(store_sources):
                        with m.Case(i):
                            m.d.comb += [self.wr_addr.eq(addr), self.wr_data.eq(data), self.wr_en.eq((1 << W) - 1)]
                m.d.sync += counter.eq(counter + 1)
                with m.If(counter == len(store_sources) - 1):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"
        return m
