"""The decode unit's stages (hw/soma.py) in Amaranth's own simulator, each driven as SomaDecode drives it (its
items from a tag line): exact results against the integer contract (docs/numerics.md, section Soma;
``soma_fixed``, ``hccs``) at the latency its constant states; the stages the wide profile changes (SCORES'
int16 logits, the near field through the wide normaliser, Q15 P.V, the int16 output) against its rows of the
table ("Two integer profiles"; ``soma_int.LIMITS``, ``wide``) on random and adversarial inputs."""

import dataclasses

import numpy as np
import pytest
from amaranth.hdl import Array, Cat, Const, Module, Signal
from amaranth.sim import Simulator

from somatile.hw.pipe import TagLine
from somatile.hw.soma import (FIELD_DEPTH, FINAL_DEPTH, GATE_DEPTH, HEAD_PARAMS_LAYOUT, PHASE_FINAL, PHASE_GATE,
                              PHASE_SCORES, PHASE_WEIGHTED, READ_LATENCY, WEIGHTED_DEPTH, FieldUpdate, GateStage,
                              NearFieldFeed, OutputStage, ScoreStage, StateMover, WeightedStage, element_bits,
                              element_lanes, head_params_layout, issue_shape, output_words)
from somatile.hw import regmap
from somatile.hw.regmap import HEAD_INDEX, HEAD_PARAMS, PROFILE_HEAD_PARAMS
from somatile.model import hccs, soma_int, wide
from somatile.model import soma_fixed as soma
from tests.hw.test_tile import SMALL, WIDE

# The two tile geometries in the wide profile (int16 logits, Q15 probabilities, int16 output).
SMALL_W, WIDE_W = (dataclasses.replace(p, profile="wide") for p in (SMALL, WIDE))


def choice(name, value):
    return HEAD_PARAMS[HEAD_INDEX[name]].choices.index(value)


