"""The late-endpoint summary over nextpnr's SDF (boards/timing.py) on a hand-written routed design."""

import pytest

from somatile.boards.timing import SdfError, endpoint_summary, register_name

# a -> LUT -> b2 (clock-to-out 500, nets 300 + 600, LUT 240, setup 100: 1,740 ps) and a -> b3 directly
# (500 + 1,000 + setup 100: 1,600 ps); the maximum of each (min:typ:max) triple counts.
SDF = r"""(DELAYFILE
  (SDFVERSION "3.0")
  (DIVIDER /)
  (TIMESCALE 1ps)
  (CELL (CELLTYPE "top") (INSTANCE )
    (DELAY (ABSOLUTE
      (INTERCONNECT unit.a_TRELLIS_FF_Q/Q unit.out\$1_LUT4_Z/A (100:200:300) (100:200:300))
      (INTERCONNECT unit.out\$1_LUT4_Z/F unit.b_TRELLIS_FF_Q_2/DI (400:500:600) (400:500:600))
      (INTERCONNECT unit.a_TRELLIS_FF_Q/Q unit.b_TRELLIS_FF_Q_3/DI (1000:1000:1000) (1000:1000:1000))
      (INTERCONNECT clk/O unit.a_TRELLIS_FF_Q/CLK (0:0:0) (0:0:0))
      (INTERCONNECT \$gbuf\$cpu_clk/CLKO unit.b_TRELLIS_FF_Q_2/CLK (0:0:0) (0:0:0))
      (INTERCONNECT \$gbuf\$cpu_clk/CLKO unit.b_TRELLIS_FF_Q_3/CLK (0:0:0) (0:0:0))
      (INTERCONNECT pll/CLKOS \$gbuf\$cpu_clk/CLKI (150:150:150) (150:150:150))
    )))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE unit.a_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (430:477:500) (430:477:500))))
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (50:50:50) (0:0:0))))
  (CELL (CELLTYPE "TRELLIS_COMB") (INSTANCE unit.out\$1_LUT4_Z)
    (DELAY (ABSOLUTE (IOPATH A F (200:220:240) (200:220:240)))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE unit.b_TRELLIS_FF_Q_2)
    (DELAY (ABSOLUTE (IOPATH CLK Q (500:500:500) (500:500:500))))
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (100:100:100) (0:0:0))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE unit.b_TRELLIS_FF_Q_3)
    (DELAY (ABSOLUTE (IOPATH CLK Q (500:500:500) (500:500:500))))
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (100:100:100) (0:0:0))))
)
"""


def test_latest_arrival_is_clock_to_out_plus_nets_and_cells_plus_setup():
    summary = endpoint_summary(SDF, period_ns=1.5)
    # a's own input is not reached from any startpoint, so two endpoints are timed.
    assert (summary.timed, summary.late, summary.worst_ns) == (2, 2, 1.74)
    (group,) = summary.groups
    assert (group.start, group.end, group.count, group.worst_ns) == ("unit.a", "unit.b", 2, 1.74)


def test_only_endpoints_later_than_the_period_are_grouped():
    summary = endpoint_summary(SDF, period_ns=1.65)
    assert (summary.late, [(g.count, g.worst_ns) for g in summary.groups]) == (1, [(1, 1.74)])
    assert endpoint_summary(SDF, period_ns=2.0).groups == ()


def test_registers_of_another_clock_domain_are_late_beyond_its_period():
    # b2 and b3 (clocked by the PLL's CLKOS through a global buffer) arrive at 1.74 and 1.60 ns: late at
    # 1.5 ns, in time at a 2 ns period; at 1.7 ns b2 alone is late.
    summary = endpoint_summary(SDF, period_ns=1.5, domains=(("CLKOS", 2.0),))
    assert (summary.timed, summary.late, summary.groups) == (2, 0, ())
    assert summary.as_dict()["domains"] == [["CLKOS", 2.0]]
    assert endpoint_summary(SDF, period_ns=1.5, domains=(("CLKOS", 1.7),)).late == 1
    # The source pin whole; the buffer's output or the net's name is not the source.
    assert endpoint_summary(SDF, period_ns=1.5, domains=(("pll/CLKOS", 2.0),)).late == 0
    with pytest.raises(SdfError, match="clocks no endpoint"):
        endpoint_summary(SDF, period_ns=1.5, domains=(("cpu_clk", 2.0),))


def test_a_domain_whose_clock_drives_no_endpoint_is_an_error():
    with pytest.raises(SdfError, match="clock source 'CLKOP' clocks no endpoint"):
        endpoint_summary(SDF, period_ns=1.5, domains=(("CLKOP", 2.0),))


def test_nanosecond_timescale_and_packer_suffixes():
    assert endpoint_summary(SDF.replace("1ps", "1ns"), period_ns=2000.0).worst_ns == 1740.0
    assert register_name("unit.decode.fld_TRELLIS_FF_Q_38") == "unit.decode.fld"
    assert register_name("unit.out$138_LUT4_B_Z") == "unit.out$138"
    assert register_name("unit.mem.0.15") == "unit.mem.0.15"


@pytest.mark.parametrize("text, message", [
    ("(CELL)", "not an SDF file"),
    ("(DELAYFILE (TIMESCALE 3ps))", "TIMESCALE '3ps'"),
    ("(DELAYFILE))", "unbalanced"),
])
def test_bad_sdf_is_reported(text, message):
    with pytest.raises(SdfError, match=message):
        endpoint_summary(text, 10.0)
