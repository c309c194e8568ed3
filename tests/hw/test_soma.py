"""The Soma decode unit in the tile RTL (Verilator through cocotb): long token sequences bit-exact against
the integer model (sim/tb_soma.py checks every output element against ``soma.prefill``), and O(1) decode:
cycles per token at sequence position 128 and at 65,536 (state loaded through LOAD_STATE) identical and equal
to ``expected_decode_cycles``. The wide profile's decode unit also runs in Amaranth's simulator on a Python
model of the local memory, bit-exact against ``soma.decode_step`` (the wide tile: tests/hw/test_tile.py)."""

import dataclasses
import re

import numpy as np
import pytest

from somatile.hw import tile_model
from somatile.hw.tile import expected_decode_cycles
from somatile.model import soma
from somatile.sim import run_soma
from tests.hw.test_regmap import SMALL_BOARD
from tests.hw.test_tile import SMALL, WIDE


# Per head: normaliser, HCCS mode, write order, field source, gating; together every option of the model.
HEAD_OPTIONS = [
    dict(normaliser="hccs_int", hccs_mode="div", include_self=True, gating="query"),
    dict(normaliser="exp_int", include_self=False, gating="none", field_source="keys"),
    dict(normaliser="hccs_int", hccs_mode="clb", include_self=False, gating="none", field_source="values"),
    dict(normaliser="exp_int", include_self=True, gating="query"),
]


def configs_for(params, rng):
    out = []
    for h in range(params.heads):
        options = dict(HEAD_OPTIONS[h % len(HEAD_OPTIONS)])
        mode = options.pop("hccs_mode", "div")
        out.append(run_soma.random_config(rng, params, **options).replace(hccs_mode=mode))
    return out


# The default suite runs SMALL's 1,000 tokens through the C++ stream harness
# (tests/sim/test_regress.py::test_a_long_sequence_of_every_head_option_is_bit_exact_and_cycle_exact); through
# cocotb they are a sweep.
@pytest.mark.slow
@pytest.mark.parametrize("params, tokens", [(SMALL, 1000), (WIDE, 400)], ids=["small", "wide"])
def test_long_sequences_are_bit_exact(params, tokens, rng):
    configs = configs_for(params, rng)
    q, k, v = run_soma.sequence(rng, tokens, params.heads, params.head_dim)
    result = run_soma.run_decode(params, q, k, v, [tile_model.head_values(c) for c in configs], measure=[128],
                                 seed=tokens)
    assert int(result.outputs["mismatches"]) == 0
    assert result.outputs["out"].shape == q.shape
    # The ring wrapped many times and the outputs are not trivially constant.
    assert tokens > 10 * (params.ring + params.sinks)
    assert len(np.unique(result.outputs["out"])) > 20
    assert list(result.outputs["cycles"]) == [expected_decode_cycles(params, configs)]


def far_state(params, cfg, rng, position):
    """A full state at sequence ``position``: ring and sinks filled, random contents, a random field."""
    state = soma.SomaState.empty(cfg)
    q, k, v = run_soma.sequence(rng, params.slots + 7, 1, params.head_dim)
    soma.prefill(cfg, q, k, v, state=state)
    arrays = state.to_arrays()
    arrays["step"] = np.int32(position)
    arrays["write_pos"] = np.int32(int(rng.integers(params.ring)))
    return bytes(tile_model.arrays_to_state(params, arrays))


def test_cycles_per_token_at_position_65536_equal_those_at_128(rng):
    """Position 128 is measured in tests/sim/test_regress.py (and the slow test_long_sequences_are_bit_exact);
    both equal the same formula."""
    params = SMALL
    configs = configs_for(params, rng)
    values = [tile_model.head_values(c) for c in configs]
    q, k, v = run_soma.sequence(rng, 20, params.heads, params.head_dim)
    states = np.stack([np.frombuffer(far_state(params, c, rng, 65536), np.uint8) for c in configs])
    far = run_soma.run_decode(params, q, k, v, values, states, measure=[0, 10], seed=4)
    expected = expected_decode_cycles(params, configs)
    assert list(far.outputs["cycles"]) == [expected, expected]
    assert int(far.outputs["mismatches"]) == 0


def wide_config(rng, params, normaliser, *, fallback=False, include_self, gating, field_source="values"):
    """A one-head integer SomaConfig of the wide profile for the tile's geometry, from a float config with random
    scales (``soma_int.integer_config``); ``fallback`` makes the head a fallback head (the integer exp)."""
    from somatile.model import soma_int

    base = soma.SomaConfig(
        n_heads=1, head_dim=params.head_dim, ring=params.ring, sinks=params.sinks, profile="wide",
        normaliser=normaliser, fallback=(True,) if fallback else None, include_self=include_self,
        field_source=field_source, gating=gating, alpha=float(rng.uniform(0.1, 0.6)),
        recency=float(rng.choice([0.0, 0.1, 0.3])), gamma=float(rng.uniform(0.8, 0.99)),
        hccs_c=float(rng.uniform(2.0, 8.0)))
    scale = float(rng.uniform(1 / 64, 1 / 16))
    return soma_int.integer_config(base, q_scale=scale, k_scale=scale, v_scale=scale,
                                   out_scale=float(rng.uniform(1 / 512, 1 / 128)))


