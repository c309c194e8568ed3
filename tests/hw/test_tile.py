"""The tile RTL in Verilator through cocotb: every command, every fault (each followed by valid commands),
reset in the middle of a frame, random idle input and output backpressure; every response byte-identical
to the golden tile model (the scoreboard in sim/tb_tile.py). Both profiles: the wide tile (int16 DECODE
output, the HCCS command over int16 rows with each normaliser) also in Amaranth's simulator, with the
measured CYCLES_LAST of every DECODE equal to ``expected_decode_cycles``."""

import dataclasses

import numpy as np
import pytest

from somatile.hw import regmap, tile_model
from somatile.hw.regmap import Opcode, TileParams
from somatile.hw.tile import Tile, expected_decode_cycles
from somatile.model import soma
from somatile.sim import run_soma, runner, tb_tile

# Two parameter sets share their builds with tests/hw/test_soma.py: a 32-bit stream with 8 lanes (16-byte
# memory words; the default test run), and a 128-bit stream with 32 lanes (32-byte words, int16 HCCS output,
# no sinks; slow: one more Verilator build).
SMALL = TileParams(lanes=8, stream_width=32, local_memory_bytes=8192, heads=4, ring=8, sinks=2, head_dim=16,
                   n_max=32)
WIDE = TileParams(lanes=32, stream_width=128, local_memory_bytes=16384, heads=4, ring=12, sinks=0,
                  head_dim=32, n_max=48, hccs_out="int16")
# SMALL's geometry in the wide profile (boards/sim_wide.yaml's profile).
WIDE_PROFILE = dataclasses.replace(SMALL, profile="wide")


def run_frames(params, frames, kinds=None, traffic="random", seed=1):
    job = tb_tile.job(params, frames, kinds, traffic=traffic, seed=seed)
    result = runner.build_and_test(Tile, dataclasses.asdict(params), "somatile_tile", "somatile.sim.tb_tile",
                                   inputs=job)
    assert int(result.outputs["mismatches"]) == 0
    return result


def logit_rows(rng, params, rows, n):
    """HCCS command logits of the tile's profile: int8, or int16 (moderate values and the int16 extremes)."""
    if params.profile != "wide":
        return rng.integers(-128, 128, (rows, n), dtype=np.int8)
    x = rng.integers(-3000, 3000, (rows, n)).astype(np.int16)
    x[rng.random(x.shape) < 0.1] = rng.choice([-32768, 32767])
    return x


