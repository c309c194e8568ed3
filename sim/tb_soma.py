"""cocotb testbench of the Soma decode unit inside the tile: token sequences through DECODE frames, checked
bit-exact against the integer model ``somatile.model.soma`` (``prefill`` of each head on its own config and
initial state), not against the tile model, so that the tile's command layer is not its own reference.

Inputs (:func:`job`): q, k, v int8 (T, H, D); per head a parameter block (HEAD_PARAMS order) and an
initial state (state bytes; all zero = fresh); ``measure``: token indices after which CYCLES_LAST is read
(those tokens run without idle cycles or backpressure, so the count is the ideal one). Outputs: ``out``
(T, H, D) from the RTL, int8 or, for a tile of the wide profile, int16; ``cycles`` (one per measured token),
``mismatches``.
"""

from __future__ import annotations

import dataclasses
import json

import cocotb
import numpy as np

from somatile.hw import regmap, tile_model
from somatile.hw.regmap import TileParams
from somatile.sim.tb_tile import TB


def job(params: TileParams, q, k, v, head_values, initial_states=None, *, measure=(), traffic: str = "random",
        seed: int = 1) -> dict[str, np.ndarray]:
    heads = q.shape[1]
    states = (np.zeros((heads, regmap.state_bytes(params)), np.uint8) if initial_states is None
              else np.asarray(initial_states, np.uint8))
    return {"q": np.asarray(q, np.int8), "k": np.asarray(k, np.int8), "v": np.asarray(v, np.int8),
            "head_values": np.asarray(head_values, np.int64), "states": states,
            "measure": np.asarray(sorted(measure), np.int64), "seed": np.array(seed),
            "config": np.array(json.dumps({"params": dataclasses.asdict(params), "traffic": traffic}))}


def output_dtype(params: TileParams) -> np.dtype:
    """The DECODE output element of the tile's profile (little-endian on the wire)."""
    return np.dtype("<i2" if params.profile == "wide" else np.int8)


def reference(params: TileParams, q, k, v, head_values, states) -> np.ndarray:
    """The model's output for every head: ``soma.prefill`` of (T, 1, D) slices from the head's state."""
    from somatile.model import soma

    out = np.empty(q.shape, output_dtype(params))
    for h in range(q.shape[1]):
        cfg = tile_model.head_config(params, head_values[h])
        arrays = tile_model.state_to_arrays(params, bytes(states[h]), cfg.gated)
        state = soma.SomaState.from_arrays(cfg, arrays)
        head_out, _ = soma.prefill(cfg, q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], state=state)
        out[:, h] = head_out[:, 0]
    return out


@cocotb.test()
async def decode_sequence(dut):
    from somatile.sim.runner import job_inputs, write_job_outputs

    inputs = job_inputs()
    config = json.loads(str(inputs["config"]))
    params = TileParams(**config["params"])
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    T, H, D = q.shape
    want = reference(params, q, k, v, inputs["head_values"], inputs["states"])
    measure = set(int(t) for t in inputs["measure"])
    tb = TB(dut, config["traffic"], int(inputs["seed"]))
    await tb.reset()

    async def ok(frame: bytes) -> bytes:
        response = regmap.unpack_response(await tb.command(frame))
        assert response.error == 0, f"opcode {frame[1]} head {frame[2]}: error {regmap.ErrorCode(response.error).name}"
        return response

    for h in range(H):
        await ok(tile_model.configure_frame(h, [int(x) for x in inputs["head_values"][h]]))
        if inputs["states"][h].any():
            await ok(regmap.pack_command(regmap.Opcode.LOAD_STATE, h, payload=inputs["states"][h].tobytes()))
    got = np.empty(q.shape, output_dtype(params))
    cycles = []
    cycles_frame = tile_model.reg_read_frame("CYCLES_LAST")
    for t in range(T):
        if t in measure:
            tb.set_traffic("full", 0)
        response = await ok(tile_model.decode_frame(0, q[t], k[t], v[t]))
        got[t] = np.frombuffer(response.payload, output_dtype(params))[:H * D].reshape(H, D)
        if t in measure:
            cycles.append((await ok(cycles_frame)).result)
            tb.set_traffic(config["traffic"], int(inputs["seed"]) + t)
    bad = np.argwhere(got != want)
    write_job_outputs(out=got, cycles=np.asarray(cycles, np.int64), mismatches=np.array(len(bad)))
    assert len(bad) == 0, (f"{len(bad)} output elements differ from the model; first at (token, head, lane) "
                           f"{tuple(bad[0])}: RTL {got[tuple(bad[0])]} model {want[tuple(bad[0])]}")