class DecodeMemory:
    """The tile's local memory as the decode unit sees it, in Python: words of ``word_bytes`` bytes, two
    synchronous reads (the word at the previous cycle's ``rd_addr``, and at ``v_rd_addr``; the old word when
    that cycle wrote it) and a byte-enabled write."""

    def __init__(self, words: int, word_bytes: int):
        self.word_bytes = word_bytes
        self.words = [0] * words

    def store(self, address: int, data: bytes):
        for i in range(0, len(data), self.word_bytes):
            self.words[address + i // self.word_bytes] = int.from_bytes(data[i:i + self.word_bytes], "little")

    def load(self, address: int, nbytes: int) -> bytes:
        count = nbytes // self.word_bytes
        return b"".join(w.to_bytes(self.word_bytes, "little") for w in self.words[address:address + count])

    async def step(self, ctx, dut) -> int:
        """One decode step from the cycle of ``start`` (set by the caller) through ``done``: its cycles."""
        cycle, done_at = 0, None
        while done_at is None:
            rd_addr, wr_addr, wr_en, wr_data = (ctx.get(s) for s in (dut.rd_addr, dut.wr_addr, dut.wr_en, dut.wr_data))
            if ctx.get(dut.done):
                done_at = cycle
            read, v_read = self.words[rd_addr], self.words[ctx.get(dut.v_rd_addr)]
            await ctx.tick()
            ctx.set(dut.start, 0)
            if wr_en:
                mask = sum(0xFF << (8 * b) for b in range(self.word_bytes) if wr_en >> b & 1)
                self.words[wr_addr] = (self.words[wr_addr] & ~mask) | (wr_data & mask)
            ctx.set(dut.rd_data, read)
            ctx.set(dut.v_rd_data, v_read)
            cycle += 1
        return done_at

    async def token(self, ctx, dut, heads) -> int:
        """One token's heads through the unit as the tile runs them: head h + 1 started (its ``head`` and bases
        set, ``start`` pulsed) the cycle after ``handed`` is seen for head h, so that its front runs beside head
        h's back; ``heads`` are (head parameters, state_base, stage_base, out_base). From the cycle of the first
        ``start`` through the last ``done``: the cycles, and the heads' done order."""

        def begin(h):
            value, state_base, stage_base, out_base = heads[h]
            ctx.set(dut.head, value), ctx.set(dut.state_base, state_base), ctx.set(dut.stage_base, stage_base)
            ctx.set(dut.out_base, out_base), ctx.set(dut.start, 1)

        begin(0)
        started, dones, cycle = 1, 0, 0
        while True:
            rd_addr, v_rd_addr, wr_addr, wr_en, wr_data = (ctx.get(s) for s in (
                dut.rd_addr, dut.v_rd_addr, dut.wr_addr, dut.wr_en, dut.wr_data))
            dones += ctx.get(dut.done)
            handed = ctx.get(dut.handed)
            read, v_read = self.words[rd_addr], self.words[v_rd_addr]
            await ctx.tick()
            ctx.set(dut.start, 0)
            if handed and started < len(heads):
                begin(started)
                started += 1
            if wr_en:
                mask = sum(0xFF << (8 * b) for b in range(self.word_bytes) if wr_en >> b & 1)
                self.words[wr_addr] = (self.words[wr_addr] & ~mask) | (wr_data & mask)
            ctx.set(dut.rd_data, read)
            ctx.set(dut.v_rd_data, v_read)
            if dones == len(heads):  # the last store's word is written in the done cycle
                return cycle
            cycle += 1


# Two chunks of 32 lanes over two slots: a chunk's FINAL issue (32 cycles) outlasts the next chunk's weighted
# sum, so the unit issues it before that chunk (soma.final_overlaps is false; SMALL's chunks overlap).
SERIAL_FINAL = dataclasses.replace(SMALL, lanes=32, head_dim=64, ring=2, sinks=0)


@pytest.mark.parametrize("overlap", [False, True], ids=["one-head-at-a-time", "heads-overlapped"])
@pytest.mark.parametrize("geometry", [SMALL, SERIAL_FINAL], ids=["final-beside-weighted", "serial-final"])
def test_wide_decode_unit_is_bit_exact_in_the_amaranth_simulator(geometry, overlap, rng):
    """SomaDecode of the wide profile on a Python model of the local memory: every head's int16 output and its
    whole state after every step equal soma.decode_step's, over ring wrap-around, for every normaliser (and a
    fallback head's integer exp), both write orders, gated and ungated; one head starts at position 65,536.
    Every step takes expected_cycles. Both orders of a chunk's FINAL and the next chunk's weighted sum. With
    ``overlap`` a token's heads run as the tile runs them (each started as the previous one is handed to the
    unit's back), and every token takes soma.overlapped_cycles."""
    from amaranth.sim import Simulator

    from somatile.hw import regmap
    from somatile.hw.soma import (SomaDecode, expected_cycles, final_overlaps, head_params_layout, output_words,
                                  overlapped_cycles)

    params = dataclasses.replace(geometry, profile="wide")
    assert final_overlaps(params) == (geometry is SMALL) and params.head_dim > params.mac_lanes
    configs = [wide_config(rng, params, "hccs_int", include_self=True, gating="query"),
               wide_config(rng, params, "exp_int", include_self=False, gating="none", field_source="keys"),
               wide_config(rng, params, "pwl2_int", include_self=False, gating="none"),
               wide_config(rng, params, "pwl2_int", fallback=True, include_self=True, gating="query")]
    tokens = 2 * params.slots + 5
    W, words = params.word_bytes, params.head_dim // params.word_bytes
    state_words = regmap.state_bytes(params) // W
    stage_base = len(configs) * state_words
    out_base = stage_base + 3 * words * len(configs)
    memory = DecodeMemory(out_base + output_words(params) * len(configs), W)
    states = [soma.SomaState.empty(c) for c in configs]
    far = soma.SomaState.from_arrays(configs[2], tile_model.state_to_arrays(
        params, far_state(params, configs[2], rng, 65536), gated=False))
    states[2] = far
    for h, state in enumerate(states):
        memory.store(h * state_words, bytes(tile_model.arrays_to_state(params, state.to_arrays())))
    q, k, v = run_soma.sequence(rng, tokens, len(configs), params.head_dim)
    dut = SomaDecode(params, len(memory.words))
    layout = head_params_layout("wide")
    outputs, cycles = [], []

    def head(h):  # (parameters, state_base, stage_base, out_base) of head h: each head's areas its own
        return (layout.const(dict(zip(layout.members, tile_model.head_values(configs[h])))), h * state_words,
                stage_base + 3 * words * h, out_base + output_words(params) * h)

    def collect(h):
        outputs.append((memory.load(head(h)[3], regmap.decode_out_bytes(params)),
                        memory.load(h * state_words, regmap.state_bytes(params))))

    async def bench(ctx):
        for t in range(tokens):
            for h in range(len(configs)):
                memory.store(head(h)[2], np.stack([q[t, h], k[t, h], v[t, h]]).tobytes())
            if overlap:
                cycles.append(await memory.token(ctx, dut, [head(h) for h in range(len(configs))]))
                for h in range(len(configs)):
                    collect(h)
                continue
            for h in range(len(configs)):
                value, state_base, stage, out = head(h)
                ctx.set(dut.head, value), ctx.set(dut.state_base, state_base), ctx.set(dut.stage_base, stage)
                ctx.set(dut.out_base, out), ctx.set(dut.start, 1)
                cycles.append(await memory.step(ctx, dut))
                collect(h)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    got = iter(outputs)
    all_out = []
    for t in range(tokens):
        for h, cfg in enumerate(configs):
            want, states[h] = soma.decode_step(cfg, states[h], q[t, h][None], k[t, h][None], v[t, h][None])
            out_bytes, state_bytes = next(got)
            assert np.array_equal(np.frombuffer(out_bytes, "<i2"), want[0]), (t, h)
            assert state_bytes == bytes(tile_model.arrays_to_state(params, states[h].to_arrays())), (t, h)
            all_out.append(want[0])
    if overlap:
        assert cycles == [overlapped_cycles(params, configs)] * tokens
    else:
        assert cycles == [expected_cycles(params, c.normaliser) for c in configs] * tokens
    assert len(np.unique(all_out)) > 20


def test_sim_command_runs_a_decode_sequence_in_either_profile(capsys):
    """`somatile sim soma --profile NAME`: the tile RTL in Verilator against the integer model of that profile.
    The tile is made small with ``--set``, as test_regmap's is, so that the two share their Verilator builds."""
    from somatile.host.cli import main

    small = [f"--set={k}={v}" for k, v in SMALL_BOARD.items()]
    for profile in ("paper", "wide"):
        assert main(["sim", "soma", "--tokens", "40", "--heads", "2", "--profile", profile, *small]) == 0
        out = capsys.readouterr().out
        assert f"profile='{profile}'" in out and "tokens 40 x heads 2: mismatches 0" in out
        measured, expected = re.search(r"measured (\d+), expected (\d+)", out).groups()
        assert measured == expected
    with pytest.raises(SystemExit, match="head_dim"):
        main(["sim", "soma", "--set", "head_dim=7"])
