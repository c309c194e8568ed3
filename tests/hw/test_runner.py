"""sim/runner.py: build reuse, data hand-over to the testbench and readable failures."""

import time

import pytest

from somatile.sim import runner
from tests.hw.runner_probe import Counter


def test_inputs_reach_the_testbench_and_outputs_come_back():
    result = runner.build_and_test(Counter, {"width": 8}, "probe_counter", "tests.hw.runner_probe", "counts_as_asked",
                                   inputs={"cycles": 37})
    assert result.outputs["count"].tolist() == [37]
    assert result.tests_passed == 1


def test_an_unchanged_build_is_reused_and_a_new_parameter_builds_anew():
    first = runner.build(Counter, {"width": 8}, "probe_counter")
    started = time.perf_counter()
    again = runner.build(Counter, {"width": 8}, "probe_counter")
    assert again.directory == first.directory
    assert time.perf_counter() - started < 1.0, "an unchanged build must not recompile"
    other = runner.build(Counter, {"width": 9}, "probe_counter")
    assert other.directory != first.directory


def test_a_build_keeps_its_binary_but_not_the_compiler_by_products(tmp_path, monkeypatch):
    monkeypatch.setenv("SOMATILE_BUILD_DIR", str(tmp_path))
    result = runner.build_and_test(Counter, {"width": 7}, "probe_counter", "tests.hw.runner_probe", "counts_as_asked",
                                   inputs={"cycles": 5})
    assert result.build.directory.parent == tmp_path
    leftovers = [p.name for pattern in ("*.gch", "*.o", "*.a") for p in result.build.directory.glob(pattern)]
    assert leftovers == []
    # The kept binary alone runs the next test: no recompilation is needed.
    assert runner.build_and_test(Counter, {"width": 7}, "probe_counter", "tests.hw.runner_probe", "counts_as_asked",
                                 inputs={"cycles": 9}).outputs["count"].tolist() == [9]


def test_a_failing_cocotb_test_names_itself_and_its_message():
    with pytest.raises(runner.SimulationFailure, match=r"always_fails.*probe failure: count is 3"):
        runner.build_and_test(Counter, {"width": 8}, "probe_counter", "tests.hw.runner_probe", "always_fails")


def test_an_unknown_simulator_is_refused_by_name():
    with pytest.raises(ValueError, match="simulator: expected one of"):
        runner.build(Counter, {"width": 8}, "probe_counter", simulator="modelsim")
