"""The SoC a board runs: a packaged soft RISC-V core running the C firmware, a UART to the host and, as the
CPU's peripheral, either the tile array on the firmware's tile bus or the HCCS unit alone on its own registers.

Parts (none of the CPU or the UART is written here):

- **CPU**: PicoRV32 (``pythondata-cpu-picorv32``, ``verilog/picorv32.v``): RV32IM (``cpu="picorv32"``), or RV32I
  without the barrel shifter (``"picorv32_rv32i"``; ``soc_map.CPU_OPTIONS``), with the cycle counters, on its
  native memory interface. It starts at :data:`CODE_BASE`; a trap (illegal instruction, misaligned access)
  stops it and raises the ``trap`` output.
- **Code memory** at :data:`CODE_BASE`: ``code_bytes`` of block RAM whose initial contents are the firmware
  image (``.text``, ``.rodata``, ``.data``), words little-endian. Writable, so ``.data`` needs no copy.
- **Data memory** at :data:`DATA_BASE`: ``data_bytes`` without initial contents (``.bss`` and the stack, which
  starts at its top): block RAM (``data_ram="block"``), or the iCE40 UltraPlus's SB_SPRAM256KA blocks in
  pairs (``"spram"``; ``data_bytes`` a multiple of 64 KiB). Both answer an access in the same cycles.
- **UART** at :data:`UART_BASE`: picosoc's ``simpleuart`` (from the same package) as the 8N1 bit engine,
  its one-byte receive buffer drained into a :class:`~amaranth.lib.fifo.SyncFIFOBuffered` of
  ``UART_RX_FIFO[peripheral]`` bytes, so that bursts of a frame at the full bit rate wait while the firmware
  works.
- **Tile bus** at :data:`TILE_BASE` (``peripheral="tile_array"``): the tile array's AXI4-Stream pair as
  registers. A write pushes one beat (with ``tlast`` at ``TILE_TX_LAST``) into a FIFO of :data:`TILE_TX_FIFO`
  beats; a read of ``TILE_RX`` pops the array's output beat. The firmware checks ``TILE_STATUS`` before
  either, so a stalled tile is a timeout in the firmware, never a stalled CPU bus.
- **HCCS registers** at :data:`HCCS_BASE` (``peripheral="hccs_unit"``): the 1-lane HCCS unit of hw/hccs.py,
  its row stream as registers (an element per write, its probability per read); the tile's command layer
  is then the firmware's (``firmware/hal/soc_hccs/``).

Register map (addresses in hw/soc_map.py, from which ``somatile_soc.h`` is generated; only the peripheral's
own registers answer, the other peripheral's read 0 and ignore writes):

=============== ====== ===========================================================================
register        access meaning
=============== ====== ===========================================================================
UART_DIV        r/w    clock cycles per bit (simpleuart's divider register)
UART_DATA       r/w    write: send the byte (the write waits while the previous byte is sent);
                       read: the oldest received byte, or 0xFFFFFFFF when none waits
UART_STATUS     r      bit 0: a received byte waits; bit 1: the receive FIFO overflowed (sticky)
TILE_TX         w      push a beat (tlast = 0); dropped when bit 0 of TILE_STATUS is 0
TILE_TX_LAST    w      push a beat (tlast = 1); dropped likewise
TILE_RX         r      the array's output beat, popped; 0 when bit 1 of TILE_STATUS is 0
TILE_STATUS     r      bit 0: room for a beat; bit 1: an output beat waits; bit 2: its tlast; bit 3: the
                       array's error output
HCCS_HEAD       w      the head whose parameters HCCS_CFG writes and whose parameters the next row uses
HCCS_CFG        w      the head's parameters (bit fields ``CFG_*_SHIFT`` of soc_map.HCCS_FIELDS: B, out,
                       S, mode, Dmax), for rows whose first element is pushed after the write
HCCS_IN         w      push the int8 element in bits 7:0 into the current row; dropped when bit 0 of
                       HCCS_STATUS is 0 (a row's first element is the one after the previous row's last)
HCCS_IN_LAST    w      push the row's last element likewise
HCCS_OUT        r      the oldest probability, popped: bits 15:0 its value, bit 16 the row's last, bit 31
                       set (0 when none waits)
HCCS_STATUS     r/w    read: bit 0 room for an element; bits 1-3 the unit's sticky overflow, framing and
                       bad_head; bit 4 busy. Write: clears the sticky bits
=============== ====== ===========================================================================

Clocks: the tile array runs in ``sync`` (the board's ``clock_mhz``). The CPU side (CPU, memories, UART, the
peripheral's registers; the HCCS unit with them) runs in ``cpu_domain``: ``sync`` as well (one clock), or a
domain of its own (``"cpu"``, the board's ``soc.cpu_mhz``: PicoRV32 and its bus need not make the tile's
clock). Then the tile bus crosses in two :class:`~amaranth.lib.fifo.AsyncFIFOBuffered` (the beats to the array
and the array's output beats, :data:`TILE_RX_FIFO`) and the array's error output in a two-flip-flop
synchroniser; the firmware sees the same registers, an answer a few cycles later.

Bus timing: every access takes three cycles (address decoded, the memory read and a register's side effect
in the first; the read value selected into a register in the second; the CPU's ``mem_ready`` in the third),
except UART_DATA writes, which wait for the transmitter in the first.

``hold`` (input) keeps the peripheral's output (the array's stream, the unit's probabilities) from being read
while it is high: a stalled tile for the fault tests; boards tie it low. ``error``: the array's error output,
or any of the HCCS unit's sticky status bits.
"""

