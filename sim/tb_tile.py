"""cocotb testbench of the tile (``hw/tile.py``): command frames through AXI4-Stream, the golden tile model
(``hw/tile_model.py``) as scoreboard.

Run through :func:`somatile.sim.runner.build_and_test` with the inputs of :func:`job`; the pytest side is
``tests/hw/test_tile.py`` and ``tests/hw/test_soma.py``. Every response is compared with the model's bytes
as it arrives; the only field compared differently is the result word of a REG_READ of CYCLES_LAST (the
model has no clock): it is recorded in the ``cycles`` output instead.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import random

import cocotb
import numpy as np

from somatile.hw import regmap, tile_model
from somatile.hw.regmap import TileParams

KIND_FRAME = 0
KIND_RESET_MID_FRAME = 1
"""Send the first half of the frame's beats, then pulse ``rst``: the frame gets no response."""
KIND_PIPELINED = 2
"""Send the frame without waiting for the previous responses (they are collected, in order, before the next
frame of another kind and at the end): frames to different tiles of an array then overlap."""


def job(params: TileParams, frames: list[bytes], kinds: list[int] | None = None, *, traffic: str = "full",
        seed: int = 1, tile_index: int = 0, array: bool = False) -> dict[str, np.ndarray]:
    """The ``inputs`` of one testbench run: frames in order, each with a kind, and the traffic pattern
    (``full``: no idle cycles and no backpressure; ``random``: random idle input and output backpressure).
    ``array=True``: the design is a TileArray of ``params.n_tiles`` tiles (scoreboard ArrayModel)."""
    kinds = [KIND_FRAME] * len(frames) if kinds is None else kinds
    offsets = np.cumsum([0] + [len(f) for f in frames]).astype(np.int64)
    return {"frames": np.frombuffer(b"".join(frames), np.uint8), "offsets": offsets,
            "kinds": np.asarray(kinds, np.int8), "seed": np.array(seed),
            "config": np.array(json.dumps({"params": dataclasses.asdict(params), "traffic": traffic,
                                           "tile_index": tile_index, "array": array}))}


def unpack_responses(outputs: dict[str, np.ndarray]) -> list[bytes]:
    data = outputs["responses"].tobytes()
    offsets = outputs["response_offsets"]
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


class TB:
    """The tile with an AXI-Stream source on ``s_axis`` and a sink on ``m_axis``."""

    def __init__(self, dut, traffic: str, seed: int):
        from cocotb.clock import Clock
        from cocotbext.axi import AxiStreamBus, AxiStreamSink, AxiStreamSource

        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
        for log in (self.source.log, self.sink.log):
            log.setLevel(logging.WARNING)  # toolchain pitfall 8: INFO per beat costs 2.5x
        self.set_traffic(traffic, seed)

    def set_traffic(self, traffic: str, seed: int):
        """``full``: input valid and output ready on every cycle; ``random``: about 30 % idle input cycles
        and 30 % output backpressure, from a seeded pattern."""
        if traffic == "random":
            rng = random.Random(seed)
            self.source.set_pause_generator(itertools.cycle([rng.random() < 0.3 for _ in range(997)]))
            self.sink.set_pause_generator(itertools.cycle([rng.random() < 0.3 for _ in range(991)]))
        else:
            for port in (self.source, self.sink):
                port.set_pause_generator(None)
                port.pause = False  # a killed generator may have left the port paused

    async def reset(self):
        from cocotb.triggers import RisingEdge

        self.dut.rst.value = 1
        for _ in range(2):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    async def command(self, frame: bytes) -> bytes:
        from cocotbext.axi import AxiStreamFrame

        await self.source.send(AxiStreamFrame(frame))
        response = await self.sink.recv()
        return bytes(response.tdata)

    async def reset_mid_frame(self, frame: bytes, stream_bytes: int):
        from cocotb.triggers import RisingEdge
        from cocotbext.axi import AxiStreamFrame

        beats = len(frame) // stream_bytes
        self.source.send_nowait(AxiStreamFrame(frame))
        accepted = 0
        while accepted < max(1, beats // 2):
            await RisingEdge(self.dut.clk)
            if self.dut.s_axis_tvalid.value and self.dut.s_axis_tready.value:
                accepted += 1
        await self.reset()


def _same_except_cycles(frame: bytes, got: bytes, want: bytes) -> bool:
    """Responses equal, except the result word of a REG_READ of CYCLES_LAST."""
    cycles_address = [n for n, _, _ in regmap.GLOBAL_REGISTERS].index("CYCLES_LAST") * regmap.REGISTER_BYTES
    is_cycles_read = (frame[1] == regmap.Opcode.REG_READ and
                      int.from_bytes(frame[8:12], "little") == cycles_address and want[3] == 0)
    if is_cycles_read and len(got) == len(want):
        return got[:8] == want[:8] and got[12:] == want[12:]
    return got == want


@cocotb.test()
async def run_frames(dut):
    """Send every frame of the job, compare each response with the tile model, write the outputs."""
    from somatile.sim.runner import job_inputs, write_job_outputs

    inputs = job_inputs()
    config = json.loads(str(inputs["config"]))
    params = TileParams(**config["params"])
    model = (tile_model.ArrayModel(params) if config["array"] else
             tile_model.TileModel(params, config["tile_index"]))
    tb = TB(dut, config["traffic"], int(inputs["seed"]))
    await tb.reset()
    data = inputs["frames"].tobytes()
    offsets = inputs["offsets"]
    responses, cycles, mismatches, pending = [], [], [], []

    def check(i, frame, got):
        want = model.command(frame)
        responses.append(got)
        if frame[1] == regmap.Opcode.REG_READ and len(got) >= 12:
            cycles.append(int.from_bytes(got[8:12], "little"))
        if not _same_except_cycles(frame, got, want):
            mismatches.append(f"frame {i} (opcode {frame[1]}, head {frame[2]}): RTL {got[:32].hex()}... "
                              f"model {want[:32].hex()}...")

    async def collect():
        for i, frame in pending:
            check(i, frame, bytes((await tb.sink.recv()).tdata))
        pending.clear()

    for i, kind in enumerate(inputs["kinds"]):
        frame = data[offsets[i]:offsets[i + 1]]
        if kind == KIND_PIPELINED:
            from cocotbext.axi import AxiStreamFrame

            tb.source.send_nowait(AxiStreamFrame(frame))
            pending.append((i, frame))
            continue
        await collect()
        if kind == KIND_RESET_MID_FRAME:
            await tb.reset_mid_frame(frame, params.stream_bytes)
            model.reset()
            continue
        check(i, frame, await tb.command(frame))
    await collect()
    write_job_outputs(responses=np.frombuffer(b"".join(responses), np.uint8),
                      response_offsets=np.cumsum([0] + [len(r) for r in responses]).astype(np.int64),
                      register_reads=np.asarray(cycles, np.int64), mismatches=np.array(len(mismatches)))
    assert not mismatches, f"{len(mismatches)} responses differ from the tile model; first: {mismatches[0]}"
