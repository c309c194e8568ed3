"""Pack fabric registers into the ECP5 multiplier blocks' own registers (a step Yosys 0.70 does not do).

Yosys maps every product to a combinational ``MULT18X18D`` (``REG_*_CLK = "NONE"``), so a registered
product ``reg -> MULT18X18D -> reg`` costs two long routes plus the multiplier inside one clock period: nextpnr
places the block several ns of routing away from its fabric registers on each side, and those paths were the
largest group of late endpoints of the decode tile. The block has input registers on A and B and an output
register on P; vendor tools move fabric registers into them, and this pass does the same on the Yosys JSON
netlist before nextpnr reads it.

Contract (``pack(netlist) -> PackReport``; the netlist dict is changed in place):

- A fabric flip-flop can be packed only when it is a plain D register: ``TRELLIS_FF`` with no clock enable
  (``CEMUX = "1 "``), its set/reset input tied to constant 0, ``REGSET = "RESET"`` (power-up 0, which the
  block's registers share), clocked on the rising edge.
- Input side (A and B separately): every non-constant bit of the operand must come straight from such a
  register's Q, all on one clock net. The block's A (B) inputs then take the registers' D nets and
  ``REG_INPUTA_CLK`` (``REG_INPUTB_CLK``) becomes ``"CLK0"``; a fabric register whose Q has no other load left
  is deleted. Constant operand bits stay constant (after the first clock edge the register holds them).
- Output side: every used bit of P must have exactly one load, the D input of such a register, all on the
  operands' clock net; those registers are deleted, their Q nets are driven by P, and ``REG_OUTPUT_CLK``
  becomes ``"CLK0"``.
- The cycle behaviour is unchanged: each packed register is the same D flip-flop on the same clock, moved
  into the block. ``CE0`` is tied to 1 and ``RST0`` to 0 (``RESETMODE`` sync, ``GSR`` disabled as in the
  fabric registers), so the block's registers load every cycle and are never cleared.

The blocks' behaviour under these parameters is checked by gate-level simulation of a packed netlist
(tests/boards/test_dsp_pack.py, with the behavioural model in tests/boards/mult18x18d_model.v).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import sys
from pathlib import Path

MULT = "MULT18X18D"
FF = "TRELLIS_FF"
_OPERAND_BITS = 18
_PRODUCT_BITS = 36


@dataclasses.dataclass
class PackReport:
    blocks: int = 0
    inputs_packed: int = 0        # operands (A or B) whose register moved into a block
    outputs_packed: int = 0       # blocks whose P register moved in
    registers_removed: int = 0


def _is_const(bit) -> bool:
    return isinstance(bit, str)


def _plain_register(cell: dict) -> bool:
    """A D flip-flop with no enable, rising edge, power-up 0, and no reset or a synchronous one to 0."""
    if cell["type"] != FF:
        return False
    params, conn = cell["parameters"], cell["connections"]
    lsr = conn.get("LSR", ["0"])[0]
    reset_ok = lsr == "0" or (not _is_const(lsr) and params.get("SRMODE") == "LSR_OVER_CE"
                               and params.get("LSRMUX", "LSR") == "LSR")
    return (params.get("CEMUX", "").strip() == "1" and params.get("CLKMUX", "CLK") == "CLK"
            and params.get("REGSET", "RESET") == "RESET" and reset_ok and not _is_const(conn["CLK"][0]))


def _control(cell: dict) -> tuple:
    """(clock net, reset net or "0") of a plain register."""
    return cell["connections"]["CLK"][0], cell["connections"].get("LSR", ["0"])[0]


class _Netlist:
    def __init__(self, module: dict):
        self.cells = module["cells"]
        self.drivers: dict[int, tuple[str, str]] = {}
        self.loads: dict[int, list[tuple[str, str]]] = collections.defaultdict(list)
        for name, cell in self.cells.items():
            for port, bits in cell["connections"].items():
                output = cell["port_directions"].get(port) == "output"
                for bit in bits:
                    if _is_const(bit):
                        continue
                    if output:
                        self.drivers[bit] = (name, port)
                    else:
                        self.loads[bit].append((name, port))
        for port in module.get("ports", {}).values():
            if port["direction"] != "input":
                for bit in port["bits"]:
                    if not _is_const(bit):
                        self.loads[bit].append(("$port", "out"))

    def driving_register(self, bit) -> str | None:
        driver = self.drivers.get(bit)
        if driver is None or driver[1] != "Q" or not _plain_register(self.cells[driver[0]]):
            return None
        return driver[0]

    def unload(self, bit, cell: str, port: str) -> None:
        self.loads[bit].remove((cell, port))

    def remove_if_unused(self, name: str) -> bool:
        if name in self.cells and not self.loads.get(self.cells[name]["connections"]["Q"][0]):
            d = self.cells[name]["connections"]["DI"][0]
            if not _is_const(d):
                self.unload(d, name, "DI")
            del self.cells[name]
            return True
        return False


def _common_control(net: _Netlist, registers) -> tuple | None:
    controls = {_control(net.cells[r]) for r in registers}
    return controls.pop() if len(controls) == 1 else None


def _operand_registers(net: _Netlist, cell: dict, operand: str) -> dict[int, str] | None:
    """The plain register behind each non-constant bit of operand ``A``/``B``, or None if a bit has none."""
    registers = {}
    for i in range(_OPERAND_BITS):
        bit = cell["connections"][f"{operand}{i}"][0]
        if not _is_const(bit):
            registers[i] = net.driving_register(bit)
            if registers[i] is None:
                return None
    return registers


def _move_operand(net: _Netlist, name: str, cell: dict, operand: str, registers: dict[int, str],
                  report: PackReport) -> None:
    conn = cell["connections"]
    for i, register in registers.items():
        port = f"{operand}{i}"
        net.unload(conn[port][0], name, port)
        d = net.cells[register]["connections"]["DI"][0]
        conn[port] = [d]
        if not _is_const(d):
            net.loads[d].append((name, port))
    for register in set(registers.values()):
        report.registers_removed += net.remove_if_unused(register)
    report.inputs_packed += 1


def _product_registers(net: _Netlist, cell: dict) -> dict[int, str] | None:
    """The plain register that each used bit of P feeds as its only load, or None."""
    registers = {}
    for i in range(_PRODUCT_BITS):
        loads = net.loads.get(cell["connections"][f"P{i}"][0], [])
        if not loads:
            continue
        load, port = loads[0]
        if len(loads) != 1 or port != "DI" or load not in net.cells or not _plain_register(net.cells[load]):
            return None
        registers[i] = load
    return registers or None


def _move_product(net: _Netlist, name: str, cell: dict, registers: dict[int, str], report: PackReport) -> None:
    conn = cell["connections"]
    for i, register in registers.items():
        q = net.cells[register]["connections"]["Q"][0]
        net.loads.pop(conn[f"P{i}"][0], None)
        net.drivers[q] = (name, f"P{i}")
        conn[f"P{i}"] = [q]
        del net.cells[register]
        report.registers_removed += 1
    report.outputs_packed += 1


class _Controls:
    """The block's four (clock, enable, reset) pin groups; a register names the group it uses."""

    def __init__(self):
        self.clock = None
        self.resets: list = []

    def group(self, control: tuple | None) -> int | None:
        """The group for registers of ``control`` = (clock net, reset net or "0"; clock None: any clock), or
        None when they cannot have one (no common control, a second clock, or four resets taken)."""
        if control is None:
            return None
        clock, reset = control
        if clock is not None and self.clock not in (None, clock):
            return None  # one clock per block here (every design of this project has one)
        if reset not in self.resets:
            if len(self.resets) == 4:
                return None
            self.resets.append(reset)
        self.clock = clock if clock is not None else self.clock
        return self.resets.index(reset)