class Issuer:
    """The decode unit's issue counter and tag line around a stage: the bench sets ``valid/last/phase/n/c``."""

    def __init__(self, m, params, depth):
        self.valid, self.last, self.phase = Signal(), Signal(), Signal(2)
        self.n, self.c = Signal(issue_shape(params)), Signal(range(params.head_dim // params.mac_lanes + 1))
        self.tags = TagLine(m, self.valid, self.last, self.phase, [self.n, self.c], depth, "tag")

    def item(self, stage, code):
        return Cat(*self.tags.at(stage, code))

    def issue(self, ctx, n, c, last, code):
        ctx.set(self.valid, 1), ctx.set(self.n, n), ctx.set(self.c, c), ctx.set(self.last, last)
        ctx.set(self.phase, code)


def word_value(row_bytes):
    return int.from_bytes(np.asarray(row_bytes, np.int8).tobytes(), "little")


def ram_words(values, dtype, params):
    """An ElementRam's words holding ``values`` as ``dtype`` elements, as Consts (indexed by a read address)."""
    raw = np.asarray(values, dtype).tobytes()
    word = params.word_bytes
    return [Const(int.from_bytes(raw[i:i + word], "little"), 8 * word) for i in range(0, len(raw), word)]


def simulate(m, bench):
    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def run_score_stage(p, q, K, counters, head):
    """The logits ScoreStage writes: {slot: (x, valid, last, cycle)}."""
    slots, chunks = p.slots, p.head_dim // p.mac_lanes
    m = Module()
    m.submodules.stage = stage = ScoreStage(p)
    issuer = Issuer(m, p, ScoreStage.depth(p) + 1)
    q_words = ram_words(q, np.int8, p)
    m.d.comb += [stage.read_item.eq(issuer.item(READ_LATENCY, PHASE_SCORES)),
                 stage.accumulate_item.eq(issuer.item(ScoreStage.accumulate_stage(p) - 1, PHASE_SCORES)),
                 stage.q.data.eq(Array(q_words)[stage.q.addr])]
    issued, rows = [(n, c) for n in range(slots) for c in range(chunks)], {}

    async def bench(ctx):
        ctx.set(stage.head, head_params_layout(p.profile).const(head))
        ctx.set(stage.counters, counters)
        for t in range(len(issued) + ScoreStage.depth(p) + 2):
            if t < len(issued):
                n, c = issued[t]
                issuer.issue(ctx, n, c, t == len(issued) - 1, PHASE_SCORES)
            else:
                ctx.set(issuer.valid, 0)
            if 0 <= t - READ_LATENCY < len(issued):
                n, c = issued[t - READ_LATENCY]
                w = c * p.mac_lanes // p.word_bytes
                ctx.set(stage.k_word, word_value(K[n, w * p.word_bytes:(w + 1) * p.word_bytes]))
            if ctx.get(stage.row.we):
                rows[ctx.get(stage.row.index)] = (ctx.get(stage.row.x), ctx.get(stage.row.valid),
                                                  ctx.get(stage.row.last), t)
            await ctx.tick()

    simulate(m, bench)
    assert [j for j in rows if rows[j][2]] == [slots - 1]
    assert rows[slots - 1][3] == len(issued) - 1 + ScoreStage.depth(p)
    assert ScoreStage.cycles(p) == len(issued) + ScoreStage.depth(p)
    return rows


def contract_logits(p, q, K, counters, head):
    """Steps 2-5 of the profile's decode table: (logit, valid) per slot (0 where masked)."""
    write_pos, fill, step = counters["write_pos"], counters["fill"], counters["step"]
    scores = K.astype(np.int64) @ q.astype(np.int64)
    out = []
    for j in range(p.slots):
        if j < p.sinks:
            valid, distance = j < min(step, p.sinks), 0
        else:
            valid = j - p.sinks < fill
            distance = (write_pos - 1 - (j - p.sinks)) % p.ring + (0 if head["include_self"] else 1)
        x = soma.saturate(soma.rshift_round(scores[j] * head["score_mult"], head["score_shift"])
                          - head["recency_int"] * distance, *soma_int.LIMITS[p.profile]["logit"])
        out.append(((int(x) if valid else 0), int(valid)))
    return out


@pytest.mark.parametrize("params", [SMALL, WIDE], ids=["small", "wide"])
def test_score_stage_logits_follow_the_contract_at_its_depth(params, rng):
    p = params
    q = rng.integers(-128, 128, p.head_dim)
    K = rng.integers(-128, 128, (p.slots, p.head_dim))
    counters = dict(write_pos=int(rng.integers(p.ring)), fill=int(rng.integers(p.ring + 1)), step=int(rng.integers(5)))
    head = dict(score_mult=int(rng.integers(1, 2000)), score_shift=int(rng.integers(4, 14)),
                recency_int=int(rng.integers(0, 20)), include_self=int(rng.integers(2)))
    rows = run_score_stage(p, q, K, counters, head)
    assert [rows[j][:2] for j in range(p.slots)] == contract_logits(p, q, K, counters, head)


def adversarial_scores(p, rng):
    """Keys that drive q . k to both ends of its range (q all 127: K rows of 127 and of -128) beside random ones."""
    q = np.full(p.head_dim, 127)
    K = rng.integers(-128, 128, (p.slots, p.head_dim))
    K[0::3], K[1::3] = 127, -128
    return q, K


@pytest.mark.parametrize("params", [SMALL_W, WIDE_W], ids=["small", "wide"])
@pytest.mark.parametrize("case", ["random", "saturating", "recency", "masked", "shift_extremes"])
def test_wide_score_stage_int16_logits_follow_the_contract(params, case, rng):
    """Step 5 of the wide profile: int16 logits, saturated at both ends, recency in 2^-8 bit units."""
    p = params
    q, K = rng.integers(-128, 128, p.head_dim), rng.integers(-128, 128, (p.slots, p.head_dim))
    counters = dict(write_pos=int(rng.integers(p.ring)), fill=p.ring, step=1 << 20)
    head = dict(score_mult=int(rng.integers(1, 32768)), score_shift=int(rng.integers(8, 20)),
                recency_int=int(rng.integers(0, 600)), include_self=int(rng.integers(2)))
    if case == "saturating":
        q, K = adversarial_scores(p, rng)
        head.update(score_mult=32767, score_shift=4, recency_int=0)
    elif case == "recency":  # a large penalty drives the far ring slots to -32768
        head.update(recency_int=32767, score_shift=20)
    elif case == "masked":  # empty slots: a partial ring, sinks still filling
        counters = dict(write_pos=2, fill=2, step=1)
    elif case == "shift_extremes":
        q, K = adversarial_scores(p, rng)
        head.update(score_mult=32767, score_shift=int(rng.choice([0, 47])), recency_int=32767)
    rows = run_score_stage(p, q, K, counters, head)
    want = contract_logits(p, q, K, counters, head)
    assert [rows[j][:2] for j in range(p.slots)] == want
    logits = [x for x, _ in want]
    if case in ("saturating", "shift_extremes"):
        assert {32767, -32768} <= set(logits) or head["score_shift"] == 47
    if case == "recency":
        assert -32768 in logits
    if case == "masked":
        assert 0 in [valid for _, valid in want]


@pytest.mark.parametrize("mode", ["div", "clb"])
def test_near_field_feed_returns_the_hccs_row_in_its_row_cycles(mode, rng):
    p = SMALL
    B, S, dmax = 40, 1, 12
    hccs.check_params(B, S, dmax, p.slots)
    x = rng.integers(-128, 128, p.slots)
    valid = rng.integers(0, 4, p.slots) > 0
    m = Module()
    m.submodules.stage = stage = NearFieldFeed(p)
    done_at = []

    async def bench(ctx):
        ctx.set(stage.head, HEAD_PARAMS_LAYOUT.const(dict(
            normaliser=choice("normaliser", "hccs_int"), hccs_mode=hccs.MODE_CODES[mode], hccs_B=B, hccs_S=S,
            hccs_dmax=dmax)))
        for j in range(p.slots):
            ctx.set(stage.row, {"we": 1, "last": j == p.slots - 1, "index": j, "valid": int(valid[j]), "x": int(x[j])})
            await ctx.tick()
        ctx.set(stage.row.we, 0), ctx.set(stage.start, 1)
        await ctx.tick()
        ctx.set(stage.start, 0)
        for t in range(1, 400):
            if ctx.get(stage.done):
                done_at.append(t)
            await ctx.tick()
        probs = ctx.get(stage.probs).to_bytes(len(stage.probs) // 8, "little")
        done_at.append(np.frombuffer(probs, np.uint8)[:p.slots])

    simulate(m, bench)
    want = hccs.hccs_int(x[None].astype(np.int8), B, S, dmax, mode=mode, mask=valid[None])[0]
    assert np.array_equal(done_at[-1], want)
    assert done_at[:-1] == [NearFieldFeed.row_cycles(p, mode)]


def wide_choice(name, value):
    return PROFILE_HEAD_PARAMS["wide"][HEAD_INDEX[name]].choices.index(value)


# (normaliser register, B, S, dmax) of wide heads: every normaliser, the clip inside and outside the row's spread;
# the exp head carries parameters it must ignore.
WIDE_HEADS = [("exp_int", 1234, 999, 77), ("hccs_int", 32768, 300, 20000), ("hccs_int", 20000, 50, 3000),
              ("pwl2_int", 0, 256, 65535), ("pwl2_int", 0, 700, 5000)]


def wide_rows(p, rng):
    """(x, valid) rows of int16 logits: random, both int16 ends (t = 65535), one valid slot, none, all equal."""
    n = p.slots
    rows = [(rng.integers(-3000, 3000, n), rng.integers(0, 4, n) > 0)]
    ends = rng.choice([wide.LOGIT_MIN, wide.LOGIT_MAX], n)
    ends[:2] = wide.LOGIT_MIN, wide.LOGIT_MAX
    rows.append((ends, np.ones(n, bool)))
    rows.append((rng.integers(-32768, 32768, n), np.arange(n) == n - 1))
    rows.append((rng.integers(-32768, 32768, n), np.zeros(n, bool)))
    rows.append((np.full(n, -5), rng.integers(0, 2, n) > 0))
    return rows


@pytest.mark.parametrize("params", [SMALL_W, WIDE_W], ids=["small", "wide"])
def test_wide_near_field_feed_returns_the_wide_row_in_its_row_cycles(params, rng):
    """Every head's row through the wide normaliser: Q15 probabilities of model/wide.py for each normaliser,
    row after row through one unit, ``done`` at row_cycles."""
    p = params
    cases = [(head, x, valid) for head in WIDE_HEADS for x, valid in wide_rows(p, rng)]
    m = Module()
    m.submodules.stage = stage = NearFieldFeed(p)
    got = []

    async def bench(ctx):
        for (name, B, S, dmax), x, valid in cases:
            ctx.set(stage.head, head_params_layout("wide").const(dict(
                normaliser=wide_choice("normaliser", name), hccs_B=B, hccs_S=S, hccs_dmax=dmax)))
            for j in range(p.slots):
                ctx.set(stage.row, {"we": 1, "last": j == p.slots - 1, "index": j, "valid": int(valid[j]),
                                    "x": int(x[j])})
                await ctx.tick()
            ctx.set(stage.row.we, 0), ctx.set(stage.start, 1)
            await ctx.tick()
            ctx.set(stage.start, 0)
            done_at = []
            for t in range(1, NearFieldFeed.row_cycles(p) + 3):
                if ctx.get(stage.done):
                    done_at.append(t)
                await ctx.tick()
            probs = np.frombuffer(ctx.get(stage.probs).to_bytes(len(stage.probs) // 8, "little"), "<u2")
            got.append((done_at, probs[:p.slots]))

    simulate(m, bench)
    for ((name, B, S, dmax), x, valid), (done_at, probs) in zip(cases, got, strict=True):
        want = wide.wide_softmax(x[None].astype(np.int16), name.removesuffix("_int"), B, S, dmax, mask=valid[None],
                                 impl="numpy")[0]
        assert np.array_equal(probs, want), (name, x, valid)
        assert done_at == [NearFieldFeed.row_cycles(p)]
    assert NearFieldFeed.row_cycles(p) == NearFieldFeed.row_cycles(p, "clb")


@pytest.mark.parametrize("gated", [True, False])
def test_gate_stage_gate_follows_the_contract_and_busy_falls_at_gate_depth(gated, rng):
    p = SMALL
    q = rng.integers(-128, 128, p.head_dim)
    G = rng.integers(-16384, 16257, p.head_dim)
    head = dict(gating=choice("gating", "query" if gated else "none"), gate_mult=int(rng.integers(1, 300)),
                gate_shift=int(rng.integers(10, 20)))
    m = Module()
    m.submodules.stage = stage = GateStage(p)
    issuer = Issuer(m, p, GATE_DEPTH + 1)
    q_words = ram_words(q, np.int8, p)
    m.d.comb += [stage.accumulate_item.eq(issuer.item(2, PHASE_GATE)),
                 stage.done_item.eq(issuer.item(GATE_DEPTH, PHASE_GATE)),
                 stage.q.data.eq(Array(q_words)[stage.q.addr]),
                 stage.gate_field.data.eq(Array(ram_words(G, np.int16, p))[stage.gate_field.addr])]
    seen = {}

    async def bench(ctx):
        ctx.set(stage.head, HEAD_PARAMS_LAYOUT.const(head))
        ctx.set(stage.restart, 1)
        await ctx.tick()
        ctx.set(stage.restart, 0)
        for t in range(p.head_dim + GATE_DEPTH + 2):
            if t < p.head_dim:
                issuer.issue(ctx, t, 0, t == p.head_dim - 1, PHASE_GATE)
                ctx.set(stage.advance, 1)
            else:
                ctx.set(issuer.valid, 0), ctx.set(stage.advance, 0)
            if not ctx.get(stage.busy) and "idle" not in seen:
                seen["idle"] = t
                ctx.set(stage.latch, 1)
            await ctx.tick()
            ctx.set(stage.latch, 0)
        seen["gate"] = ctx.get(stage.gate)

    simulate(m, bench)
    z = int(q @ G)
    want = soma.saturate(64 + soma.rshift_round(z * head["gate_mult"], head["gate_shift"]), 0, 128) if gated \
        else soma.GATE_ONE
    assert seen["gate"] == int(want)
    # The last element issued at head_dim - 1; busy falls GATE_DEPTH cycles later (low from the next cycle).
    assert seen["idle"] == p.head_dim - 1 + GATE_DEPTH + 1
    assert GateStage.cycles(p) == p.head_dim + GATE_DEPTH


def run_weighted_stage(p, P, V, chunk, head):
    """WeightedStage over one chunk: (acc after chunk_done, the chunk_done cycle); P from the near field's
    elements (and, paper, from the RowNormaliser's one-cycle read)."""
    L, slots = p.mac_lanes, p.slots
    m = Module()
    m.submodules.stage = stage = WeightedStage(p)
    issuer = Issuer(m, p, WEIGHTED_DEPTH + 1)
    probs = np.zeros(len(stage.probs) // element_bits(p), np.uint16 if p.profile == "wide" else np.uint8)
    probs[:slots] = P
    m.d.comb += [stage.prob_address_item.eq(issuer.item(READ_LATENCY - 2, PHASE_WEIGHTED)),
                 stage.prob_item.eq(issuer.item(READ_LATENCY - 1, PHASE_WEIGHTED)),
                 stage.accumulate_item.eq(issuer.item(WEIGHTED_DEPTH - 1, PHASE_WEIGHTED)),
                 stage.done_item.eq(issuer.item(WEIGHTED_DEPTH, PHASE_WEIGHTED)),
                 stage.n_issue.eq(issuer.n),
                 stage.probs.eq(int.from_bytes(probs.astype(probs.dtype.newbyteorder("<")).tobytes(), "little"))]
    if p.profile == "paper":  # the RowNormaliser's one-cycle read
        m.d.sync += stage.prob.eq(Array(Const(int(x), 16) for x in P)[stage.prob_index])
    seen = {}

    async def bench(ctx):
        ctx.set(stage.head, head_params_layout(p.profile).const(head))
        for t in range(slots + WEIGHTED_DEPTH + 2):
            ctx.set(issuer.valid, t < slots)
            if t < slots:
                issuer.issue(ctx, t, chunk, t == slots - 1, PHASE_WEIGHTED)
            if 0 <= t - READ_LATENCY < slots:
                w = chunk * L // p.word_bytes
                ctx.set(stage.v_word, word_value(V[t - READ_LATENCY, w * p.word_bytes:(w + 1) * p.word_bytes]))
            if ctx.get(stage.chunk_done):
                seen["done"] = t
            await ctx.tick()
            if "done" in seen and "acc" not in seen:
                seen["acc"] = [ctx.get(stage.acc[l]) for l in range(L)]

    simulate(m, bench)
    assert WeightedStage.cycles(p) == slots + WEIGHTED_DEPTH
    return seen["acc"], seen["done"]


@pytest.mark.parametrize("use_exp", [False, True])
def test_weighted_stage_sums_p_times_v_at_its_depth(use_exp, rng):
    p = SMALL
    L, slots = p.mac_lanes, p.slots
    P = rng.integers(0, 256, slots)
    V = rng.integers(-128, 128, (slots, p.head_dim))
    chunk = 1
    acc, done = run_weighted_stage(p, P, V, chunk, dict(normaliser=choice("normaliser",
                                                                          "exp_int" if use_exp else "hccs_int")))
    assert acc == list(P @ V[:, chunk * L:(chunk + 1) * L])
    assert done == slots - 1 + WEIGHTED_DEPTH


@pytest.mark.parametrize("params", [SMALL_W, WIDE_W], ids=["small", "wide"])
@pytest.mark.parametrize("case", ["random", "ones_low", "ones_high", "sparse"])
def test_wide_weighted_stage_sums_q15_p_times_v(params, case, rng):
    """Step 7 of the wide profile: Q15 probabilities (0..32768) times int8 values, every normaliser's head alike
    (the probabilities come from the near field for all of them)."""
    p = params
    L, slots, chunks = p.mac_lanes, p.slots, p.head_dim // p.mac_lanes
    P = rng.integers(0, wide.PROB_ONE + 1, slots)
    V = rng.integers(-128, 128, (slots, p.head_dim))
    if case in ("ones_low", "ones_high"):  # P = 1.0 at every slot against V at an int8 end: |acc| at its largest
        P[:] = wide.PROB_ONE
        V[:] = -128 if case == "ones_low" else 127
    elif case == "sparse":
        P[:] = 0
        P[rng.integers(slots)] = wide.PROB_ONE
    chunk = int(rng.integers(chunks))
    name = str(rng.choice(["hccs_int", "exp_int", "pwl2_int"]))
    acc, done = run_weighted_stage(p, P, V, chunk, dict(normaliser=wide_choice("normaliser", name)))
    assert acc == list(P @ V[:, chunk * L:(chunk + 1) * L])
    assert done == slots - 1 + WEIGHTED_DEPTH


def run_final(p, F, G, k, v, acc, gate, head):
    """OutputStage and FieldUpdate over every element, one pair per element of a group issued together
    (element_lanes, as the decode unit builds them): their writes {element: (value, cycle)} and FINAL's end."""
    L, D, chunks, E = p.mac_lanes, p.head_dim, p.head_dim // p.mac_lanes, element_lanes(p)
    m = Module()
    issuer = Issuer(m, p, FINAL_DEPTH + 1)
    k_words, v_words = ram_words(k, np.int8, p), ram_words(v, np.int8, p)
    pairs = []
    for e in range(E):
        m.submodules[f"output{e}"] = output = OutputStage(p, e)
        m.submodules[f"update{e}"] = update = FieldUpdate(p, e)
        m.d.comb += [output.write_item.eq(issuer.item(FINAL_DEPTH - 1, PHASE_FINAL)),
                     output.element_item.eq(issuer.item(FINAL_DEPTH, PHASE_FINAL)),
                     update.write_item.eq(issuer.item(FIELD_DEPTH - 1, PHASE_FINAL)),
                     update.element_item.eq(issuer.item(FIELD_DEPTH, PHASE_FINAL)),
                     output.field.data.eq(Array(ram_words(F, np.int16, p))[output.field.addr]),
                     output.gate_field.data.eq(Array(ram_words(G, np.int16, p))[output.gate_field.addr]),
                     output.k.data.eq(Array(k_words)[output.k.addr]), output.v.data.eq(Array(v_words)[output.v.addr]),
                     update.f_old.eq(output.f_old), update.g_old.eq(output.g_old), update.k_d.eq(output.k_d),
                     update.src.eq(output.src)]
        pairs.append((output, update))
    writes = {"out": {}, "field": {}, "gate": {}, "end": []}
    layout = head_params_layout(p.profile)

    async def bench(ctx):
        for output, update in pairs:
            ctx.set(output.head, layout.const(head)), ctx.set(update.head, layout.const(head))
            ctx.set(output.gate, gate), ctx.set(output.d_restart, 1), ctx.set(output.lane_restart, 1)
        await ctx.tick()
        for output, _ in pairs:
            ctx.set(output.d_restart, 0), ctx.set(output.lane_restart, 0)
        issued = [(g, c) for c in range(chunks) for g in range(L // E)]
        for t in range(len(issued) + FINAL_DEPTH + 2):
            if t < len(issued):
                g, c = issued[t]
                issuer.issue(ctx, g, c, g == L // E - 1, PHASE_FINAL)
            else:
                ctx.set(issuer.valid, 0)
            for output, update in pairs:
                ctx.set(output.advance, t < len(issued))
                if t < len(issued):
                    ctx.set(output.acc, [int(a) for a in acc[c * L:(c + 1) * L]])
                for name, port in (("out", output.out_write), ("field", update.field_write),
                                   ("gate", update.gate_write)):
                    if ctx.get(port.en):
                        element = ctx.get(port.element)
                        assert element not in writes[name], (name, element)
                        writes[name][element] = (ctx.get(port.value), t)
            if ctx.get(pairs[0][0].end):
                writes["end"].append(t)
            await ctx.tick()

    simulate(m, bench)
    return writes


def check_final(p, F, G, k, v, acc, gate, head, field_of_keys, gated):
    """The writes of run_final against steps 8, 10, 11 and 13 of the profile's table; the output elements."""
    D = p.head_dim
    writes = run_final(p, F, G, k, v, acc, gate, head)
    near = soma.saturate(soma.rshift_round(acc * head["out_mult"], head["out_shift"]), -32768, 32767)
    far = soma.saturate(soma.rshift_round(F * head["alpha_mult"] * gate, head["alpha_shift"] + 7), -32768, 32767)
    out = soma.saturate(near + far, *soma_int.LIMITS[p.profile]["out"])
    new_f = soma.field_update(F, k if field_of_keys else v, head["gamma_q15"])
    new_g = soma.field_update(G, k, head["gamma_q15"])
    E = element_lanes(p)  # element d is issued in cycle d // E, with its group
    for d in range(D):
        assert writes["out"][d] == (int(out[d]), d // E + FINAL_DEPTH), d
        assert writes["field"][d] == (int(new_f[d]) & 0xFFFF, d // E + FIELD_DEPTH), d
        if gated:
            assert writes["gate"][d] == (int(new_g[d]) & 0xFFFF, d // E + FIELD_DEPTH), d
    if not gated:
        assert writes["gate"] == {}
    assert writes["end"][0] == D // E - 1 + FINAL_DEPTH
    assert OutputStage.chunk_cycles(p) == p.mac_lanes // E
    return out


def final_head(rng, field_of_keys, gated, choose=choice):
    return dict(out_mult=int(rng.integers(1, 3000)), out_shift=int(rng.integers(8, 14)),
                alpha_mult=int(rng.integers(1, 3000)), alpha_shift=int(rng.integers(6, 12)),
                gamma_q15=int(rng.integers(0, 32768)), field_source=choose("field_source", "keys" if field_of_keys
                                                                           else "values"),
                gating=choose("gating", "query" if gated else "none"))


@pytest.mark.parametrize("field_of_keys, gated", [(True, True), (False, False)])
def test_output_stage_and_field_update_follow_the_contract_at_their_depths(field_of_keys, gated, rng):
    p = SMALL
    D = p.head_dim
    F, G = rng.integers(-16384, 16257, D), rng.integers(-16384, 16257, D)
    k, v = rng.integers(-128, 128, D), rng.integers(-128, 128, D)
    acc = rng.integers(-128 * 510, 128 * 510, D)
    gate = int(rng.integers(0, 129))
    head = final_head(rng, field_of_keys, gated)
    check_final(p, F, G, k, v, acc, gate, head, field_of_keys, gated)


@pytest.mark.parametrize("params", [SMALL_W, WIDE_W], ids=["small", "wide"])
@pytest.mark.parametrize("case", ["random", "saturating", "cancelling"])
def test_wide_output_stage_writes_int16_outputs(params, case, rng):
    """Step 11 of the wide profile: ``sat(near + far, -32768, 32767)``; the near and far terms each saturated at
    both int16 ends, their sum at both ends (and not where they cancel); the field updates as in the paper."""
    p = params
    D, n = p.head_dim, p.slots
    F, G = rng.integers(-16384, 16257, D), rng.integers(-16384, 16257, D)
    k, v = rng.integers(-128, 128, D), rng.integers(-128, 128, D)
    bound = 128 * (wide.PROB_ONE + n // 2)
    acc = rng.integers(-bound, bound + 1, D)
    gate = int(rng.integers(0, 129))
    field_of_keys, gated = bool(rng.integers(2)), bool(rng.integers(2))
    head = final_head(rng, field_of_keys, gated, wide_choice)
    head.update(out_mult=int(rng.integers(1, 32768)), out_shift=int(rng.integers(12, 20)))
    if case in ("saturating", "cancelling"):
        # Even elements with both terms at the int16 top, odd ones at the bottom ("saturating"), or each element's
        # two terms at opposite ends ("cancelling": 32767 - 32768).
        sign = np.where(np.arange(D) % 2 == 0, 1, -1)
        acc, F = sign * bound, sign * 16256
        if case == "cancelling":
            F = -F
        gate = soma.GATE_ONE
        head.update(out_mult=32767, out_shift=4, alpha_mult=32767, alpha_shift=0)
    out = check_final(p, F, G, k, v, acc, gate, head, field_of_keys, gated)
    if case == "saturating":
        assert {32767, -32768} == set(out.tolist())
    if case == "cancelling":
        assert set(out.tolist()) == {-1}



def run_state_mover(p, memory, bases, files):
    """LOAD, the field's run, WRITE and STORE through StateMover, each begun and held as the decode unit's
    sequencer does (the next phase's begin in the done cycle), the register files' words for WRITE and STORE
    from ``files``: the words LOAD writes {port: {address: word}}, the memory writes [(address, word,
    enables)], the counters after LOAD and after WRITE, the slot regions' rows and each phase's cycles (its
    level high through its done cycle)."""
    state_base, stage_base, out_base = bases
    m = Module()
    m.submodules.mover = mover = StateMover(p, p.local_memory_bytes // p.word_bytes)
    for name, words in files.items():
        port = getattr(mover, name)
        m.d.comb += port.data.eq(Array(words)[port.addr])
    loads = {name: {} for name in ("q_load", "k_load", "v_load", "field_load", "gate_field_load")}
    result = dict(loads=loads, writes=[], cycles={}, counters={})
    # The field's run has no level: the sequencer pulses begin_field (as NORMALISE begins) and its 2 w words
    # arrive READ_LATENCY cycles after their addresses.
    field_cycles = 2 * (p.head_dim // p.word_bytes) + READ_LATENCY
    phases = [("load", mover.begin_load, mover.loading, mover.load_done), ("field", mover.begin_field, None, None),
              ("write", mover.begin_write, mover.writing, mover.write_last),
              ("store", mover.begin_store, mover.storing, mover.store_done)]

    async def bench(ctx):
        ctx.set(mover.state_base, state_base), ctx.set(mover.out_base, out_base)
        ctx.set(mover.stage_base, stage_base), ctx.set(mover.begin_load, 1)
        await ctx.tick()
        ctx.set(mover.begin_load, 0)
        addresses = [None]
        for i, (name, _, level, done) in enumerate(phases):
            if level is not None:
                ctx.set(level, 1)
            cycles, finished = 0, False
            while not finished:
                assert cycles < 200, f"{name} never ends"
                t = len(addresses)
                if t >= READ_LATENCY and addresses[t - READ_LATENCY] is not None:
                    ctx.set(mover.rd_word, memory[addresses[t - READ_LATENCY]])
                addresses.append(ctx.get(mover.rd_addr) if name in ("load", "field") else None)
                for port_name, words in loads.items():
                    port = getattr(mover, port_name)
                    if ctx.get(port.en):
                        words[ctx.get(port.addr)] = ctx.get(port.data)
                if ctx.get(mover.wr_en):
                    result["writes"].append((ctx.get(mover.wr_addr), ctx.get(mover.wr_data), ctx.get(mover.wr_en)))
                cycles += 1
                finished = cycles == field_cycles if done is None else bool(ctx.get(done))
                if finished and i + 1 < len(phases):
                    ctx.set(phases[i + 1][1], 1)
                await ctx.tick()
            if level is not None:
                ctx.set(level, 0)
            if i + 1 < len(phases):
                ctx.set(phases[i + 1][1], 0)
            result["cycles"][name] = cycles
            result["counters"][name] = {f: ctx.get(mover.counters[f]) for f in ("write_pos", "fill", "step")}
        result["rows"] = {r: ctx.get(mover.rows[r]) for r in ("sink_k", "ring_k", "sink_v", "ring_v")}

    simulate(m, bench)
    return result


def advanced(p, counters):
    """The counters after a token's write (soma_fixed's state update): past the sinks the ring's position and
    fill advance, every count saturating."""
    write_pos, fill, step = counters["write_pos"], counters["fill"], counters["step"]
    if step >= p.sinks:
        write_pos, fill = (write_pos + 1) % p.ring, min(fill + 1, p.ring)
    return dict(write_pos=write_pos, fill=fill, step=min(step + 1, soma.COUNTER_MAX))


@pytest.mark.parametrize("params", [SMALL, WIDE, SMALL_W], ids=["small", "wide", "small-wide-profile"])
@pytest.mark.parametrize("case", ["sink", "ring", "saturated"])
def test_state_mover_loads_writes_and_stores_the_state_in_its_cycles(params, case, rng):
    p = params
    W, words = p.word_bytes, p.head_dim // p.word_bytes
    mem_words = p.local_memory_bytes // W
    offsets = {name: offset // W for name, offset, _, _ in regmap.state_layout(p)}
    state_base, stage_base = 3 * words, mem_words - 3 * words - 5
    out_base = mem_words - 3 * words - 5 - output_words(p) - 2
    counters = dict(write_pos=int(rng.integers(p.ring)), fill=int(rng.integers(p.ring + 1)),
                    step=int(rng.integers(p.sinks)) if case == "sink" and p.sinks else int(rng.integers(p.sinks, 10**6)))
    if case == "saturated":
        counters = dict(write_pos=p.ring - 1, fill=p.ring, step=soma.COUNTER_MAX)
    memory = {a: int.from_bytes(rng.bytes(W), "little") for a in range(mem_words)}
    field_row = state_base + offsets["field"]
    memory[field_row + 4 * words] = word_of([counters[f] for f in ("write_pos", "fill", "step")], np.uint32)
    out_dtype = np.int8 if element_bits(p) == 8 else np.int16
    values = dict(k=(np.int8, p.head_dim), v=(np.int8, p.head_dim), field=(np.int16, p.head_dim),
                  gate_field=(np.int16, p.head_dim), out=(out_dtype, p.head_dim))
    contents = {name: rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, n) for name, (dtype, n) in values.items()}
    files = {name: ram_words(contents[name], values[name][0], p) for name in values}
    result = run_state_mover(p, memory, (state_base, stage_base, out_base), files)

    # LOAD: q, k, v from the stage, the field and the gate field from the state, word by word; the counters.
    stage_words = [memory[stage_base + i] for i in range(3 * words)]
    state_words = [memory[field_row + i] for i in range(4 * words)]
    assert result["loads"] == {"q_load": dict(enumerate(stage_words[:words])),
                               "k_load": dict(enumerate(stage_words[words:2 * words])),
                               "v_load": dict(enumerate(stage_words[2 * words:])),
                               "field_load": dict(enumerate(state_words[:2 * words])),
                               "gate_field_load": dict(enumerate(state_words[2 * words:]))}
    assert result["counters"]["load"] == counters
    assert result["rows"] == {r: state_base + offsets[r] for r in ("sink_k", "ring_k", "sink_v", "ring_v")}

    # WRITE: k and v into the next sink slot while step < sinks, else the ring's slot write_pos.
    in_sink = counters["step"] < p.sinks
    slot = counters["step"] if in_sink else counters["write_pos"]
    region = "sink" if in_sink else "ring"
    every_byte = (1 << W) - 1
    expected = [(state_base + offsets[f"{region}_{name}"] + slot * words + i, file[i].value, every_byte)
                for name in ("k", "v") for file in [files[name]] for i in range(words)]
    # STORE: field, gate field, counters from the field's word on, then the output from out_base.
    after = advanced(p, counters)
    stored = ([file[i].value for name in ("field", "gate_field") for file in [files[name]] for i in range(2 * words)]
              + [word_of([after[f] for f in ("write_pos", "fill", "step")], np.uint32)])
    expected += [(field_row + i, word, every_byte) for i, word in enumerate(stored)]
    expected += [(out_base + i, files["out"][i].value, every_byte) for i in range(output_words(p))]
    assert result["counters"]["write"] == after
    assert result["writes"] == expected
    assert result["cycles"] == dict(load=StateMover.load_cycles(p), field=2 * words + READ_LATENCY,
                                    write=StateMover.write_cycles(p), store=StateMover.store_cycles(p))
    assert (StateMover.load_cycles(p), StateMover.write_cycles(p), StateMover.store_cycles(p)) == \
        (5 * words + 5, 2 * words, 4 * words + 1 + output_words(p))


def word_of(values, dtype):
    """The local-memory word (little-endian) that holds ``values`` as ``dtype``."""
    return int.from_bytes(np.asarray(values, dtype).tobytes(), "little")