from __future__ import annotations

from amaranth.hdl import Cat, ClockSignal, Const, DomainRenamer, Instance, Module, Mux, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import AsyncFIFOBuffered, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from somatile.hw.array import TileArray
from somatile.hw.hccs import HCCS
from somatile.hw.pipe import skid_buffer
from somatile.hw.soc_map import (CODE_BASE, CPU_OPTIONS, DATA_BASE, DATA_RAMS, HCCS_FIELDS, HCCS_IN_FIFO, PERIPHERALS,
                                 REGISTERS, SPRAM_PAIR_BYTES, TILE_RX_FIFO, TILE_TX_FIFO, UART_RX_FIFO, cpu_sources)


def image_words(image: bytes) -> list[int]:
    """A firmware image (``objcopy -O binary``) as little-endian 32-bit words, the last one zero-padded."""
    padded = image + bytes(-len(image) % 4)
    return [int.from_bytes(padded[i:i + 4], "little") for i in range(0, len(padded), 4)]


class Soc(wiring.Component):
    """CPU + code and data memory + UART + peripheral (see the module docstring for the map and timing).

    ``cpu_domain``: "sync" (the CPU side on the array's clock) or "cpu" (a clock domain of its own; the tile
    array's peripheral only).

    ``image``: the firmware (bytes, at most ``code_bytes``); ``uart_div``: the divider after reset (the
    firmware sets it again); ``peripheral``: one of :data:`~somatile.hw.soc_map.PERIPHERALS`; ``unit_kwargs``:
    the peripheral's (``BoardConfig.array_kwargs`` for the tile array; ``BoardConfig.hccs_kwargs`` of one lane
    and ``soc_map.HCCS_DIV_BITS`` for the HCCS unit); ``data_ram``: one of :data:`~somatile.hw.soc_map.DATA_RAMS`.
    """

    def __init__(self, *, image: bytes, code_bytes: int, data_bytes: int, uart_div: int, cpu: str = "picorv32",
                 peripheral: str = "tile_array", data_ram: str = "block", cpu_domain: str = "sync", **unit_kwargs):
        if len(image) > code_bytes:
            raise ValueError(f"firmware image of {len(image)} bytes does not fit code memory of {code_bytes}")
        for name, size in (("code_bytes", code_bytes), ("data_bytes", data_bytes)):
            if size % 4 or size <= 0:
                raise ValueError(f"{name} = {size}: expected a positive multiple of 4")
        if peripheral not in PERIPHERALS:
            raise ValueError(f"peripheral {peripheral!r}: expected one of {', '.join(PERIPHERALS)}")
        if data_ram not in DATA_RAMS:
            raise ValueError(f"data_ram {data_ram!r}: expected one of {', '.join(DATA_RAMS)}")
        if cpu_domain not in ("sync", "cpu"):
            raise ValueError(f"cpu_domain {cpu_domain!r}: expected 'sync' or 'cpu'")
        if cpu_domain != "sync" and peripheral != "tile_array":
            raise ValueError(f"cpu_domain {cpu_domain!r}: the {peripheral} runs on the CPU's clock, expected 'sync'")
        if data_ram == "spram" and data_bytes % SPRAM_PAIR_BYTES:
            raise ValueError(f"data_bytes = {data_bytes}: SPRAM data memory is made of pairs of 32 KiB blocks, "
                             f"expected a multiple of {SPRAM_PAIR_BYTES}")
        self.image, self.code_bytes, self.data_bytes = image, code_bytes, data_bytes
        self.uart_div, self.cpu, self.peripheral, self.data_ram = uart_div, cpu, peripheral, data_ram
        self.cpu_domain = cpu_domain
        self.sources = cpu_sources(cpu)
        if peripheral == "tile_array":
            self.unit = TileArray(**unit_kwargs)
        else:
            self.unit = HCCS(**unit_kwargs)
            if self.unit.config.lanes != 1:
                raise ValueError(f"lanes = {self.unit.config.lanes}: the HCCS registers carry one element per "
                                 f"write, expected an HCCS unit of 1 lane")
        super().__init__({"uart_tx": Out(1), "uart_rx": In(1), "trap": Out(1), "error": Out(1), "hold": In(1)})

    def elaborate(self, platform):
        m = Module()
        if platform is not None:
            for path in self.sources:
                platform.add_file(path.name, path.read_text())
        # The CPU side is written in its own module's "sync" and renamed to cpu_domain; the array stays in sync.
        core = Module()
        unit = self.unit
        bus = _CpuBus(core, self)
        code = _ram(core, "code", self.code_bytes, image_words(self.image))
        _uart(core, self, bus)
        if self.peripheral == "tile_array":
            m.submodules.array = unit
            _tile_bridge(m, core, self, bus, unit)
        else:
            core.submodules.hccs = unit
            _hccs_bridge(core, self, bus, unit)
        bus.connect_memory(core, code, CODE_BASE >> 28)
        if self.data_ram == "spram":
            bus.connect_spram(core, self.data_bytes, DATA_BASE >> 28)
        else:
            bus.connect_memory(core, _ram(core, "data", self.data_bytes, []), DATA_BASE >> 28)
        bus.finish(core)
        m.submodules.core = core if self.cpu_domain == "sync" else DomainRenamer(self.cpu_domain)(core)
        return m


