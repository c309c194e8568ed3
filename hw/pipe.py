"""Pipeline building blocks shared by the decode unit and the row normaliser (hw/soma.py).

Each helper adds registers to a module and returns the registered result; its docstring states the latency
in cycles. They keep every register-to-register path to at most one carry chain, one 18x18 multiplier or
one barrel shifter, so that the units reach the boards' clock (docs/hardware.md, "What limits the clock";
the measured Fmax is in docs/boards.md).
The arithmetic is exact: widths are derived from the operands' shapes, never truncated.
"""

from __future__ import annotations

import operator
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Mux, Shape, Signal, signed, unsigned
from amaranth.lib.memory import Memory
from amaranth.utils import ceil_log2

MUL_SPLIT = 17
"""Low part of a split product: an unsigned 17-bit slice times a <= 18-bit signed operand fits one 18x18."""


def block_ram(m, name: str, shape, depth: int, reads: int = 1):
    """A Memory for a block RAM with one write port and ``reads`` synchronous read ports, each given as
    ``SimpleNamespace(addr, data)`` (one, or a list of ``reads``): ``data`` is the word at the ``addr`` of the
    previous cycle (latency 1), the old word when that cycle also wrote it, exactly like
    ``Memory.read_port()``.

    Each is built as an asynchronous read port plus a register, on a memory with the ``no_rw_check``
    attribute: Yosys' memory_dff merges the register into the port and, for such a port, takes the word
    read in a cycle that writes the same address as undefined. The ECP5's block RAM cannot return the old
    word across its two ports, so a plain ``read_port()`` gets some 300 flip-flops and a multiplexer after
    the block RAM per 128 bits to emulate it. The units using this never consume a word read in a cycle
    that wrote its address (the exact simulations, where the old word is returned, would show it). With two
    read ports Yosys keeps one copy of the memory per read port, each written alike (a block RAM has one
    write port beside each read port)."""
    m.submodules[name] = memory = Memory(shape=shape, depth=depth, init=[], attrs={"no_rw_check": 1})
    ports = []
    for i in range(reads):
        port = memory.read_port(domain="comb")
        data = Signal.like(port.data, name=f"{name}_rdata" + (str(i) if i else ""))
        m.d.sync += data.eq(port.data)
        ports.append(SimpleNamespace(addr=port.addr, data=data))
    return memory, (ports[0] if reads == 1 else ports)


def reg(m, value, name: str | None = None, shape=None, *, reset_less: bool = True):
    """``value`` registered once (latency 1). ``shape`` defaults to the value's own shape.

    Without a reset by default: a pipeline register holds a function of the previous cycle and is refilled
    one cycle after a reset, and leaving the reset off the datapath keeps the reset net (on the whole tile it
    would reach every pipeline flip-flop across the die) to the state that needs it. Pass
    ``reset_less=False`` for a register whose value must be 0 in the cycle after a reset (a valid flag or a
    write enable that reaches state outside the pipeline)."""
    out = Signal(shape if shape is not None else value.shape(), name=name, reset_less=reset_less)
    m.d.sync += out.eq(value)
    return out


REPLICA_ATTR = "somatile_replica"
"""Attribute of the wires of replicated registers; the board build (boards/build.py, ``REPLICA_SCRIPT``)
marks the flip-flops driving them ``keep``, so that Yosys does not merge the copies back into one."""


class Replicated:
    """A register kept as ``copies`` flip-flops that always hold the same value, each for one group of loads
    (e.g. one multiplier of a row of them): a net that reaches a row of DSP blocks or a thousand flip-flop
    enables spans the die (its routing alone can take most of a cycle), a copy beside each group does not.

    ``eq`` assigns every copy; ``copy(i)`` reads one. Without the ``keep`` the board build puts on them
    (:data:`REPLICA_ATTR`), Yosys' opt_merge folds identical flip-flops into one (checked)."""

    def __init__(self, shape, copies: int, name: str, init=0):
        self._copies = [Signal(shape, name=f"{name}_r{i}", init=init, attrs={REPLICA_ATTR: 1})
                        for i in range(copies)]

    def eq(self, value):
        return [copy.eq(value) for copy in self._copies]

    def increment(self, by: int = 1):
        """Every copy counts up by ``by`` from its own value (a counter kept as copies)."""
        return [copy.eq(copy + by) for copy in self._copies]

    def copy(self, i: int):
        return self._copies[i]


