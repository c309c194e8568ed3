"""The Versal block design (boards/vivado.py): the generated Tcl read back and checked against the tile's own
Verilog port list, its addresses against the firmware's generated header. Vivado itself is not run here."""

import re
from pathlib import Path

import pytest

import somatile.boards as boards
from somatile.boards import build, vivado

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"


@pytest.fixture(scope="module")
def tile_build(tmp_path_factory):
    """The decode tile's Verilog and Vivado scripts for the VCK190 (no vendor tool runs)."""
    out = tmp_path_factory.mktemp("vivado")
    record = build.build(boards.load("vck190"), "tile", out, pnr=False)
    folder = Path(record["out"])
    return folder, next(folder.glob("*.v"))


def top_ports(verilog: Path):
    """name -> (direction, width) of the file's first module, read independently of boards/vivado.py."""
    text = verilog.read_text()
    module, names = re.search(r"^module (\w+)\(([^)]*)\);", text, re.M).groups()
    body = text[text.index(f"module {module}("):text.index("endmodule")]
    ports = {}
    for name in (n.strip() for n in names.split(",")):
        m = re.search(rf"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?{name};", body, re.M)
        ports[name] = (m.group(1), int(m.group(2) or 0) + 1)
    return module, ports


def tcl_commands(text: str) -> list[str]:
    """The script's commands, continuation lines joined, comments dropped."""
    joined = text.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_block_design_connects_every_port_of_the_tiles_verilog(tile_build):
    folder, verilog = tile_build
    module, ports = top_ports(verilog)
    text = (folder / "vivado" / f"system_{module}.tcl").read_text()
    assert text.startswith("# NOT RUN HERE: Vivado is not run by this project")
    commands = tcl_commands(text)
    cells = set(re.findall(r"create_bd_cell -type (?:ip -vlnv|module -reference) (\S+) (\S+)\]", text))
    assert cells == {("xilinx.com:ip:versal_cips", "versal_cips_0"), ("xilinx.com:ip:axi_dma", "axi_dma_0"),
                     (module, "somatile_0"), ("xilinx.com:ip:smartconnect", "smartconnect_control"),
                     ("xilinx.com:ip:smartconnect", "smartconnect_memory"),
                     ("xilinx.com:ip:proc_sys_reset", "proc_sys_reset_0")}
    intf = [tuple(re.findall(r"get_bd_intf_pins (\S+)\]", c)) for c in commands if c.startswith("connect_bd_intf_net")]
    nets = [re.findall(r"get_bd_pins (\S+)\]", c) for c in commands if c.startswith("connect_bd_net")]
    # The tile's streams: the DMA's MM2S into s_axis, m_axis into its S2MM.
    assert ("axi_dma_0/M_AXIS_MM2S", "somatile_0/s_axis") in intf
    assert ("somatile_0/m_axis", "axi_dma_0/S_AXIS_S2MM") in intf
    # Every port of the Verilog is connected: a stream member through its interface, the rest by a net.
    tile_pins = {p.split("/", 1)[1] for pair in intf for p in pair if p.startswith("somatile_0/")}
    tile_nets = {p.split("/", 1)[1]: net for net in nets for p in net if p.startswith("somatile_0/")}
    for name, (direction, _) in ports.items():
        prefix = name.split("_t")[0] if name.startswith(("s_axis_", "m_axis_")) else None
        assert (prefix in tile_pins) if prefix else (name in tile_nets), f"port {name} ({direction}) is not connected"
    # ...and no pin the script names on the tile is missing from the Verilog.
    assert tile_pins <= {n.split("_t")[0] for n in ports if n.startswith(("s_axis_", "m_axis_"))}
    assert set(tile_nets) <= set(ports)
    assert "versal_cips_0/pl0_ref_clk" in tile_nets["clk"] and "axi_dma_0/m_axi_mm2s_aclk" in tile_nets["clk"]
    assert tile_nets["rst"] == ["proc_sys_reset_0/peripheral_reset", "somatile_0/rst"]
    assert tile_nets["error"] == ["somatile_0/error", "versal_cips_0/pl_ps_irq2"]
    assert ["axi_dma_0/mm2s_introut", "versal_cips_0/pl_ps_irq0"] in nets
    assert ["axi_dma_0/s2mm_introut", "versal_cips_0/pl_ps_irq1"] in nets
    # Control and memory paths of the DMA, and its configuration from the tile's stream width.
    for pair in [("versal_cips_0/M_AXI_LPD", "smartconnect_control/S00_AXI"),
                 ("smartconnect_control/M00_AXI", "axi_dma_0/S_AXI_LITE"),
                 ("axi_dma_0/M_AXI_MM2S", "smartconnect_memory/S00_AXI"),
                 ("axi_dma_0/M_AXI_S2MM", "smartconnect_memory/S01_AXI"),
                 ("smartconnect_memory/M00_AXI", "versal_cips_0/S_AXI_LPD")]:
        assert pair in intf
    width = ports["s_axis_tdata"][1]
    assert width == ports["m_axis_tdata"][1] == 32
    for key in ("c_m_axis_mm2s_tdata_width", "c_s_axis_s2mm_tdata_width"):
        assert f"CONFIG.{key} {{{width}}}" in text
    assert "CONFIG.c_include_sg {0}" in text  # simple mode, as the HAL drives it
    assert f"-part {boards.load('vck190').aie['part']}" in text and "make_wrapper -files" in text


