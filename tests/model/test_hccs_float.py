"""Float HCCS references, quantisation helpers, the HccsParams YAML and the synthetic logits."""

import numpy as np
import pytest
import yaml

from somatile.model import hccs, intexp, quant, synth
from somatile.model.params import HccsParams


def test_hccs_float_matches_the_seed_formula(rng):
    x = rng.normal(0, 2, size=(3, 20, 16))
    c = np.array([1.0, 4.0, 12.0])
    centered = x - x.max(-1, keepdims=True)
    shifted = np.clip(centered, -c[:, None, None], None) + c[:, None, None]
    seed = shifted / (shifted.sum(-1, keepdims=True) + 1e-8)
    # float64 tolerance: only the seed's +1e-8 in the denominator differs (relative 1e-8 / c).
    assert np.allclose(hccs.hccs_float(x, c), seed, rtol=1e-8, atol=0)
    assert np.allclose(hccs.hccs_float_bsd(x, c, 1.0, c), hccs.hccs_float(x, c), rtol=1e-12, atol=0)


def test_float_masks_and_empty_rows(rng):
    x = rng.normal(size=(4, 6))
    x[0, 2] = np.inf
    mask = np.ones(x.shape, bool)
    mask[0, 2] = False
    mask[1] = False
    for f in (hccs.softmax, lambda a, m, **k: hccs.hccs_float(a, 3.0, m, **k)):
        p = f(x, mask)
        assert p[0, 2] == 0 and np.allclose(p[[0, 2, 3]].sum(-1), 1, rtol=1e-12)
        assert not p[1].any()
        assert np.allclose(f(x, mask, empty_row="uniform")[1], 1 / 6, rtol=1e-12)
    rest = hccs.softmax(np.delete(x[0], 2)[None])
    assert np.allclose(hccs.softmax(x, mask)[0, [0, 1, 3, 4, 5]], rest[0], rtol=1e-12)


def test_float_bad_input_named():
    with pytest.raises(ValueError, match=r"logits: non-finite value nan at \(head, row, col\) = \(0, 1, 2\)"):
        x = np.zeros((2, 3, 4))
        x[0, 1, 2] = np.nan
        hccs.softmax(x)
    with pytest.raises(TypeError, match="logits: expected float logits"):
        hccs.softmax(np.zeros((2, 3), np.int8))
    with pytest.raises(ValueError, match="c: head 1 value -1.0 must be finite and > 0"):
        hccs.hccs_float(np.zeros((2, 3, 4)), [1.0, -1.0])
    with pytest.raises(ValueError, match=r"head 0: B - S\*dmax"):
        hccs.hccs_float_bsd(np.zeros((3, 4)), 1.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="empty_row"):
        hccs.softmax(np.zeros((3, 4)), empty_row="nan")


def test_quantize_rounding_and_saturation():
    x = np.array([[0.5, 1.5, -0.5, -1.5, 2.5, 300.0, -300.0]])
    assert quant.quantize_logits(x, 1.0).tolist() == [[0, 2, 0, -2, 2, 127, -128]]
    assert quant.quantize_logits(x, 1.0, rounding="half_away").tolist() == [[1, 2, -1, -2, 3, 127, -128]]
    logits = np.array([[[1.0, -4.0]], [[0.0, 0.0]]])
    assert np.allclose(quant.choose_scales(logits), [4 / 127, 1 / 127])
    with pytest.raises(ValueError, match="scale: expected one positive"):
        quant.quantize_logits(logits, [1.0, 0.0])


def test_int_params_from_clip_are_legal_and_follow_c(rng):
    for cols in (8, 64, 128, 512, 2000):
        B, S, D = quant.int_params_from_clip([0.3, 2.0, 8.0, 50.0], 0.1, cols)
        hccs.check_params(B, S, D, cols, 4)
        assert np.all(S >= 1) and np.all(np.diff(D) >= 0)
    B, S, D = quant.int_params_from_clip(4.0, 0.1, 128)
    assert D[0] == 40 and B[0] - S[0] * D[0] == quant.min_floor(128)
    with pytest.raises(ValueError, match="cols = 20000: no legal HCCS parameters"):
        quant.int_params_from_clip(4.0, 0.1, 20000)


def test_integer_kernel_tracks_its_float_family(rng):
    """The integer parameters from a float clip reproduce hccs_float_bsd at those parameters within the
    uint8 floor (2/255: the reciprocal floor plus the output floor, tests/model/test_hccs.py)."""
    logits = rng.normal(0, 2.5, size=(2, 200, 48))
    scale = quant.choose_scales(logits)
    xq = quant.quantize_logits(logits, scale)
    B, S, D = quant.int_params_from_clip([3.0, 6.0], scale, 48)
    fb, fs, fd = quant.float_params_from_int(B, S, D, scale)
    expect = hccs.hccs_float_bsd(xq.astype(np.float64) * scale[:, None, None], fb, fs, fd)
    got = hccs.hccs_int(xq, B, S, D) / 255.0
    assert np.all(np.abs(got - expect) < 2 / 255)


