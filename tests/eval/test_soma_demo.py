"""The Soma tour of `make demo` (eval/soma_demo.py) on a small shape."""

from somatile.eval import soma_demo


def test_demo_runs(capsys):
    assert soma_demo.main(["--heads", "2", "--kv-heads", "1", "--head-dim", "8", "--layers", "2", "--steps", "3"]) == 0
    text = capsys.readouterr().out
    assert "numba fast path == numpy spec on 300 tokens (ring wrapped): True" in text
    assert "output at t=0 is all zeros: True" in text
