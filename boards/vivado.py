"""The Vivado scripts of a Versal board (kind ``versal``): generated here, never run here.

``somatile build --board vck190|vek280 --top array|tile`` writes into ``vivado/``:

- ``build_<module>.tcl`` + ``<module>.xdc``: the PL unit alone, synthesised and implemented out of context
  (its timing and resources without pin placement);
- ``system_<module>.tcl``: a block design around it, the design the Versal firmware (``firmware/hal/versal``)
  is written for. The processing system (CIPS, ``versal_cips``; the board preset for its fixed I/O) drives
  an AXI DMA (PG021, simple mode: no scatter-gather, as the HAL programs it) through its M_AXI_LPD master and
  a SmartConnect to the DMA's AXI-Lite registers; the DMA's MM2S stream feeds the tile's ``s_axis`` and the
  tile's ``m_axis`` feeds its S2MM stream; both DMA masters reach the on-chip memory (where the HAL keeps its
  bounce buffers) through a second SmartConnect into the CIPS S_AXI_LPD slave. One PL clock (pl0_ref_clk at
  the board's clock) and one reset (proc_sys_reset from pl0_resetn) serve every cell; the DMA's two
  interrupts and the tile's error flag go to pl_ps_irq0..2. The script assigns the addresses of
  :data:`ADDRESS_MAP`, validates, writes the HDL wrapper, implements to a device image and exports the
  fixed hardware platform (``.xsa``).

:data:`ADDRESS_MAP` is the one declaration of the addresses: the block design assigns them and the firmware's
``somatile_versal.h`` (``python -m somatile.boards.vivado --c-header FILE``, run by ``make -C firmware
versal``) defines them for the HAL; its linker script (``hal/versal/link.ld.S``, preprocessed with the header)
takes the memory regions of :data:`FIRMWARE_MEMORY`, whose on-chip memory is the DMA's window. The tile's ports are read from the Verilog the build wrote
(:func:`verilog_ports`); a port the block design does not connect is an error naming it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

VIVADO_NOTE = ("Vivado is not run by this project: these files are for a user who has it (with the board's "
               "files installed for the block design). The unit alone is synthesised out of context (no pin "
               "placement); system_<module>.tcl builds the block design that connects it to the processing "
               "system through an AXI DMA.")


@dataclasses.dataclass(frozen=True)
class Window:
    """An address window: ``base`` and ``size`` bytes; ``master`` sees ``segment`` there (Vivado's names)."""

    base: int
    size: int
    master: str
    segment: str
    why: str


CIPS, DMA, TILE = "versal_cips_0", "axi_dma_0", "somatile_0"
CONTROL_BUS, MEMORY_BUS, RESET = "smartconnect_control", "smartconnect_memory", "proc_sys_reset_0"

ADDRESS_MAP: dict[str, tuple[Window, ...]] = {
    # The R5's M_AXI_LPD window starts at 0x8000_0000; the HAL's register offsets are PG021's.
    "DMA": (Window(0x8000_0000, 0x1_0000, f"{CIPS}/M_AXI_LPD", f"{DMA}/S_AXI_LITE/Reg",
                   "the AXI DMA's registers, seen by the processing system"),),
    # The on-chip memory at the address the R5 uses for it, so the HAL hands the DMA its own pointers.
    "DMA_BUFFER": tuple(Window(0xFFFC_0000, 0x4_0000, f"{DMA}/{space}", f"{CIPS}/S_AXI_LPD/pspmc_0_psv_ocm_ram_0",
                               "the on-chip memory (the HAL's bounce buffers), seen by the DMA")
                        for space in ("Data_MM2S", "Data_S2MM")),
}
"""Name -> the windows the block design assigns; the header defines ``VERSAL_<name>_BASE`` and ``_BYTES``."""
UART_BASE = 0xFF00_0000
"""The PS UART0 (PL011): fixed by the processing system, not assigned by the block design; in the header too."""
OCM_TFA_BYTES = 0x2_0000
"""The top of the on-chip memory that TF-A's BL31 occupies on Versal by default (0xFFFE0000..0xFFFFFFFF, TF-A's
plat/xilinx/versal platform_def.h) when the APU boots through it: the firmware's buffers stay below."""
FIRMWARE_MEMORY: dict[str, tuple[int, int, str]] = {
    # The R5F's tightly coupled memories at their local addresses, 64 KB each: core 0's in split mode and the
    # first half of each combined TCM in lock-step (AM011, UG1304; the local addresses of UG1137's R5F map).
    "ATCM": (0x0000_0000, 0x1_0000, "code and constants, the vectors at 0"),
    "BTCM": (0x0002_0000, 0x1_0000, "data, .bss and the stack"),
    "OCM": (ADDRESS_MAP["DMA_BUFFER"][0].base, ADDRESS_MAP["DMA_BUFFER"][0].size - OCM_TFA_BYTES,
            "the DMA bounce buffers (section .dma): the on-chip memory the DMA sees, below TF-A"),
}
"""The Versal firmware's memory regions (hal/versal/link.ld.S): name -> (base, bytes, what goes there); the header
defines ``VERSAL_<name>_BASE`` and ``_BYTES``. The OCM region is the DMA's window from :data:`ADDRESS_MAP`."""
DMA_LENGTH_BITS = 26
"""PG021 c_sg_length_width at its maximum (2^26 - 1 bytes a transfer): any frame the firmware sends fits."""
DMA_STREAM_WIDTHS = (8, 16, 32, 64, 128, 256, 512, 1024)
"""tdata widths the AXI DMA's streams take (PG021 c_m_axis_mm2s_tdata_width / c_s_axis_s2mm_tdata_width)."""
STREAM_SIGNALS = {"s_axis": {"tdata": "input", "tvalid": "input", "tready": "output", "tlast": "input"},
                  "m_axis": {"tdata": "output", "tvalid": "output", "tready": "input", "tlast": "output"}}
"""The tile's AXI4-Stream ports as Vivado infers them from their names: interface -> signal -> direction."""
IRQS = {f"{DMA}/mm2s_introut": 0, f"{DMA}/s2mm_introut": 1, f"{TILE}/error": 2}
"""Interrupt source -> its pl_ps_irq line. The HAL polls; the lines are wired for firmware that waits."""


class VivadoError(ValueError):
    """The unit's Verilog does not fit the block design; the message names the module and the port."""


def verilog_ports(text: str, module: str) -> dict[str, tuple[str, int]]:
    """The ports of ``module`` in Yosys-written Verilog: name -> (direction, width in bits)."""
    header = re.search(rf"^module {re.escape(module)}\(([^)]*)\);(.*?)^endmodule", text, re.M | re.S)
    if header is None:
        raise VivadoError(f"module {module}: not found in the Verilog")
    names = [n.strip() for n in header.group(1).split(",") if n.strip()]
    declared = {m.group(3): (m.group(1), int(m.group(2) or 0) + 1)
                for m in re.finditer(r"^\s*(input|output|inout)\s+(?:signed\s+)?(?:\[(\d+):0\]\s+)?(\w+);",
                                     header.group(2), re.M)}
    missing = [n for n in names if n not in declared]
    if missing:
        raise VivadoError(f"module {module}: port {missing[0]!r} has no input/output declaration")
    return {n: declared[n] for n in names}


def tile_connections(ports: dict[str, tuple[str, int]], module: str) -> tuple[int, dict[str, str]]:
    """Check the tile's ports against the block design: (stream width, tile port -> what it connects to).
    Every port must be one the design knows (the two streams, clk, rst, error)."""
    streams = {f"{intf}_{sig}": (intf, sig, d) for intf, sigs in STREAM_SIGNALS.items() for sig, d in sigs.items()}
    plain = {"clk": ("input", "the PL clock"), "rst": ("input", "the active-high reset"),
             "error": ("output", f"pl_ps_irq{IRQS[f'{TILE}/error']}")}
    wiring = {}
    for name, (direction, width) in ports.items():
        if name in streams:
            intf, sig, want = streams[name]
            target = f"{DMA}/{'M_AXIS_MM2S' if intf == 's_axis' else 'S_AXIS_S2MM'}"
        elif name in plain:
            want, target = plain[name]
        else:
            raise VivadoError(f"module {module}: port {name!r} ({direction}, {width} bits) has no connection in "
                              f"the block design (known: {sorted(streams) + sorted(plain)})")
        if direction != want:
            raise VivadoError(f"module {module}: port {name!r} is an {direction}, the block design needs an {want}")
        wiring[name] = target
    absent = sorted(set(streams) - set(ports))
    if absent:
        raise VivadoError(f"module {module}: no port {absent[0]!r}; the DMA needs both AXI4-Stream interfaces "
                          f"with {', '.join(STREAM_SIGNALS['s_axis'])}")
    width = ports["s_axis_tdata"][1]
    if ports["m_axis_tdata"][1] != width or width not in DMA_STREAM_WIDTHS:
        raise VivadoError(f"module {module}: s_axis_tdata / m_axis_tdata are {width} / {ports['m_axis_tdata'][1]} "
                          f"bits; the AXI DMA takes one of {DMA_STREAM_WIDTHS} for both")
    return width, wiring


def fits_block_design(ports: dict[str, tuple[str, int]]) -> bool:
    """Whether the unit has the stream ports the DMA drives (the tile and the array; the HCCS row unit not)."""
    return all(f"{intf}_{sig}" in ports for intf, sigs in STREAM_SIGNALS.items() for sig in sigs)


def _hex(value: int) -> str:
    return f"0x{value:08X}"


def block_design_tcl(cfg, module: str, verilog_name: str, ports: dict[str, tuple[str, int]]) -> str:
    """The Tcl that builds the processing system + DMA + tile block design (see the module docstring)."""
    width, wiring = tile_connections(ports, module)
    design = f"{module}_system"
    clock_mhz = f"{cfg.clock_mhz:g}"
    irq_usage = " ".join(f"{{CH{line} 1}}" for line in sorted(IRQS.values()))
    stream_ports = "; ".join(f"{intf}: {', '.join(sorted(n for n in wiring if n.startswith(intf)))}"
                             for intf in STREAM_SIGNALS)
    addresses = "\n".join(
        f"assign_bd_address -offset {_hex(w.base)} -range {_hex(w.size)} -target_address_space "
        f"[get_bd_addr_spaces {w.master}] [get_bd_addr_segs {w.segment}] -force"
        for windows in ADDRESS_MAP.values() for w in windows)
    irqs = "\n".join(f"connect_bd_net [get_bd_pins {source}] [get_bd_pins {CIPS}/pl_ps_irq{line}]"
                     for source, line in IRQS.items())
    return f"""# NOT RUN HERE: Vivado is not run by this project; this script is for a user who has it.
# Generated by `somatile build --board {cfg.name}` (somatile.boards.vivado); it needs the {cfg.name} board files.
# The block design: processing system (CIPS) -> AXI DMA (simple mode) <-> {module} over AXI4-Stream, the
# addresses of somatile.boards.vivado.ADDRESS_MAP (the firmware's somatile_versal.h has the same), one PL clock
# ({clock_mhz} MHz from pl0_ref_clk), one reset, the DMA's and the tile's interrupts.
# Run with: vivado -mode batch -source system_{module}.tcl   (from this folder)
set here [file dirname [file normalize [info script]]]
create_project -force {design} [file join $here system] -part {cfg.aie['part']}
# The CIPS fixed I/O (UART0 pins, clocks of the PS) comes from the board preset.
set board_part [get_board_parts -latest_file_version *:{cfg.name}:*]
if {{$board_part eq ""}} {{
    error "the {cfg.name} board files are not installed (Vivado's board store: xilinx_board_store)"
}}
set_property board_part $board_part [current_project]
add_files -norecurse [file join $here .. {verilog_name}]
update_compile_order -fileset sources_1
create_bd_design {design}

set cips [create_bd_cell -type ip -vlnv xilinx.com:ip:versal_cips {CIPS}]
set_property -dict [list CONFIG.PS_BOARD_INTERFACE {{ps_pmc_fixed_io}} CONFIG.PS_PL_CONNECTIVITY_MODE {{Custom}} \\
    CONFIG.DESIGN_MODE {{1}}] $cips
# Keep the preset's settings and add the PL side: M_AXI_LPD to the DMA's registers, S_AXI_LPD for the DMA's
# reads and writes of the on-chip memory, one PL clock and reset, three PL-to-PS interrupts.
set pmc [get_property CONFIG.PS_PMC_CONFIG $cips]
dict set pmc PS_USE_M_AXI_LPD {{1}}
dict set pmc PS_M_AXI_LPD_DATA_WIDTH {{32}}
dict set pmc PS_USE_S_AXI_LPD {{1}}
dict set pmc PS_USE_PMCPL_CLK0 {{1}}
dict set pmc PMC_CRP_PL0_REF_CTRL_FREQMHZ {{{clock_mhz}}}
dict set pmc PS_NUM_FABRIC_RESETS {{1}}
dict set pmc PS_IRQ_USAGE {{{irq_usage}}}
set_property CONFIG.PS_PMC_CONFIG $pmc $cips

# Simple mode (no scatter-gather): the registers firmware/hal/versal/hal_versal.c programs. {width}-bit streams,
# the width of the tile's tdata; the length register holds any frame.
set dma [create_bd_cell -type ip -vlnv xilinx.com:ip:axi_dma {DMA}]
set_property -dict [list CONFIG.c_include_sg {{0}} CONFIG.c_sg_length_width {{{DMA_LENGTH_BITS}}} \\
    CONFIG.c_addr_width {{32}} \\
    CONFIG.c_m_axi_mm2s_data_width {{{width}}} CONFIG.c_m_axis_mm2s_tdata_width {{{width}}} \\
    CONFIG.c_m_axi_s2mm_data_width {{{width}}} CONFIG.c_s_axis_s2mm_tdata_width {{{width}}}] $dma

# The tile from its Verilog; Vivado infers its two AXI4-Stream interfaces from the port names
# ({stream_ports}).
set tile [create_bd_cell -type module -reference {module} {TILE}]
set_property -dict [list CONFIG.ASSOCIATED_BUSIF {{s_axis:m_axis}} CONFIG.ASSOCIATED_RESET {{rst}}] \\
    [get_bd_pins {TILE}/clk]
set_property CONFIG.POLARITY {{ACTIVE_HIGH}} [get_bd_pins {TILE}/rst]

set control [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect {CONTROL_BUS}]
set_property -dict [list CONFIG.NUM_SI {{1}} CONFIG.NUM_MI {{1}}] $control
set memory [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect {MEMORY_BUS}]
set_property -dict [list CONFIG.NUM_SI {{2}} CONFIG.NUM_MI {{1}}] $memory
set reset [create_bd_cell -type ip -vlnv xilinx.com:ip:proc_sys_reset {RESET}]

# Control: the processing system to the DMA's registers.
connect_bd_intf_net [get_bd_intf_pins {CIPS}/M_AXI_LPD] [get_bd_intf_pins {CONTROL_BUS}/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins {CONTROL_BUS}/M00_AXI] [get_bd_intf_pins {DMA}/S_AXI_LITE]
# Data: the DMA's memory masters to the on-chip memory.
connect_bd_intf_net [get_bd_intf_pins {DMA}/M_AXI_MM2S] [get_bd_intf_pins {MEMORY_BUS}/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins {DMA}/M_AXI_S2MM] [get_bd_intf_pins {MEMORY_BUS}/S01_AXI]
connect_bd_intf_net [get_bd_intf_pins {MEMORY_BUS}/M00_AXI] [get_bd_intf_pins {CIPS}/S_AXI_LPD]
# Streams: frames in through MM2S, answers out through S2MM (a frame ends at tlast).
connect_bd_intf_net [get_bd_intf_pins {DMA}/M_AXIS_MM2S] [get_bd_intf_pins {TILE}/s_axis]
connect_bd_intf_net [get_bd_intf_pins {TILE}/m_axis] [get_bd_intf_pins {DMA}/S_AXIS_S2MM]

# One clock for every cell and both CIPS AXI ports.
connect_bd_net [get_bd_pins {CIPS}/pl0_ref_clk] [get_bd_pins {CIPS}/m_axi_lpd_aclk] \\
    [get_bd_pins {CIPS}/s_axi_lpd_aclk] [get_bd_pins {DMA}/s_axi_lite_aclk] [get_bd_pins {DMA}/m_axi_mm2s_aclk] \\
    [get_bd_pins {DMA}/m_axi_s2mm_aclk] [get_bd_pins {CONTROL_BUS}/aclk] [get_bd_pins {MEMORY_BUS}/aclk] \\
    [get_bd_pins {RESET}/slowest_sync_clk] [get_bd_pins {TILE}/clk]
# Resets: the PS's fabric reset, synchronised; the AXI cells take it active low, the tile active high.
connect_bd_net [get_bd_pins {CIPS}/pl0_resetn] [get_bd_pins {RESET}/ext_reset_in]
connect_bd_net [get_bd_pins {RESET}/peripheral_aresetn] [get_bd_pins {DMA}/axi_resetn] \\
    [get_bd_pins {CONTROL_BUS}/aresetn] [get_bd_pins {MEMORY_BUS}/aresetn]
connect_bd_net [get_bd_pins {RESET}/peripheral_reset] [get_bd_pins {TILE}/rst]
# Interrupts: DMA MM2S and S2MM done, the tile's error flag.
{irqs}

# Addresses: somatile.boards.vivado.ADDRESS_MAP, the same the firmware's somatile_versal.h defines.
{addresses}

validate_bd_design
save_bd_design
make_wrapper -files [get_files {design}.bd] -top -import
set_property top {design}_wrapper [current_fileset]
update_compile_order -fileset sources_1
launch_runs impl_1 -to_step write_device_image -jobs 4
wait_on_run impl_1
open_run impl_1
report_utilization -file [file join $here utilization_system.rpt]
report_timing_summary -file [file join $here timing_system.rpt]
write_hw_platform -fixed -include_bit -force -file [file join $here {design}.xsa]
"""


def write_vivado_project(cfg, out: Path, verilog: Path, module: str) -> list[Path]:
    """The Vivado Tcl scripts (out-of-context unit; the block design where the unit has the DMA's stream
    ports) and the unit's XDC file, into ``out/vivado``."""
    vivado = out / "vivado"
    vivado.mkdir(exist_ok=True)
    period_ns = 1000.0 / cfg.clock_mhz
    xdc = vivado / f"{module}.xdc"
    xdc.write_text(
        f"# Generated by `somatile build --board {cfg.name}`. {VIVADO_NOTE}\n"
        f"create_clock -name clk -period {period_ns:.3f} [get_ports clk]\n"
        f"# rst is synchronous to clk (Amaranth's reset); the stream ports are registered inside the tile.\n")
    tcl = vivado / f"build_{module}.tcl"
    tcl.write_text(f"""# NOT RUN HERE: {VIVADO_NOTE}
# Generated by `somatile build --board {cfg.name}`.
# Run with: vivado -mode batch -source {tcl.name}   (from this folder)
set here [file dirname [file normalize [info script]]]
create_project -force {module} [file join $here project] -part {cfg.aie['part']}
add_files -norecurse [file join $here .. {verilog.name}]
add_files -fileset constrs_1 -norecurse [file join $here {xdc.name}]
set_property top {module} [current_fileset]
synth_design -top {module} -part {cfg.aie['part']} -mode out_of_context
report_utilization -file [file join $here utilization_synth.rpt]
report_timing_summary -file [file join $here timing_synth.rpt]
opt_design
place_design
route_design
report_utilization -file [file join $here utilization_routed.rpt]
report_timing_summary -file [file join $here timing_routed.rpt]
write_checkpoint -force [file join $here {module}_routed.dcp]
""")
    files = [xdc, tcl]
    ports = verilog_ports(verilog.read_text(), module)
    if fits_block_design(ports):
        system = vivado / f"system_{module}.tcl"
        system.write_text(block_design_tcl(cfg, module, verilog.name, ports))
        files.append(system)
    return files


def c_header() -> str:
    """``somatile_versal.h``: the addresses of :data:`ADDRESS_MAP` and the DMA's length width for the HAL, and
    the regions of :data:`FIRMWARE_MEMORY` for its linker script (which includes the header: plain numbers,
    no C suffixes)."""
    lines = ["/* Generated by `python -m somatile.boards.vivado --c-header` from ADDRESS_MAP in boards/vivado.py, the",
             " * declaration the block design (vivado/system_<module>.tcl) assigns its addresses from, and",
             " * FIRMWARE_MEMORY beside it. Included by the HAL and by hal/versal/link.ld.S. */",
             "#ifndef SOMATILE_VERSAL_H", "#define SOMATILE_VERSAL_H", "",
             "/* The PS UART0 (PL011), fixed by the processing system. */",
             f"#define VERSAL_UART_BASE {_hex(UART_BASE)}"]
    for name, windows in ADDRESS_MAP.items():
        w = windows[0]
        lines += [f"/* {w.why}: {' and '.join(x.master for x in windows)} -> {w.segment} */",
                  f"#define VERSAL_{name}_BASE {_hex(w.base)}", f"#define VERSAL_{name}_BYTES {_hex(w.size)}"]
    for name, (base, size, why) in FIRMWARE_MEMORY.items():
        lines += [f"/* Linker region {name}: {why}. */",
                  f"#define VERSAL_{name}_BASE {_hex(base)}", f"#define VERSAL_{name}_BYTES {_hex(size)}"]
    lines += ["/* Bits of the DMA's transfer length registers (PG021 c_sg_length_width). */",
              f"#define VERSAL_DMA_LENGTH_BITS {DMA_LENGTH_BITS}", "", "#endif", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from somatile.hw.header_cli import header_main

    return header_main(argv, "somatile.boards.vivado", __doc__.splitlines()[0], "somatile_versal.h", c_header)


if __name__ == "__main__":
    raise SystemExit(main())
