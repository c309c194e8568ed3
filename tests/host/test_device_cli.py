"""`somatile device ...` on emu://: exit codes, outputs, and errors that name the file or array."""

import numpy as np
import pytest

from somatile.host.cli import main
from somatile.host.device_cli import DEMO_QUERY
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


def test_hccs_names_a_missing_file_or_array(tmp_path):
    with pytest.raises(SystemExit, match="cannot read --vectors .*nope.npz"):
        main(["device", "hccs", "--url", URL, "--vectors", str(tmp_path / "nope.npz")])
    np.savez(tmp_path / "v.npz", rows=np.zeros((2, 4), np.int8))
    with pytest.raises(SystemExit, match=r"has no array 'x' .*\['rows'\]"):
        main(["device", "hccs", "--url", URL, "--vectors", str(tmp_path / "v.npz")])


def test_agree_refuses_devices_of_different_geometry():
    with pytest.raises(ValueError, match="differ in \\(heads, head_dim, ring, sinks\\)"):
        main(["device", "agree", "--url", URL, "--url", "emu://?board=sim", "--tokens", "2"])


def test_single_step_decode_keeps_the_step_shape(rng):
    import somatile.host
    from somatile.host.device_cli import demo_config

    with somatile.host.open(URL) as dev:
        dev.configure(demo_config(dev.info()))
        q, k, v = (rng.integers(-128, 128, (2, 16)).astype(np.int8) for _ in range(3))
        assert dev.decode(q, k, v).shape == (2, 16)
