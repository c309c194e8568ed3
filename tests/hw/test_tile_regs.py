"""The register read path (hw/tile_regs.py) in the Amaranth simulator: every address gives its register's
value after VALUE_LATENCY cycles and ok after OK_LATENCY, an address of no register gives ok = 0,
live inputs are read as they were VALUE_LATENCY - 1 cycles before, and addresses back to back pipeline."""

import numpy as np
from amaranth.sim import Simulator

from somatile.hw.tile_regs import OK_LATENCY, VALUE_LATENCY, RegisterReader


def test_every_address_reads_its_register_after_the_stated_latency_back_to_back():
    rng = np.random.default_rng(7)
    # 19 registers: constants and live ones interleaved, over more than two groups of the first multiplexer.
    addresses = [int(a) for a in rng.choice(np.arange(0, 0x4000, 4), 19, replace=False)]
    entries = [(a, int(rng.integers(0, 1 << 32)) if i % 3 else None) for i, a in enumerate(addresses)]
    live_values = [int(rng.integers(0, 1 << 32)) for _ in range(sum(v is None for _, v in entries))]
    dut = RegisterReader(entries)
    expected = {}
    live = iter(live_values)
    for a, v in entries:
        expected[a] = v if v is not None else next(live)
    probes = addresses + [0x4004, 0xFFFF_FFFC, addresses[0] + 0x10000] + addresses[::-1]
    seen = []

    async def bench(ctx):
        for port, value in zip(dut.live, live_values):
            ctx.set(port, value)
        for cycle in range(len(probes) + VALUE_LATENCY + 1):
            if cycle < len(probes):
                ctx.set(dut.address, probes[cycle])
            await ctx.tick()
            seen.append((ctx.get(dut.ok), ctx.get(dut.value)))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    for i, address in enumerate(probes):
        ok = seen[i + OK_LATENCY - 1][0]
        value = seen[i + VALUE_LATENCY - 1][1]
        assert ok == (address in expected), (hex(address), ok)
        if address in expected:
            assert value == expected[address], (hex(address), value)
