"""The SoC's memory map, registers, peripherals and packaged CPUs (hw/soc.py builds the hardware): one source for
the RTL, the firmware's generated ``somatile_soc.h`` (written by hw/soc_header.py) and the board schema. No
Amaranth import and nothing of somatile, so the board loader can read it.

The registers' semantics are in hw/soc.py's docstring.
"""

from __future__ import annotations

from pathlib import Path

CODE_BASE = 0x0000_0000
DATA_BASE = 0x1000_0000
UART_BASE = 0x2000_0000
TILE_BASE = 0x3000_0000
HCCS_BASE = 0x4000_0000
REGISTERS = {  # name -> address
    "UART_DIV": UART_BASE + 0x0, "UART_DATA": UART_BASE + 0x4, "UART_STATUS": UART_BASE + 0x8,
    "TILE_TX": TILE_BASE + 0x0, "TILE_TX_LAST": TILE_BASE + 0x4, "TILE_RX": TILE_BASE + 0x8,
    "TILE_STATUS": TILE_BASE + 0xC,
    "HCCS_HEAD": HCCS_BASE + 0x0, "HCCS_CFG": HCCS_BASE + 0x4, "HCCS_IN": HCCS_BASE + 0x8,
    "HCCS_IN_LAST": HCCS_BASE + 0xC, "HCCS_OUT": HCCS_BASE + 0x10, "HCCS_STATUS": HCCS_BASE + 0x14,
}
STACK_BYTES = 4096
"""Room the linker keeps free below the top of data memory for the stack."""
PERIPHERALS = ("tile_array", "hccs_unit")
"""What the CPU drives (board key ``soc.peripheral``): the tile array on the tile bus (its command layer in
hardware), or the HCCS unit alone on the HCCS registers (the command layer in the firmware, HCCS only; for a
part too small for a tile beside a CPU)."""
UART_RX_FIFO = {"tile_array": 2048, "hccs_unit": 512}
"""Bytes of the UART's receive FIFO per peripheral: frames wait in it while the firmware works. The HCCS
unit's SoC gets one iCE40 block RAM's worth, which holds any request its host sends (an HCCS command is at
most a header and ``staging_bytes``), since its block RAM also holds the code."""
TILE_TX_FIFO = 8
TILE_RX_FIFO = 8
"""Beats of the array's output that wait for the CPU where the tile bus crosses clock domains (hw/soc.py)."""
HCCS_IN_FIFO = 4
"""Elements the HCCS registers buffer before the unit takes them (the firmware checks for room first)."""
DATA_RAMS = ("block", "spram")
"""What data memory is made of (board key ``soc.data_ram``): block RAM, or the iCE40 UltraPlus's
single-port SB_SPRAM256KA blocks (16K x 16 bits each, used in pairs for 32-bit words: 64 KiB a pair)."""
SPRAM_PAIR_BYTES = 65536
CPUS = ("picorv32", "picorv32_rv32i")
"""Soft CPUs the SoC instantiates (each shipped as Verilog in a pip package): PicoRV32 with the multiplier,
the divider and the barrel shifter, or a small one without them (the compiler then calls libgcc for
multiplies and divides; a shift takes up to eight cycles), for a part with few LUTs."""
CPU_MARCH = {"picorv32": "rv32im", "picorv32_rv32i": "rv32i"}
"""The ``-march`` the firmware is built with for each CPU."""
CPU_OPTIONS = {"picorv32": {"ENABLE_MUL": 1, "ENABLE_DIV": 1, "BARREL_SHIFTER": 1, "TWO_CYCLE_COMPARE": 1,
                            "TWO_CYCLE_ALU": 1},
               "picorv32_rv32i": {"ENABLE_MUL": 0, "ENABLE_DIV": 0, "BARREL_SHIFTER": 0}}
"""The PicoRV32 parameters that make each CPU (the others are the SoC's, hw/soc.py). The RV32IM CPU registers
its ALU's result and its branch comparison (PicoRV32's TWO_CYCLE_ALU and TWO_CYCLE_COMPARE: a cycle more for
each ALU instruction and branch): without them its register file -> comparison -> next-fetch path was the
ULX3S SoC's CPU-clock critical path (``reg_op2 -> mem_do_rinst``), met at 75 MHz in one placement and missed
in another. The small CPU keeps one-cycle ones: on the full UP5K each register counts."""
HCCS_DIV_BITS = 1
"""Quotient bits per cycle of the SoC's HCCS unit's reciprocal: one. The CPU hands it an element every couple
of hundred cycles, so the divider's speed does not matter; its path does: at the unit's default of two the
chained subtractors were the iCEBreaker SoC's one late path (23.2 MHz against 24, the UP5K 99 % full)."""



HCCS_FIELDS = {
    # HCCS_CFG: one head's parameters (the head in HCCS_HEAD), bit positions
    "CFG_B_SHIFT": 0, "CFG_OUT_SHIFT": 15, "CFG_S_SHIFT": 16, "CFG_MODE_SHIFT": 23, "CFG_DMAX_SHIFT": 24,
    # HCCS_OUT: the probability in the low 16 bits, then these flags
    "OUT_LAST": 1 << 16, "OUT_VALID": 1 << 31,
    # HCCS_STATUS: room for an element, then the unit's status bits (sticky until a write to HCCS_STATUS)
    "STATUS_ROOM": 1, "STATUS_OVERFLOW": 2, "STATUS_FRAMING": 4, "STATUS_BAD_HEAD": 8, "STATUS_BUSY": 16,
}
"""Bit fields of the HCCS registers (their semantics: hw/soc.py's docstring)."""


def cpu_sources(cpu: str) -> list[Path]:
    """Verilog files of ``cpu`` and the UART, from their pip package (``ModuleNotFoundError`` names it)."""
    if cpu not in CPUS:
        raise ValueError(f"cpu {cpu!r}: expected one of {', '.join(CPUS)}")
    try:
        import pythondata_cpu_picorv32 as package
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the SoC needs the PicoRV32 sources: pip install pythondata-cpu-picorv32",
                                  name="pythondata_cpu_picorv32") from None
    root = Path(package.data_location)
    return [root / "picorv32.v", root / "picosoc" / "simpleuart.v"]


SOFT_TILE_COMMANDS = ("INFO", "REG_READ", "REG_WRITE", "CONFIGURE_HEAD", "HCCS", "CLEAR_ERROR")
"""The tile commands of the command layer in firmware (``firmware/src/soft_tile.c``, peripheral ``hccs_unit``):
what the HCCS unit alone can serve. The others (DECODE and the state commands) it refuses as UNKNOWN_OPCODE,
and its ``commands`` INFO register says so."""
SOFT_TILE_PROFILE = "paper"
"""The HCCS unit computes the paper profile's HCCS (int8 logits); the wide profile's row unit is hw/wide.py."""