def session(params, rng):
    """A command session that touches every opcode and every fault, each fault followed by valid work; the
    wide profile's HCCS command on a head of each of its normalisers, and its own configuration faults."""
    wide = params.profile == "wide"
    normalisers = soma.PROFILE_NORMALISERS[params.profile]
    configs = [run_soma.random_config(rng, params, normaliser=n)
               for n, _ in zip(list(normalisers) * params.heads, range(params.heads))]
    frames = [regmap.pack_command(Opcode.INFO)]
    frames += [regmap.pack_command(Opcode.REG_READ, arg0=r.address) for r in regmap.registers(params)]
    q, k, v = run_soma.sequence(rng, 40, params.heads, params.head_dim)
    token = iter(range(40))

    def decode():
        t = next(token)
        return tile_model.decode_frame(0, q[t], k[t], v[t])

    frames.append(decode())  # NOT_CONFIGURED
    frames += [tile_model.configure_frame(h, tile_model.head_values(c)) for h, c in enumerate(configs)]
    frames += [decode() for _ in range(6)]
    hccs_block = tile_model.head_values(configs[0])
    for name, value in (("hccs_B", 40), ("hccs_S", 1), ("hccs_dmax", 12)):
        hccs_block[regmap.HEAD_INDEX[name]] = value
    frames.append(tile_model.configure_frame(0, hccs_block))
    for n in (1, 17, params.n_max):
        frames.append(tile_model.hccs_frame(0, logit_rows(rng, params, 2, n), params.profile))
    if wide:
        # Every normaliser through the HCCS command (heads 1 and 2: exp and pwl2), a row of one value.
        frames += [tile_model.hccs_frame(h, logit_rows(rng, params, 3, n), "wide") for h in (1, 2) for n in (5, 24)]
        frames.append(tile_model.hccs_frame(2, np.full((1, 9), -32768, np.int16), "wide"))
    faults = [
        regmap.pack_command(Opcode.INFO, magic=0x5A),
        regmap.pack_command(0x7E, payload=bytes(16)),
        regmap.pack_command(Opcode.READ_STATE, head=params.heads),
        regmap.pack_command(Opcode.DECODE, head=params.heads - 1, count=2, payload=bytes(6 * params.head_dim)),
        regmap.pack_command(Opcode.REG_READ, arg0=0x0FC),
        regmap.pack_command(Opcode.REG_WRITE, arg0=0x000, arg1=1),
        regmap.pack_command(Opcode.HCCS, arg0=1, arg1=params.n_max + 1, payload=bytes(regmap.padded(params.n_max + 1))),
        regmap.pack_command(Opcode.HCCS, arg0=0, arg1=4),
        # The paper's exp head fails the HCCS rules; the wide profile normalises with the head's exp.
        regmap.pack_command(Opcode.HCCS, head=1, arg0=1, arg1=4, payload=bytes(16)),
        regmap.pack_command(Opcode.DECODE, count=1, payload=bytes(3 * params.head_dim), length=16),
        regmap.pack_command(Opcode.DECODE, count=1, payload=bytes(3 * params.head_dim))[:-16],
        regmap.pack_command(Opcode.DECODE, count=1, payload=bytes(3 * params.head_dim)) + bytes(16),
        regmap.pack_command(Opcode.DECODE, count=1),
        tile_model.configure_frame(1, [p.hi + 1 if p.name == "out_shift" else v
                                       for p, v in zip(regmap.HEAD_PARAMS, tile_model.head_values(configs[1]))]),
    ]
    if wide:
        head_table = regmap.PROFILE_HEAD_PARAMS["wide"]
        hccs_values = tile_model.head_values(configs[0])

        def changed(**fields):
            return [fields.get(hp.name, v) for hp, v in zip(head_table, hccs_values)]

        faults += [
            # rows * padded(2 n) beyond the staging area (int16 rows are twice the paper's)
            regmap.pack_command(Opcode.HCCS, arg0=regmap.staging_bytes(params) // regmap.hccs_row_bytes(
                params, params.n_max) + 1, arg1=params.n_max),
            tile_model.configure_frame(0, changed(hccs_B=0)),  # an HCCS head needs B >= 1
            tile_model.configure_frame(0, changed(hccs_B=100, hccs_S=65535, hccs_dmax=26)),  # B - (S dmax >> 8) < 0
            tile_model.configure_frame(0, changed(recency_int=32768)),
            tile_model.configure_frame(0, changed(normaliser=3)),
        ]
    if params.stream_bytes < regmap.HEADER_BYTES:
        faults.append(regmap.pack_command(Opcode.INFO)[:regmap.HEADER_BYTES - params.stream_bytes])
    for fault in faults:
        frames += [fault, tile_model.reg_read_frame("ERROR_CODE"), tile_model.reg_read_frame("ERROR_OPCODE"),
                   regmap.pack_command(Opcode.CLEAR_ERROR), decode()]
    state = tile_model.state_to_arrays(params, bytes(regmap.state_bytes(params)))
    state["write_pos"], state["fill"], state["step"] = np.int32(params.ring - 1), np.int32(params.ring), \
        np.int32(65536)
    frames += [regmap.pack_command(Opcode.READ_STATE, 1), tile_model.load_state_frame(params, 1, state),
               regmap.pack_command(Opcode.READ_STATE, 1), decode()]
    bad_state = dict(state, fill=np.int32(params.ring + 1))
    frames += [tile_model.load_state_frame(params, 1, bad_state), regmap.pack_command(Opcode.READ_STATE, 1),
               tile_model.load_state_frame(params, 1, state)[:-16], regmap.pack_command(Opcode.READ_STATE, 1)]
    frames += [regmap.pack_command(Opcode.RESET_STATE, 0, params.heads), regmap.pack_command(Opcode.READ_STATE, 0),
               regmap.pack_command(Opcode.REG_WRITE, arg0=[r.address for r in regmap.registers(params)
                                                           if r.name == "SCRATCH"][0], arg1=0xC0FFEE),
               tile_model.reg_read_frame("SCRATCH"), tile_model.reg_read_frame("COMMANDS"),
               tile_model.reg_read_frame("TOKENS"), decode()]
    return frames


def reset_session(params, rng):
    """Decode, a reset in the middle of a DECODE frame, then checks that the tile came back clean."""
    config = run_soma.random_config(rng, params)
    q, k, v = run_soma.sequence(rng, 4, params.heads, params.head_dim)
    configure = [tile_model.configure_frame(h, tile_model.head_values(config)) for h in range(params.heads)]
    decode = [tile_model.decode_frame(0, q[t], k[t], v[t]) for t in range(4)]
    frames = configure + decode[:2] + [decode[2], tile_model.reg_read_frame("CONFIGURED"),
                                       regmap.pack_command(Opcode.READ_STATE, 0)] + configure + \
        [decode[3], regmap.pack_command(Opcode.READ_STATE, 1)]
    kinds = [tb_tile.KIND_FRAME] * len(frames)
    kinds[len(configure) + 2] = tb_tile.KIND_RESET_MID_FRAME
    return frames, kinds


