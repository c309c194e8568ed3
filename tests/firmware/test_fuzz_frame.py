"""The firmware's frame parser and dispatch under fuzzing (firmware/fuzz/, docs/firmware.md "Fuzzing").

Both runs feed arbitrary link bytes to the same target (fuzz/fuzz_frame.c) built with AddressSanitizer and
UBSan; the fuzz HAL parses every answer again and aborts on a malformed one. The gcc mutation driver runs
everywhere; the coverage-guided libFuzzer run needs clang with its libFuzzer runtime (Debian:
``apt-get install clang libclang-rt-14-dev``; .ci/run installs it): on Linux a missing one fails the test,
elsewhere it skips with the reason.
"""

import functools
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from somatile.host.transport_firmware import FIRMWARE_DIR, build_firmware, firmware_make

LIBFUZZER_SECONDS = 20
# What the inputs must reach for the run to count: the handler of every request opcode, past the CRC check
# (HELLO reads registers, TILE forwards a command, RESET sends a bare command, CONFIGURE one with a payload;
# the static handlers themselves are inlined into on_event).
HANDLER_FUNCTIONS = ("tile_reg_read", "tile_transfer", "tile_simple_command", "tile_payload_command")


def make_firmware(*arguments: str, timeout: float) -> subprocess.CompletedProcess:
    """``make -C firmware BOARD=sim ARGUMENTS`` after `build_firmware` (which generates the headers under its
    lock); returns the finished process, output captured."""
    build_firmware("sim")
    return firmware_make("BOARD=sim", *arguments, timeout=timeout)


def mutation_driver(*arguments: str) -> subprocess.CompletedProcess:
    built = make_firmware("build/sim/fuzz_frame", timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    return subprocess.run([str(FIRMWARE_DIR / "build" / "sim" / "fuzz_frame"), *arguments], capture_output=True,
                          text=True, timeout=300)


def test_mutation_driver_bounded_run_finds_no_crash():
    result = mutation_driver("--iterations", "30000", "--seed", "20261129")
    assert result.returncode == 0, result.stderr[-3000:]
    answers, tile_commands = map(int, re.search(r"(\d+) answers, (\d+) tile commands", result.stdout).groups())
    assert "30000 inputs" in result.stdout
    assert answers > 30000 and tile_commands > 30000  # the inputs get past the CRC into every handler


def test_mutation_driver_refuses_unknown_options():
    result = mutation_driver("--iteration", "5")
    assert result.returncode == 2 and "unknown option --iteration" in result.stderr


@functools.cache
def libfuzzer_missing() -> str | None:
    """Why clang cannot build a libFuzzer target here (no clang; or Apple's clang, which has no libFuzzer
    runtime), or None."""
    if shutil.which("clang") is None:
        return "clang not installed"
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "probe.c"
        source.write_text("#include <stddef.h>\n#include <stdint.h>\n"
                          "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
        probe = subprocess.run(["clang", "-fsanitize=fuzzer", "-o", str(source.with_suffix("")), str(source)],
                               capture_output=True, text=True, timeout=120)
    return f"clang cannot link libFuzzer: {probe.stderr.strip()[-300:]}" if probe.returncode else None


def test_libfuzzer_bounded_run_finds_no_crash_and_reaches_every_handler(tmp_path):
    if missing := libfuzzer_missing():
        # .ci/run installs clang and its libFuzzer runtime on Linux: there a missing one fails. Elsewhere the
        # runtime may not exist at all (Apple's clang ships none), and the gcc driver above ran.
        message = f"{missing} (Debian: apt-get install clang libclang-rt-14-dev; .ci/run installs them on Linux)"
        if sys.platform == "linux":
            pytest.fail(message)
        pytest.skip(f"{message}; the gcc driver ran")
    result = make_firmware("fuzz-libfuzzer", f"FUZZ_SECONDS={LIBFUZZER_SECONDS}", f"FUZZ_CORPUS={tmp_path}",
                           "LIBFUZZER_ARGS=-seed=20261129 -print_coverage=1", timeout=LIBFUZZER_SECONDS + 240)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "16 seed sessions" in result.stdout
    runs = int(re.search(r"stat::number_of_executed_units: *(\d+)", result.stderr).group(1))
    new_units = int(re.search(r"stat::new_units_added: *(\d+)", result.stderr).group(1))
    assert runs > 2000 and new_units > 0, result.stderr[-2000:]  # thresholds low: the machine may be busy
    covered = set(re.findall(r"^COVERED_FUNC: .* (\w+) \S+:\d+$", result.stderr, re.MULTILINE))
    assert covered >= set(HANDLER_FUNCTIONS), sorted(covered)