def make_params(**over):
    base = dict(B=np.array([255, 200]), S=np.array([6, 2]), dmax=np.array([40, 90]),
                fallback=np.array([False, True]), scale=np.array([0.1, 0.05]), cols=128, c=[4.0, 4.5],
                error=[0.1, 0.4], objective="tv")
    return HccsParams(**(base | over))


def test_params_yaml_round_trip(tmp_path):
    p = make_params()
    p.to_yaml(tmp_path / "p.yaml")
    q = HccsParams.from_yaml(tmp_path / "p.yaml")
    for name in ("B", "S", "dmax", "fallback", "scale", "c", "error"):
        assert np.array_equal(getattr(p, name), getattr(q, name)), name
    assert (q.cols, q.mode, q.out, q.objective) == (128, "div", "uint8", "tv")
    assert np.array_equal(q.exp_mult, intexp.exp_mult_from_scale([0.1, 0.05]))


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(gain=[1, 2]), "unknown key 'gain'"),
    (lambda d: d.pop("dmax"), "missing key 'dmax'"),
    (lambda d: d.update(B=[255, 2.5]), "key 'B': head 1: expected int, got 2.5"),
    (lambda d: d.update(fallback=[0, 1]), "key 'fallback': head 0: expected bool"),
    (lambda d: d.update(S=[6]), "per-head lists differ in length"),
    (lambda d: d.update(B=[255, 100]), r"head 1: B - S\*dmax = 100 - 2\*90 = -80 < 0"),
    (lambda d: d.update(mode="fast"), "mode: expected one of"),
    (lambda d: d.update(scale=[0.1, 5.0]), "scale: head 1 scale 5 gives M"),
    (lambda d: d.update(version=2), "key 'format'/'version'"),
    (lambda d: d.update(allow_zero_floor="false"), "key 'allow_zero_floor': expected true or false, got 'false'"),
    (lambda d: d.update(profile="fast"), "profile: expected one of \\['paper', 'wide'\\]"),
    (lambda d: d.update(normaliser="pwl2"), "normaliser: expected one of \\('hccs',\\) in profile 'paper'"),
])
def test_params_yaml_errors_name_file_and_key(tmp_path, edit, message):
    d = make_params().to_dict()
    edit(d)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ValueError, match=message) as info:
        HccsParams.from_yaml(path)
    assert str(path) in str(info.value)


def test_params_apply_int_uses_intexp_on_fallback_heads(rng):
    p = make_params()
    x = rng.integers(-128, 128, size=(2, 30, 128)).astype(np.int8)
    y = p.apply_int(x)
    assert np.array_equal(y[0], hccs.hccs_int(x[0], 255, 6, 40))
    assert np.array_equal(y[1], intexp.intexp_softmax(x[1], p.exp_mult[1]))
    with pytest.raises(ValueError, match="parameters were checked for cols = 128"):
        p.apply_int(x[:, :, :64].copy())


def test_synthetic_logits_have_peaked_and_broad_heads():
    logits, mask, kinds = synth.synthetic_logits(6, 300, 64, peaked=2, seed=3)
    assert logits.dtype == np.float32 and logits.shape == (6, 300, 64) and mask.all()
    assert kinds == ["previous", "sink", "broad", "broad", "broad", "broad"]
    top = hccs.softmax(logits).max(-1).mean(-1)
    assert top[0] > 0.9 and top[1] > 0.6 and np.all(top[2:] < 0.6) and np.all(np.diff(top[2:]) > 0)
    again, _, _ = synth.synthetic_logits(6, 300, 64, peaked=2, seed=3)
    assert np.array_equal(logits, again)
    _, padded, _ = synth.synthetic_logits(2, 50, 64, padding=True)
    assert padded[:, :, 0].all() and not padded.all()


def test_params_apply_float_falls_back_to_softmax(rng):
    p = make_params()
    logits = rng.normal(0, 3, size=(2, 20, 128))
    y = p.apply_float(logits)
    assert np.allclose(y[1], hccs.softmax(logits[1]), rtol=1e-12)
    fb, fs, fd = quant.float_params_from_int(255, 6, 40, 0.1)
    assert np.allclose(y[0], hccs.hccs_float_bsd(logits[0], fb, fs, fd), rtol=1e-12)
    with pytest.raises(ValueError, match=r"logits: expected \(2, R, N\)"):
        p.apply_float(logits[:1])


@pytest.mark.parametrize("text,message", [
    ("cols: 128\ncols: 64\n", "key 'cols' given twice"),
    ("allow_zero_floor: yes\n", "'yes' is a boolean in YAML 1.1"),
])
def test_params_yaml_is_read_strictly(tmp_path, text, message):
    """A key given twice or a YAML 1.1 boolean is an error with its line, not read one way or the other."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(make_params().to_dict(), sort_keys=False) + text)
    with pytest.raises(ValueError, match=message) as info:
        HccsParams.from_yaml(path)
    assert str(path) in str(info.value)