def _pack_block(net: _Netlist, name: str, cell: dict, report: PackReport) -> None:
    # nextpnr times a block with only one of A/B registered as if neither were: both move or neither does.
    # An all-constant operand counts as registered (after the first clock edge its register holds the constant).
    controls = _Controls()
    params = cell["parameters"]
    operands = {op: _operand_registers(net, cell, op) for op in "AB"}
    if all(regs is not None for regs in operands.values()) and any(operands.values()):
        groups = {op: controls.group(_common_control(net, regs.values()) if regs else (None, "0"))
                  for op, regs in operands.items()}
        if None in groups.values():
            controls = _Controls()  # neither operand moves: their groups are not taken
        else:
            for op, regs in operands.items():
                _move_operand(net, name, cell, op, regs, report)
                params[f"REG_INPUT{op}_CLK"] = "CLK0"
                params[f"REG_INPUT{op}_CE"] = "CE0"
                params[f"REG_INPUT{op}_RST"] = f"RST{groups[op]}"
    product = _product_registers(net, cell)
    group = controls.group(_common_control(net, product.values())) if product else None
    if group is not None:
        _move_product(net, name, cell, product, report)
        params.update(REG_OUTPUT_CLK="CLK0", REG_OUTPUT_CE="CE0", REG_OUTPUT_RST=f"RST{group}")
    if controls.clock is None:
        return
    pins = {"CLK0": [controls.clock], "CE0": ["1"]}
    pins.update({f"RST{i}": [reset] for i, reset in enumerate(controls.resets)})
    cell["connections"].update(pins)
    cell["port_directions"].update({pin: "input" for pin in pins})
    for reset in controls.resets:
        if not _is_const(reset):
            net.loads[reset].append((name, "RST"))
    params.update(GSR="DISABLED", RESETMODE="SYNC")


def pack(netlist: dict) -> PackReport:
    """Pack registers into every ``MULT18X18D`` of the netlist's top module (see the module docstring)."""
    report = PackReport()
    for module in netlist["modules"].values():
        if not module.get("attributes", {}).get("top"):
            continue
        net = _Netlist(module)
        for name in [n for n, c in module["cells"].items() if c["type"] == MULT]:
            cell = module["cells"][name]
            if any(str(v) not in ("NONE", "") for k, v in cell["parameters"].items() if k.endswith("_CLK")):
                continue  # already registered by the RTL: leave it as written
            report.blocks += 1
            _pack_block(net, name, cell, report)
    return report


def pack_file(path: Path) -> PackReport:
    """Pack the Yosys JSON netlist at ``path`` in place."""
    path = Path(path)
    netlist = json.loads(path.read_text())
    report = pack(netlist)
    path.write_text(json.dumps(netlist))
    return report


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m somatile.boards.dsp_pack NETLIST.json", file=sys.stderr)
        return 2
    report = pack_file(Path(args[0]))
    print(f"dsp_pack: {report.blocks} MULT18X18D, {report.inputs_packed} operand registers and "
          f"{report.outputs_packed} product registers moved into them, {report.registers_removed} fabric "
          "flip-flops removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
