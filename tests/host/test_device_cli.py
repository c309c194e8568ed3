"""`somatile device ...` on emu://: exit codes, outputs, and errors that name the file or array."""

import re

import numpy as np
import pytest

from somatile.host.cli import main
from somatile.host.device_cli import DEMO_QUERY, read_npz
from somatile.model import hccs

URL = f"emu://?{DEMO_QUERY}"


def test_info_and_decode_report_and_check_against_the_model(capsys):
    assert main(["device", "info", "--url", URL]) == 0
    assert '"head_dim": 16' in capsys.readouterr().out
    assert main(["device", "decode", "--url", URL, "--tokens", "12"]) == 0
    assert "mismatches against the model: 0" in capsys.readouterr().out


def test_hccs_reads_vectors_writes_probs_and_counts_mismatches(tmp_path, capsys, rng):
    x = rng.integers(-128, 128, (30, 10)).astype(np.int8)
    params = dict(B=np.array([400, 400]), S=np.array([9, 9]), dmax=np.array([40, 40]),
                  fallback=np.array([False, False]), scale=np.array([0.1, 0.1]), cols=10)
    from somatile.model.params import HccsParams

    HccsParams(**params).to_yaml(tmp_path / "p.yaml")
    want = hccs.hccs_int(x, 400, 9, 40)
    np.savez(tmp_path / "v.npz", x=x, expected=want)
    args = ["device", "hccs", "--url", URL, "--vectors", str(tmp_path / "v.npz"), "--head", "1",
            "--params", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "out.npz")]
    assert main(args) == 0
    assert "mismatches against 'expected': 0" in capsys.readouterr().out
    assert np.array_equal(np.load(tmp_path / "out.npz")["probs"], want)
    np.savez(tmp_path / "w.npz", x=x, expected=want ^ 1)
    assert main(args[:5] + [str(tmp_path / "w.npz")] + args[6:]) == 1


def one_line_error(capsys, argv) -> str:
    """Run ``somatile device ...``: it must exit 2 with one line on stderr (no traceback); returns the line."""
    assert main(["device", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"somatile device {argv[0]}: "), err
    return err


def test_hccs_names_a_missing_file_or_array(tmp_path, capsys):
    assert "cannot read it as .npz" in one_line_error(capsys, ["hccs", "--url", URL, "--vectors",
                                                              str(tmp_path / "nope.npz")])
    np.savez(tmp_path / "v.npz", rows=np.zeros((2, 4), np.int8))
    assert re.search(r"no array 'x' .*\['rows'\]",
                     one_line_error(capsys, ["hccs", "--url", URL, "--vectors", str(tmp_path / "v.npz")]))


def test_an_npz_too_large_for_memory_is_refused_from_its_header(tmp_path, capsys):
    # Issue 24: a header declaring 10^12 elements, and a small file that inflates to gigabytes, were loaded.
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|i1", "fortran_order": False, "shape": (10 ** 12,)})
    with zipfile.ZipFile(tmp_path / "claims.npz", "w") as archive:
        archive.writestr("x.npy", np.lib.format.MAGIC_PREFIX + b"\x01\x00" + header.getvalue()[8:])
    line = one_line_error(capsys, ["hccs", "--url", URL, "--vectors", str(tmp_path / "claims.npz")])
    assert "array 'x' declares shape (1000000000000,)" in line
    # A small file that inflates past the limit (here 1 MiB, to keep the test small; the CLI's is 1 GiB).
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w") as member:
            np.lib.format.write_array_header_1_0(member, {"descr": "|i1", "fortran_order": False,
                                                          "shape": (1,)})  # a header that lies
            member.write(bytes(16 << 20))
    assert (tmp_path / "bomb.npz").stat().st_size < 100 << 10
    with pytest.raises(ValueError, match=r"bomb.npz: array 'x' inflates to \d+ bytes; the limit is 1048576"):
        read_npz(str(tmp_path / "bomb.npz"), "--vectors", max_bytes=1 << 20)


def test_device_errors_and_bad_urls_are_one_line_with_exit_code_2(capsys):
    assert "unknown scheme 'usb'" in one_line_error(capsys, ["info", "--url", "usb://x"])
    assert "cannot connect" in one_line_error(capsys, ["info", "--url", "tcp://127.0.0.1:1"])


def test_agree_refuses_devices_of_different_geometry_or_profile(capsys):
    assert "differ in (heads, head_dim, ring, sinks, profile)" in one_line_error(
        capsys, ["agree", "--url", URL, "--url", "emu://?board=sim", "--tokens", "2"])
    assert "(2, 16, 8, 2, 'paper'), (2, 16, 8, 2, 'wide')" in one_line_error(
        capsys, ["agree", "--url", URL, "--url", URL.replace("board=sim&", "board=sim_wide&"), "--tokens", "2"])


def test_agree_compares_wide_profile_devices_with_the_wide_spec(capsys):
    """emu:// and the C firmware (host build, on golden tile models) of the wide-profile board agree with the
    numpy spec of the wide profile."""
    from somatile.host.emu import board_params, start_tile_server
    from somatile.host.transport_firmware import FirmwareProcess

    params, _ = board_params("sim_wide")
    with FirmwareProcess(start_tile_server(params), board="sim_wide", link="tcp") as fw:
        assert main(["device", "agree", "--url", "emu://?board=sim_wide", "--url", fw.url, "--tokens", "8"]) == 0
    assert "agree" in capsys.readouterr().out


def test_single_step_decode_keeps_the_step_shape(rng):
    import somatile.host
    from somatile.host.device_cli import demo_config

    with somatile.host.open(URL) as dev:
        dev.configure(demo_config(dev.info()))
        q, k, v = (rng.integers(-128, 128, (2, 16)).astype(np.int8) for _ in range(3))
        assert dev.decode(q, k, v).shape == (2, 16)