# A 128-bit stream over 16-byte words: one beat per word and a one-beat header, the response's own case of
# its read-ahead (the next word addressed as a word's only beat leaves).
ONE_BEAT = TileParams(lanes=16, stream_width=128, local_memory_bytes=8192, heads=2, ring=6, sinks=2, head_dim=16,
                      n_max=16)


@pytest.mark.parametrize("params", [SMALL, ONE_BEAT, pytest.param(WIDE, marks=pytest.mark.slow), WIDE_PROFILE],
                         ids=["32bit-8lanes", "128bit-16lanes", "128bit-32lanes", "wide-profile"])
def test_every_command_fault_and_reset_matches_the_model(params, rng):
    """The session's frames are sent back to back, without waiting for responses (the tile takes a frame in
    while a DECODE job computes: every command, fault and register read behind a DECODE must still answer as
    the model does, in order); then the reset session, frame by frame."""
    frames = session(params, rng)
    reset_frames, kinds = reset_session(params, rng)
    result = run_frames(params, frames + reset_frames, [tb_tile.KIND_PIPELINED] * len(frames) + kinds)
    responses = [regmap.unpack_response(r) for r in tb_tile.unpack_responses(result.outputs)]
    assert len(responses) == len(frames) + len(reset_frames) - 1  # the frame cut by the reset has none
    after_reset = responses[len(frames) + params.heads + 2:]
    assert after_reset[0].result == 0  # CONFIGURED: every head back to unconfigured
    assert not any(after_reset[1].payload)  # head 0's state cleared


def test_array_routes_frames_by_head_and_tiles_overlap(rng):
    """Two tiles on a 64-bit stream (the stream width the other tests do not cover by default)."""
    from somatile.hw.array import TileArray

    params = TileParams(lanes=4, stream_width=64, local_memory_bytes=4096, heads=1, ring=4, sinks=1, head_dim=16,
                        n_max=16, n_tiles=2)
    configs = [run_soma.random_config(rng, params) for _ in range(2)]
    q, k, v = run_soma.sequence(rng, 30, 2, params.head_dim)
    frames = [regmap.pack_command(Opcode.INFO, head=t) for t in range(2)]
    frames += [tile_model.configure_frame(h, tile_model.head_values(c)) for h, c in enumerate(configs)]
    kinds = [tb_tile.KIND_FRAME] * len(frames)
    for t in range(30):
        frames += [tile_model.decode_frame(h, q[t, h:h + 1], k[t, h:h + 1], v[t, h:h + 1]) for h in range(2)]
        kinds += [tb_tile.KIND_PIPELINED] * 2
    frames += [regmap.pack_command(Opcode.READ_STATE, 1), regmap.pack_command(Opcode.READ_STATE, 2),
               tile_model.reg_read_frame("TOKENS")]
    kinds += [tb_tile.KIND_FRAME] * 3
    job = tb_tile.job(params, frames, kinds, traffic="random", array=True)
    result = runner.build_and_test(TileArray, dataclasses.asdict(params), "somatile_array", "somatile.sim.tb_tile",
                                   inputs=job)
    assert int(result.outputs["mismatches"]) == 0
    responses = [regmap.unpack_response(r) for r in tb_tile.unpack_responses(result.outputs)]
    info = [np.frombuffer(r.payload, np.uint32) for r in responses[:2]]
    assert [i[regmap.INFO_FIELDS.index("tile_index")] for i in info] == [0, 1]
    assert responses[-2].error == regmap.ErrorCode.BAD_HEAD  # head 2 lies beyond the last tile


def count_byte_frames(params, rng):
    """Head 0 configured for HCCS, the others not: HCCS and the other one-head commands with count bytes
    0, 1, 2 and 255 (the RTL ignores the count of every command but DECODE and RESET_STATE), then the two
    counted commands with counts that leave the tile or name unconfigured heads."""
    config = run_soma.random_config(rng, params, normaliser="hccs_int")
    block = tile_model.head_values(config)
    for name, value in (("hccs_B", 40), ("hccs_S", 1), ("hccs_dmax", 12)):
        block[regmap.HEAD_INDEX[name]] = value
    x = rng.integers(-128, 128, (2, 12), dtype=np.int8)
    hccs = bytearray(tile_model.hccs_frame(0, x))
    frames = [tile_model.configure_frame(0, block)]
    for count in (0, 1, 2, 255):
        hccs[3] = count
        frames += [bytes(hccs), regmap.pack_command(Opcode.READ_STATE, 0, count),
                   regmap.pack_command(Opcode.RESET_STATE, 0, count),
                   regmap.pack_command(Opcode.DECODE, 0, count, bytes(3 * params.head_dim * min(count, 2)))]
    return frames