def test_the_addresses_the_block_design_assigns_are_the_firmware_headers(tile_build, tmp_path):
    folder, verilog = tile_build
    module, _ = top_ports(verilog)
    text = (folder / "vivado" / f"system_{module}.tcl").read_text()
    assigned = {(space, segment): (int(offset, 16), int(size, 16)) for offset, size, space, segment in re.findall(
        r"assign_bd_address -offset (0x\w+) -range (0x\w+) -target_address_space \[get_bd_addr_spaces (\S+)\] "
        r"\[get_bd_addr_segs (\S+)\]", text)}
    header = tmp_path / "somatile_versal.h"
    assert vivado.main(["--c-header", str(header)]) == 0
    defines = header_defines(header)
    assert assigned[("versal_cips_0/M_AXI_LPD", "axi_dma_0/S_AXI_LITE/Reg")] == (
        defines["VERSAL_DMA_BASE"], defines["VERSAL_DMA_BYTES"])
    ocm = "versal_cips_0/S_AXI_LPD/pspmc_0_psv_ocm_ram_0"
    for space in ("axi_dma_0/Data_MM2S", "axi_dma_0/Data_S2MM"):
        assert assigned[(space, ocm)] == (defines["VERSAL_DMA_BUFFER_BASE"], defines["VERSAL_DMA_BUFFER_BYTES"])
    assert len(assigned) == 3
    assert f"CONFIG.c_sg_length_width {{{vivado.DMA_LENGTH_BITS}}}" in text
    assert defines["VERSAL_DMA_LENGTH_BITS"] == vivado.DMA_LENGTH_BITS
    # The firmware's Makefile defines no address of its own: the HAL takes them from the header.
    makefile = (FIRMWARE / "Makefile").read_text()
    assert "VERSAL_DMA_BASE ?=" not in makefile and "VERSAL_UART_BASE ?=" not in makefile
    assert "-m somatile.boards.vivado --c-header" in makefile


def header_defines(header: Path) -> dict[str, int]:
    """The generated header's ``#define VERSAL_*`` numbers (plain: the linker script includes it too)."""
    return {k: int(v, 0) for k, v in re.findall(r"^#define (VERSAL_\w+) (0x[0-9A-F]+|\d+)$", header.read_text(), re.M)}


def test_the_linker_script_takes_its_regions_from_the_address_map(tmp_path):
    """make -C firmware writes the Versal link.ld from hal/versal/link.ld.S and the generated header: its regions
    are FIRMWARE_MEMORY's, the on-chip memory the DMA's window of ADDRESS_MAP (below TF-A's BL31 at 0xFFFE0000),
    and the source names no address of its own."""
    from somatile.host.transport_firmware import firmware_make

    build = tmp_path / "fw"
    script = build / "versal" / "link.ld"
    made = firmware_make("BOARD=vck190", f"BUILD={build}", str(script))
    assert made.returncode == 0, made.stderr[-3000:]
    regions = {name: (int(origin, 16), int(length, 16)) for name, origin, length in re.findall(
        r"^\s*(\w+) \(\w+\)\s*: ORIGIN = (0x[0-9A-F]+), LENGTH = (0x[0-9A-F]+)$", script.read_text(), re.M)}
    assert regions == {name: (base, size) for name, (base, size, _) in vivado.FIRMWARE_MEMORY.items()}
    defines = header_defines(build / "gen" / "somatile_versal.h")
    assert regions == {name: (defines[f"VERSAL_{name}_BASE"], defines[f"VERSAL_{name}_BYTES"]) for name in regions}
    windows = vivado.ADDRESS_MAP["DMA_BUFFER"]
    assert {(w.base, w.size) for w in windows} == {(defines["VERSAL_DMA_BUFFER_BASE"], defines["VERSAL_DMA_BUFFER_BYTES"])}
    ocm_base, ocm_bytes = regions["OCM"]
    assert ocm_base == windows[0].base and ocm_base + ocm_bytes <= windows[0].base + windows[0].size
    assert ocm_base + ocm_bytes <= 0xFFFE0000
    assert regions["ATCM"][0] == 0  # start.S's low vectors
    assert regions["ATCM"][0] + regions["ATCM"][1] <= regions["BTCM"][0]
    source = (FIRMWARE / "hal" / "versal" / "link.ld.S").read_text()
    assert re.findall(r"\b0x[0-9A-Fa-f]+|\b\d+[KM]\b", source.split("MEMORY", 1)[1].split("}", 1)[0]) == []
    assert '#include "somatile_versal.h"' in source


def test_a_port_the_block_design_does_not_know_is_an_error_naming_it(tile_build):
    _, verilog = tile_build
    module, ports = top_ports(verilog)
    with pytest.raises(vivado.VivadoError, match=f"module {module}: port 'irq_mask' \\(input, 4 bits\\) has no "
                                                 f"connection in the block design"):
        vivado.tile_connections({**ports, "irq_mask": ("input", 4)}, module)
    with pytest.raises(vivado.VivadoError, match="port 's_axis_tready' is an input, the block design needs an output"):
        vivado.tile_connections({**ports, "s_axis_tready": ("input", 1)}, module)
    with pytest.raises(vivado.VivadoError, match="s_axis_tdata / m_axis_tdata are 24 / 32 bits"):
        vivado.tile_connections({**ports, "s_axis_tdata": ("input", 24)}, module)
    assert vivado.verilog_ports(verilog.read_text(), module) == ports


def test_the_hccs_row_unit_has_no_stream_ports_for_the_dma_and_gets_no_block_design(tmp_path):
    record = build.build(boards.load("vek280"), "hccs", tmp_path, pnr=False)
    names = {p.name for p in (Path(record["out"]) / "vivado").iterdir()}
    assert names == {"build_somatile_hccs.tcl", "somatile_hccs.xdc"}
    assert (Path(record["out"]) / "vivado" / "build_somatile_hccs.tcl").read_text().startswith("# NOT RUN HERE")