class _CpuBus:
    """PicoRV32's native memory interface, decoded by the address's top nibble into regions."""

    def __init__(self, m: Module, soc: Soc):
        self.valid, self.ready = Signal(), Signal()
        self.addr, self.wdata, self.wstrb, self.rdata = Signal(32), Signal(32), Signal(4), Signal(32)
        self.region = self.addr[28:32]
        self.offset = self.addr[:28]
        self.start = Signal()         # the first cycle of an access: decode, block RAM read, register side effects
        self.second = Signal()        # the second: the read value selected into a register
        self.done = Signal()          # the third: mem_ready
        self.reg_rdata = Signal(32)   # a register's read value, latched in the first cycle
        self.stall = Signal()         # a register that cannot complete this cycle (UART transmitter busy)
        self.mem_reads: list[tuple[int, Signal]] = []
        m.d.comb += self.start.eq(self.valid & ~self.second & ~self.done)
        m.d.sync += [self.second.eq(self.start & ~self.stall), self.done.eq(self.second)]
        stack_top = DATA_BASE + soc.data_bytes
        options = {f"p_{name}": value for name, value in CPU_OPTIONS[soc.cpu].items()}
        m.submodules.cpu = Instance(
            "picorv32",
            p_ENABLE_COUNTERS=1, p_ENABLE_COUNTERS64=1, p_COMPRESSED_ISA=0, **options,
            p_CATCH_MISALIGN=1, p_CATCH_ILLINSN=1, p_PROGADDR_RESET=Const(CODE_BASE, 32),
            p_STACKADDR=Const(stack_top, 32),
            i_clk=ClockSignal("sync"), i_resetn=~ResetSignal("sync"),
            o_trap=soc.trap, o_mem_valid=self.valid, i_mem_ready=self.ready, o_mem_addr=self.addr,
            o_mem_wdata=self.wdata, o_mem_wstrb=self.wstrb, i_mem_rdata=self.rdata,
            i_pcpi_wr=0, i_pcpi_rd=0, i_pcpi_wait=0, i_pcpi_ready=0, i_irq=0)

    def hit(self, region: int):
        return self.start & (self.region == region)

    def connect_memory(self, m: Module, mem: Memory, region: int) -> None:
        depth = mem.depth
        rd = mem.read_port()
        wr = mem.write_port(granularity=8)
        word = self.offset[2:2 + (depth - 1).bit_length()]
        m.d.comb += [rd.addr.eq(word), wr.addr.eq(word), wr.data.eq(self.wdata)]
        # The decoded word index must stay inside the memory; beyond it the access reads or writes nothing.
        inside = (self.offset >> 2) < depth
        m.d.comb += wr.en.eq(Mux(self.hit(region) & inside, self.wstrb, 0))
        self._read_back(m, self.hit(region) & inside, rd.data, f"mem{region}")

    def connect_spram(self, m: Module, size: int, region: int) -> None:
        """``size`` bytes of SB_SPRAM256KA pairs (each 16K words of 32 bits: two blocks of 16 bits side by
        side) at ``region``. The blocks are single-ported: an access either reads (its word on DATAOUT a cycle
        later, like a block RAM's read port) or writes (nibble enables: each byte's two)."""
        word = self.offset[2:]
        for pair in range(size // SPRAM_PAIR_BYTES):
            selected = self.hit(region) & (word[14:] == pair)
            halves = []
            for half in range(2):
                strobes = self.wstrb[2 * half:2 * half + 2]
                data_out = Signal(16, name=f"spram{pair}_{half}_data")
                m.submodules[f"spram{pair}_{half}"] = Instance(
                    "SB_SPRAM256KA",
                    i_ADDRESS=word[:14], i_DATAIN=self.wdata[16 * half:16 * half + 16],
                    i_MASKWREN=Cat(strobes[0], strobes[0], strobes[1], strobes[1]), i_WREN=strobes.any(),
                    i_CHIPSELECT=selected, i_CLOCK=ClockSignal("sync"), i_STANDBY=0, i_SLEEP=0, i_POWEROFF=1,
                    o_DATAOUT=data_out)
                halves.append(data_out)
            self._read_back(m, selected, Cat(*halves), f"spram{pair}")

    def _read_back(self, m: Module, access, data, name: str) -> None:
        """A memory whose ``data`` answers ``access`` a cycle later joins the read multiplexer of :meth:`finish`."""
        was = Signal(name=f"was_{name}")
        m.d.sync += was.eq(access)
        self.mem_reads.append((was, data))

    def finish(self, m: Module) -> None:
        # The selected value is registered before it reaches the CPU: a block RAM's clock-to-output, the
        # selection and PicoRV32's decode of mem_rdata in one cycle were the SoC's longest path.
        out = self.reg_rdata
        for was, value in self.mem_reads:
            out = Mux(was, value, out)
        rdata = Signal(32, name="mem_rdata_reg")
        with m.If(self.second):
            m.d.sync += rdata.eq(out)
        m.d.comb += [self.rdata.eq(rdata), self.ready.eq(self.done)]


def _ram(m: Module, name: str, size: int, init: list[int]) -> Memory:
    mem = Memory(shape=32, depth=size // 4, init=init)
    m.submodules[name] = mem
    return mem


def _register(bus: _CpuBus, name: str):
    """The first cycle of an access to register ``name``."""
    addr = REGISTERS[name]
    return bus.hit(addr >> 28) & (bus.offset == (addr & 0x0FFF_FFFF))


def _uart(m: Module, soc: Soc, bus: _CpuBus):
    div_do, dat_do, dat_wait = Signal(32), Signal(32), Signal()
    dat_we, dat_re = Signal(), Signal()
    m.submodules.uart = Instance(
        "simpleuart", p_DEFAULT_DIV=soc.uart_div,
        i_clk=ClockSignal("sync"), i_resetn=~ResetSignal("sync"), o_ser_tx=soc.uart_tx, i_ser_rx=soc.uart_rx,
        i_reg_div_we=Mux(_register(bus, "UART_DIV"), bus.wstrb, 0), i_reg_div_di=bus.wdata, o_reg_div_do=div_do,
        i_reg_dat_we=dat_we, i_reg_dat_re=dat_re, i_reg_dat_di=bus.wdata, o_reg_dat_do=dat_do,
        o_reg_dat_wait=dat_wait)
    # The receive buffer (one byte) drains into the FIFO as soon as a byte is in it.
    m.submodules.uart_rx_fifo = fifo = SyncFIFOBuffered(width=8, depth=UART_RX_FIFO[soc.peripheral])
    received = dat_do != 0xFFFF_FFFF
    overflow = Signal()
    m.d.comb += [dat_re.eq(received), fifo.w_data.eq(dat_do[:8]), fifo.w_en.eq(received)]
    with m.If(received & ~fifo.w_rdy):
        m.d.sync += overflow.eq(1)
    writing = _register(bus, "UART_DATA") & bus.wstrb.any()
    m.d.comb += [dat_we.eq(writing), bus.stall.eq(writing & dat_wait)]
    reading = _register(bus, "UART_DATA") & ~bus.wstrb.any()
    m.d.comb += fifo.r_en.eq(reading)
    with m.If(reading):
        m.d.sync += bus.reg_rdata.eq(Mux(fifo.r_rdy, fifo.r_data, 0xFFFF_FFFF))
    with m.If(_register(bus, "UART_DIV")):
        m.d.sync += bus.reg_rdata.eq(div_do)
    with m.If(_register(bus, "UART_STATUS")):
        m.d.sync += bus.reg_rdata.eq(Cat(fifo.r_rdy, overflow))


def _tile_bridge(m: Module, core: Module, soc: Soc, bus: _CpuBus, array):
    """The tile bus registers (in ``core``, the CPU side) and the array's stream pair (in ``m``, the array's
    domain): beats cross in FIFOs, asynchronous ones where the CPU has a clock of its own."""
    width = array.params.stream_width
    if width != 32:
        raise ValueError(f"stream_width = {width}: the SoC's tile bus registers are 32 bits")
    crossing = soc.cpu_domain != "sync"
    if crossing:
        # Written from the CPU side (core's sync, renamed to cpu_domain), read by the array in sync.
        tx = AsyncFIFOBuffered(width=width + 1, depth=TILE_TX_FIFO + 1, w_domain=soc.cpu_domain, r_domain="sync")
        m.submodules.tile_tx_fifo = tx
    else:
        core.submodules.tile_tx_fifo = tx = SyncFIFOBuffered(width=width + 1, depth=TILE_TX_FIFO)
    push, push_last = _register(bus, "TILE_TX"), _register(bus, "TILE_TX_LAST")
    core.d.comb += [tx.w_data.eq(Cat(bus.wdata, push_last)), tx.w_en.eq(push | push_last)]
    # A register slice between the FIFO and the array: the array's ready (a choice among its tiles) reached
    # the FIFO's read port in one cycle, the ULX3S SoC's longest path (11.5 ns at 3be3c5a).
    taken, beat_in_valid, beat_in = skid_buffer(m, tx.r_rdy, tx.r_data, array.s_axis_tready, "tile_in")
    m.d.comb += [array.s_axis_tdata.eq(beat_in[:width]), array.s_axis_tlast.eq(beat_in[width]),
                 array.s_axis_tvalid.eq(beat_in_valid), tx.r_en.eq(taken)]
    if crossing:
        rx = AsyncFIFOBuffered(width=width + 1, depth=TILE_RX_FIFO + 1, w_domain="sync", r_domain=soc.cpu_domain)
        m.submodules.tile_rx_fifo = rx
        m.d.comb += [rx.w_data.eq(Cat(array.m_axis_tdata, array.m_axis_tlast)), rx.w_en.eq(array.m_axis_tvalid),
                     array.m_axis_tready.eq(rx.w_rdy)]
        beat_valid, beat_data, beat_last = rx.r_rdy, rx.r_data[:width], rx.r_data[width]
        error = Signal()
        m.submodules.tile_error_sync = FFSynchronizer(array.error, error, o_domain=soc.cpu_domain)
    else:
        beat_valid, beat_data, beat_last, error = array.m_axis_tvalid, array.m_axis_tdata, array.m_axis_tlast, array.error
    out_valid = beat_valid & ~soc.hold
    pop = _register(bus, "TILE_RX")
    popped = pop & out_valid
    if crossing:
        core.d.comb += rx.r_en.eq(popped)
    else:
        core.d.comb += array.m_axis_tready.eq(popped)
    with core.If(pop):
        core.d.sync += bus.reg_rdata.eq(Mux(out_valid, beat_data, 0))
    with core.If(_register(bus, "TILE_STATUS")):
        core.d.sync += bus.reg_rdata.eq(Cat(tx.w_rdy, out_valid, beat_last, error))
    m.d.comb += soc.error.eq(array.error)


def _hccs_bridge(m: Module, soc: Soc, bus: _CpuBus, unit):
    writing = bus.wstrb.any()
    head = Signal(unit.config.head_bits)
    with m.If(_register(bus, "HCCS_HEAD") & writing):
        m.d.sync += head.eq(bus.wdata)
    params = unit.cfg.payload.params
    m.d.comb += [unit.cfg.valid.eq(_register(bus, "HCCS_CFG") & writing), unit.cfg.payload.head.eq(head)]
    for field in ("B", "out", "S", "mode", "dmax"):
        shift = HCCS_FIELDS[f"CFG_{field.upper()}_SHIFT"]
        m.d.comb += params[field].eq(bus.wdata[shift:shift + len(params[field])])

    m.submodules.hccs_in_fifo = fifo = SyncFIFOBuffered(width=9, depth=HCCS_IN_FIFO)
    push_last = _register(bus, "HCCS_IN_LAST")
    m.d.comb += [fifo.w_data.eq(Cat(bus.wdata[:8], push_last)),
                 fifo.w_en.eq((_register(bus, "HCCS_IN") | push_last) & writing)]
    # A row starts with the element after the previous row's last (the unit checks first against last).
    in_row = Signal()
    beat = unit.i.payload
    m.d.comb += [unit.i.valid.eq(fifo.r_rdy), fifo.r_en.eq(unit.i.ready), beat.data[0].eq(fifo.r_data[:8]),
                 beat.mask.eq(1), beat.first.eq(~in_row), beat.last.eq(fifo.r_data[8]), beat.head.eq(head)]
    with m.If(unit.i.valid & unit.i.ready):
        m.d.sync += in_row.eq(~fifo.r_data[8])

    out_valid = unit.o.valid & ~soc.hold
    pop = _register(bus, "HCCS_OUT") & ~writing
    m.d.comb += unit.o.ready.eq(pop & out_valid)
    out_word = (unit.o.payload.data[0] | Mux(unit.o.payload.last, HCCS_FIELDS["OUT_LAST"], 0)
                | HCCS_FIELDS["OUT_VALID"])
    with m.If(pop):
        m.d.sync += bus.reg_rdata.eq(Mux(out_valid, out_word, 0))
    status = unit.status
    with m.If(_register(bus, "HCCS_STATUS")):
        m.d.sync += bus.reg_rdata.eq(Cat(fifo.w_rdy, status.overflow, status.framing, status.bad_head, status.busy))
    m.d.comb += [unit.clear_status.eq(_register(bus, "HCCS_STATUS") & writing),
                 soc.error.eq(status.overflow | status.framing | status.bad_head)]