def test_the_tile_model_reads_the_count_byte_only_where_the_rtl_does(rng):
    # Issue 24: an HCCS frame with count 74 raised IndexError in the model (it checked heads head..head+count
    # for HCCS), and count 2 gave NOT_CONFIGURED where the RTL answers.
    frames = count_byte_frames(SMALL, rng)
    model = tile_model.TileModel(SMALL)
    responses = [regmap.unpack_response(model.command(f)) for f in frames]
    hccs = responses[1::4]
    assert all(r.error == 0 for r in hccs) and len({r.payload for r in hccs}) == 1
    assert all(r.error == 0 for r in responses[2::4])  # READ_STATE of head 0
    bad, ok = regmap.ErrorCode.BAD_HEAD, regmap.ErrorCode.OK
    assert [r.error for r in responses[3::4]] == [bad, ok, ok, bad]  # RESET_STATE
    assert [r.error for r in responses[4::4]] == [bad, ok, regmap.ErrorCode.NOT_CONFIGURED, bad]  # DECODE


def test_the_rtl_answers_count_bytes_0_1_2_and_255_like_the_model(rng):
    run_frames(SMALL, count_byte_frames(SMALL, rng))


def run_amaranth(params, frames):
    """Frames through the Tile in Amaranth's simulator, one after the other, with no idle input and no output
    backpressure (so that CYCLES_LAST is the stall-free count): the response frames."""
    from amaranth.sim import Simulator

    dut = Tile(**dataclasses.asdict(params))
    SB = params.stream_bytes
    responses = []

    async def bench(ctx):
        ctx.set(dut.m_axis_tready, 1)
        for frame in frames:
            words = [int.from_bytes(frame[i:i + SB], "little") for i in range(0, len(frame), SB)]
            sent = 0
            while sent < len(words):
                ctx.set(dut.s_axis_tdata, words[sent])
                ctx.set(dut.s_axis_tvalid, 1)
                ctx.set(dut.s_axis_tlast, sent == len(words) - 1)
                accepted = ctx.get(dut.s_axis_tready)
                await ctx.tick()
                sent += accepted
            ctx.set(dut.s_axis_tvalid, 0)
            response, last = b"", False
            while not last:
                valid, data, last = (ctx.get(s) for s in (dut.m_axis_tvalid, dut.m_axis_tdata, dut.m_axis_tlast))
                await ctx.tick()
                last = valid and last
                response += data.to_bytes(SB, "little") if valid else b""
            responses.append(response)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return responses


def test_the_wide_tile_answers_every_command_and_fault_like_the_model_in_amaranths_simulator(rng):
    """The Verilator session of the wide profile (every command and fault, decode over ring wrap-around, the
    HCCS command with each normaliser), then DECODE frames of one and of every head, each followed by a
    REG_READ of CYCLES_LAST: the measured cycles equal expected_decode_cycles (the model reads 0 there)."""
    params = WIDE_PROFILE
    frames = session(params, rng)
    configs = [run_soma.random_config(rng, params, normaliser=n) for n in ("pwl2_int", "exp_int", "hccs_int",
                                                                          "pwl2_int")]
    frames += [tile_model.configure_frame(h, tile_model.head_values(c)) for h, c in enumerate(configs)]
    q, k, v = run_soma.sequence(rng, 3, params.heads, params.head_dim)
    cycles_read = tile_model.reg_read_frame("CYCLES_LAST")
    measured = []
    for t in range(3):
        frames += [tile_model.decode_frame(2, q[t, 2:3], k[t, 2:3], v[t, 2:3]), cycles_read,
                   tile_model.decode_frame(0, q[t], k[t], v[t]), cycles_read]
        measured += [configs[2:3], configs]
    model = tile_model.TileModel(params)
    got = run_amaranth(params, frames)
    assert len(got) == len(frames)
    cycles = []
    for i, (frame, response) in enumerate(zip(frames, got)):
        want = model.command(frame)
        if frame == cycles_read:
            cycles.append(regmap.unpack_response(response).result)
            response = response[:8] + want[8:12] + response[12:]  # the model has no clock
        assert response == want, (i, frame[:16].hex())
    assert cycles[-len(measured):] == [expected_decode_cycles(params, c) for c in measured]