def share_of(i: int, count: int, copies: int) -> int:
    """The copy of a :class:`Replicated` register (of ``copies``) that steers item ``i`` of ``count`` items
    split into equal shares in order (the last share may be shorter)."""
    return i // -(-count // copies)


class OffsetCounter:
    """A counter kept as one register per reader: copy i holds the count minus ``offsets[i]`` (modulo its
    width), so that a reader addressing a memory at count - offset has no subtractor in front of its address
    (a subtractor and the LUT RAM read behind it do not fit one cycle on the ECP5 tile).

    ``set(value)`` (a constant) and ``increment()`` assign every copy; ``at(i)`` reads copy i."""

    def __init__(self, shape, offsets, name: str):
        self._offsets = list(offsets)
        self._copies = [Signal(shape, name=f"{name}_o{offset}") for offset in self._offsets]

    def set(self, value: int):
        return [copy.eq((value - offset) % (1 << len(copy))) for copy, offset in zip(self._copies, self._offsets)]

    def increment(self):
        return [copy.eq(copy + 1) for copy in self._copies]

    def at(self, i: int):
        return self._copies[i]


def delay_line(m, value, cycles: int, name: str | None = None, *, reset_less: bool = True):
    """[value, value delayed 1, ..., value delayed ``cycles``]: one shift register, every stage tapped
    (registers as :func:`reg`)."""
    line = [value]
    for i in range(cycles):
        line.append(reg(m, line[-1], None if name is None else f"{name}_d{i + 1}", reset_less=reset_less))
    return line


def delay(m, value, cycles: int, name: str | None = None, *, reset_less: bool = True):
    """``value`` delayed by ``cycles`` registers (0: the value itself; registers as :func:`reg`)."""
    return delay_line(m, value, cycles, name, reset_less=reset_less)[-1]


class TagLine:
    """Tags that travel down a pipeline beside the data they describe: every cycle the issue stage puts
    ``(valid, last, phase, *fields)`` in, and ``at(stage, code)`` reads what the item issued ``stage`` cycles
    ago carries. ``valid`` there is qualified by the phase, so that a stage ignores the previous phase's items
    still draining down the line. One shift register of ``depth`` stages, every stage tapped."""

    def __init__(self, m, valid, last, phase, fields, depth: int, name: str):
        # A constant phase (a line of one phase) is not delayed: its flip-flops would hold the constant from
        # their first load but start from 0, so Yosys could not fold them, and opt_merge shared one tile's
        # copies with the other's in a flattened array (tile0's FINAL tags drove tile1's field writes).
        self._const_phase = phase.value if isinstance(phase, Const) else None
        line_phase = [] if self._const_phase is not None else [phase]
        self._phase_bits = sum(len(p) for p in line_phase)
        self._widths = [len(f) for f in fields]
        # With a reset: an item's valid bit must not outlive a reset.
        self._line = delay_line(m, Cat(valid, last, *line_phase, *fields), depth, name, reset_less=False)

    def at(self, stage: int, code: int):
        """(valid for phase ``code``, last, *fields) of the item issued ``stage`` cycles ago."""
        t = self._line[stage]
        start = 2 + self._phase_bits
        if self._const_phase is not None:
            valid = t[0] if code == self._const_phase else Const(0)
        else:
            valid = t[0] & (t[2:start] == code)
        out = [valid, t[1]]
        for width in self._widths:
            out.append(t[start:start + width])
            start += width
        return tuple(out)


