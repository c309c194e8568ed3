"""The SoC a board runs: a packaged soft RISC-V core running the C firmware, a UART to the host and the tile
array on the firmware's tile bus.

Parts (none of the CPU or the UART is written here):

- **CPU**: PicoRV32 (``pythondata-cpu-picorv32``, ``verilog/picorv32.v``), RV32IM with the cycle counters,
  on its native memory interface. It starts at :data:`CODE_BASE`; a trap (illegal instruction, misaligned
  access) stops it and raises the ``trap`` output.
- **Code memory** at :data:`CODE_BASE`: ``code_bytes`` of block RAM whose initial contents are the firmware
  image (``.text``, ``.rodata``, ``.data``), words little-endian. Writable, so ``.data`` needs no copy.
- **Data memory** at :data:`DATA_BASE`: ``data_bytes`` of block RAM without initial contents (``.bss`` and
  the stack, which starts at its top).
- **UART** at :data:`UART_BASE`: picosoc's ``simpleuart`` (from the same package) as the 8N1 bit engine,
  its one-byte receive buffer drained into a :class:`~amaranth.lib.fifo.SyncFIFOBuffered` of
  :data:`UART_RX_FIFO` bytes, so that bursts of a frame at the full bit rate wait while the firmware works.
- **Tile bus** at :data:`TILE_BASE`: the tile array's AXI4-Stream pair as registers. A write pushes one
  beat (with ``tlast`` at ``TILE_TX_LAST``) into a FIFO of :data:`TILE_TX_FIFO` beats; a read of
  ``TILE_RX`` pops the array's output beat. The firmware checks ``TILE_STATUS`` before either, so a stalled
  tile is a timeout in the firmware, never a stalled CPU bus.

Register map (addresses in hw/soc_map.py, from which ``somatile_soc.h`` is generated):

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
=============== ====== ===========================================================================

Bus timing: every access takes three cycles (address decoded, the block RAM read and a register's side
effect in the first; the read value selected into a register in the second; the CPU's ``mem_ready`` in the
third), except UART_DATA writes, which wait for the transmitter in the first.

``hold`` (input) keeps the array's output stream from being read while it is high: a stalled tile for the
fault tests; boards tie it low.
"""

from __future__ import annotations

from amaranth.hdl import Cat, ClockSignal, Const, Instance, Module, Mux, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from somatile.hw.array import TileArray
from somatile.hw.soc_map import CODE_BASE, DATA_BASE, REGISTERS, TILE_TX_FIFO, UART_RX_FIFO, cpu_sources


def image_words(image: bytes) -> list[int]:
    """A firmware image (``objcopy -O binary``) as little-endian 32-bit words, the last one zero-padded."""
    padded = image + bytes(-len(image) % 4)
    return [int.from_bytes(padded[i:i + 4], "little") for i in range(0, len(padded), 4)]


class Soc(wiring.Component):
    """CPU + code and data memory + UART + tile array (see the module docstring for the map and timing).

    ``image``: the firmware (bytes, at most ``code_bytes``); ``uart_div``: the divider after reset (the
    firmware sets it again); ``tile_kwargs``: the tile array's (``BoardConfig.array_kwargs``).
    """

    def __init__(self, *, image: bytes, code_bytes: int, data_bytes: int, uart_div: int, cpu: str = "picorv32",
                 **tile_kwargs):
        if len(image) > code_bytes:
            raise ValueError(f"firmware image of {len(image)} bytes does not fit code memory of {code_bytes}")
        for name, size in (("code_bytes", code_bytes), ("data_bytes", data_bytes)):
            if size % 4 or size <= 0:
                raise ValueError(f"{name} = {size}: expected a positive multiple of 4")
        self.image, self.code_bytes, self.data_bytes = image, code_bytes, data_bytes
        self.uart_div, self.cpu = uart_div, cpu
        self.sources = cpu_sources(cpu)
        self.array = TileArray(**tile_kwargs)
        super().__init__({"uart_tx": Out(1), "uart_rx": In(1), "trap": Out(1), "error": Out(1), "hold": In(1)})

    def elaborate(self, platform):
        m = Module()
        if platform is not None:
            for path in self.sources:
                platform.add_file(path.name, path.read_text())
        m.submodules.array = array = self.array
        bus = _CpuBus(m, self)
        code = _ram(m, "code", self.code_bytes, image_words(self.image))
        data = _ram(m, "data", self.data_bytes, [])
        _uart(m, self, bus)
        _tile_bridge(m, self, bus, array)
        bus.connect_memory(m, code, CODE_BASE >> 28)
        bus.connect_memory(m, data, DATA_BASE >> 28)
        bus.finish(m)
        m.d.comb += self.error.eq(array.error)
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
        m.submodules.cpu = Instance(
            "picorv32",
            p_ENABLE_COUNTERS=1, p_ENABLE_COUNTERS64=1, p_ENABLE_MUL=1, p_ENABLE_DIV=1, p_COMPRESSED_ISA=0,
            p_BARREL_SHIFTER=1, p_CATCH_MISALIGN=1, p_CATCH_ILLINSN=1, p_PROGADDR_RESET=Const(CODE_BASE, 32),
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
        was = Signal(name=f"was_mem{region}")
        m.d.sync += was.eq(self.hit(region) & inside)
        self.mem_reads.append((was, rd.data))

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
    m.submodules.uart_rx_fifo = fifo = SyncFIFOBuffered(width=8, depth=UART_RX_FIFO)
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


def _tile_bridge(m: Module, soc: Soc, bus: _CpuBus, array: TileArray):
    width = array.params.stream_width
    if width != 32:
        raise ValueError(f"stream_width = {width}: the SoC's tile bus registers are 32 bits")
    m.submodules.tile_tx_fifo = tx = SyncFIFOBuffered(width=width + 1, depth=TILE_TX_FIFO)
    push, push_last = _register(bus, "TILE_TX"), _register(bus, "TILE_TX_LAST")
    m.d.comb += [tx.w_data.eq(Cat(bus.wdata, push_last)), tx.w_en.eq(push | push_last),
                 array.s_axis_tdata.eq(tx.r_data[:width]), array.s_axis_tlast.eq(tx.r_data[width]),
                 array.s_axis_tvalid.eq(tx.r_rdy), tx.r_en.eq(array.s_axis_tready)]
    out_valid = array.m_axis_tvalid & ~soc.hold
    pop = _register(bus, "TILE_RX")
    m.d.comb += array.m_axis_tready.eq(pop & out_valid)
    with m.If(pop):
        m.d.sync += bus.reg_rdata.eq(Mux(out_valid, array.m_axis_tdata, 0))
    with m.If(_register(bus, "TILE_STATUS")):
        m.d.sync += bus.reg_rdata.eq(Cat(tx.w_rdy, out_valid, array.m_axis_tlast, array.error))