def minus_aligned(m, value, k: int, low: int, name: str, shape, base: int = 0):
    """``value - k`` of ``shape`` (wrapping like an assignment) for a ``value`` whose ``low`` low bits are the
    constant ``base``; returns it and its low bits' constant. Only the high bits are registered (one cycle):
    registered, the constant low bits would start from 0 and hold the constant from their first load, which
    Yosys cannot fold, and in a flattened array it shared one tile's such flip-flops with the other's (one
    tile's register driving the other's logic across the die)."""
    shape = Shape.cast(shape)
    borrow = -(-(k - base) // (1 << low))  # value - k = (high - borrow) * 2**low + rest, 0 <= rest < 2**low
    rest = base - k + (borrow << low)
    top = value[low:].as_signed() if value.shape().signed else Cat(value[low:], 0).as_signed()
    high = reg(m, top - borrow, name, Shape(shape.width - low, shape.signed))
    result = Cat(Const(rest, low), high)
    return (result.as_signed() if shape.signed else result), rest


def split_mul(m, a, b, name: str):
    """``a * b`` exactly, latency 3: ``a`` and ``b`` first pass through registers of their own, which the placer
    can put beside the DSP blocks (with the product between two distant fabric registers, the routing to and
    from the block's row costs more than the block itself; boards/dsp_pack.py moves these registers into the
    block); then
    the partial products of ``b`` with ``a``'s low MUL_SPLIT bits and its high bits are registered (each one
    multiplier) and added. ``b`` should be at most 18 bits signed."""
    a, b = reg(m, a, f"{name}_a"), reg(m, b, f"{name}_b")
    a_shape, b_shape = Shape.cast(a.shape()), Shape.cast(b.shape())
    width = a_shape.width + b_shape.width + 1
    if a_shape.width <= MUL_SPLIT:
        return delay(m, reg(m, a * b, f"{name}_p", signed(width)), 1, name)
    lo = reg(m, a[:MUL_SPLIT].as_unsigned() * b, f"{name}_lo", signed(width))
    hi_part = a[MUL_SPLIT:].as_signed() if a_shape.signed else a[MUL_SPLIT:].as_unsigned()
    hi = reg(m, hi_part * b, f"{name}_hi", signed(width))
    return reg(m, lo + (hi << MUL_SPLIT), name, signed(width))


def lut_mul(a, b):
    """``a * b`` exactly (combinational), built as a sum of ``len(b)`` shifted copies of ``a`` (one per bit of
    ``b``; the sign bit of a signed ``b`` subtracts), which Yosys maps to adders in the fabric rather than to a
    DSP block. For small products between two registers: a product through a DSP block pays the routing to and
    from the block's row, more than the multiplier itself; the adder tree of a few partial products stays
    beside its registers. Meant for ``b`` of up to 8 bits."""
    return reduce_tree(_partial_products(a, b), operator.add)


def lut_mul_pipelined(m, a, b, name: str, shape):
    """:func:`lut_mul` in two registered steps (latency 2): the partial products summed in pairs, then the
    rest of the adder tree; for a product whose single-cycle tree (three adder levels for 8 bits) was too
    long."""
    pairs = [reg(m, pair, f"{name}_pair{i}") for i, pair in enumerate(lut_mul_pairs(a, b))]
    return reg(m, reduce_tree(pairs, operator.add), name, shape)


def lut_mul_pairs(a, b) -> list:
    """The first step of :func:`lut_mul_pipelined`: :func:`lut_mul`'s partial products summed in pairs, for a
    pipeline that registers them itself (under its own enable); ``a * b`` is ``reduce_tree(pairs, add)``."""
    return reduce_levels(_partial_products(a, b), operator.add, 1)


def _partial_products(a, b):
    b_shape = Shape.cast(b.shape())
    terms = []
    for i in range(b_shape.width):
        term = Mux(b[i], a, 0) << i
        terms.append(-term if b_shape.signed and i == b_shape.width - 1 else term)
    return terms


def reduce_levels(values, op, levels: int) -> list:
    """``levels`` levels of a balanced pairwise reduction of a list of Amaranth values (the partial results)."""
    values = list(values)
    for _ in range(levels):
        values = [op(values[i], values[i + 1]) if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values


def reduce_tree(values, op):
    """Balanced reduction (log depth) of a list of Amaranth values, combinational."""
    return reduce_levels(values, op, ceil_log2(len(values)))[0]


ROUND_SHIFT_FINE_BITS = 3
"""Low bits of a two-step :func:`round_shift`'s amount, shifted in its second step (the first shifts by the
amount's multiple of 8)."""


def round_shift(m, x, shift, max_shift: int, name: str, *, steps: int = 1):
    """Round-half-up arithmetic right shift of signed ``x`` by the variable ``shift`` (0..max_shift), as
    ``soma_int.rshift_round``: ``(x + ((1 << shift) >> 1)) >> shift``. Latency ``1 + steps`` from ``x`` (the
    add, then the shift in ``steps`` registered steps: with 2, by the amount's multiple of 8, then by its low
    :data:`ROUND_SHIFT_FINE_BITS` bits, each half a barrel shifter's multiplexer levels); ``shift`` must hold
    its value from the cycle before ``x`` on (a parameter does): the rounding term is decoded from it into a
    register, not in front of the adder."""
    if steps not in (1, 2):
        raise ValueError(f"round_shift {name}: steps {steps}: expected 1 or 2")
    width = max(Shape.cast(x.shape()).width, max_shift) + 2
    half = reg(m, (Const(1, max_shift + 1) << shift) >> 1, f"{name}_half", unsigned(max_shift + 1))
    total = reg(m, x.as_signed() + half, f"{name}_sum", signed(width))
    amount = reg(m, shift, f"{name}_amount")
    if steps == 2:
        fine = ROUND_SHIFT_FINE_BITS
        total = reg(m, total >> Cat(Const(0, fine), amount[fine:]), f"{name}_coarse", signed(width))
        amount = amount[:fine]
    return reg(m, total >> amount, name, signed(width))


def saturate(x, lo: int, hi: int):
    """``x`` clipped to [lo, hi] (combinational)."""
    return Mux(x < lo, lo, Mux(x > hi, hi, x))


def floor_log2(m, value, name: str):
    """Position of the leading one of the unsigned ``value`` (0 for 0 and 1), latency 2: a leading-one
    position per byte (with an any-bit flag) is registered, then the highest non-empty byte's is chosen."""
    width = Shape.cast(value.shape()).width
    groups = -(-width // 8)
    any_bits, local = [], []
    for g in range(groups):
        byte = value[8 * g: 8 * g + 8]
        position = Const(0, 3)
        for bit in range(len(byte)):
            position = Mux(byte[bit], bit, position)
        any_bits.append(reg(m, byte.any(), f"{name}_any{g}"))
        local.append(reg(m, position, f"{name}_pos{g}", unsigned(3)))
    result = Const(0, range(width))
    for g in range(groups):
        result = Mux(any_bits[g], Cat(local[g], Const(g, 5)), result)
    return reg(m, result, name, range(8 * groups))


def skid_buffer(m, valid, payload, ready_out, name: str):
    """A registered stream stage (an AXI4-Stream register slice): the producer's ``valid``/``payload`` in,
    ``(ready, out_valid, out_payload)`` back, every one of them a register, so that neither the payload nor
    either handshake has a combinational path through the stage. Latency 1 cycle; full throughput (a beat
    per cycle while ``ready_out`` is high); when the consumer stalls, one beat waits in the skid register and
    ``ready`` falls the next cycle, so no beat is lost or repeated."""
    width = len(payload)
    out_valid, skid_valid = Signal(name=f"{name}_valid"), Signal(name=f"{name}_skid_valid")
    out_payload, skid_payload = Signal(width, name=f"{name}_payload"), Signal(width, name=f"{name}_skid")
    ready = ~skid_valid
    with m.If(ready_out | ~out_valid):
        with m.If(skid_valid):
            m.d.sync += [out_valid.eq(1), out_payload.eq(skid_payload), skid_valid.eq(0)]
        with m.Else():
            m.d.sync += [out_valid.eq(valid), out_payload.eq(payload)]
    with m.Elif(valid & ready):
        m.d.sync += [skid_valid.eq(1), skid_payload.eq(payload)]
    return ready, out_valid, out_payload
