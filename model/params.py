"""Per-model HCCS parameter set: what `somatile calibrate` / `compare --save-params` write and what the device
API ``configure()`` and the firmware load.

YAML layout (one list entry per head, lists of equal length)::

    format: somatile-hccs-params
    version: 1
    cols: 128            # row length the integers were validated for (the rules depend on it)
    mode: div            # div | clb
    out: uint8           # uint8 | int16
    B: [255, 255]        # int, 1..32767
    S: [6, 2]            # int, 0..127
    dmax: [40, 120]      # int, 0..127
    fallback: [false, true]   # head keeps the exponential (integer-exp softmax)
    scale: [0.1, 0.08]   # float logit scale per int8 step (logit = x * scale)
    c: [4.0, 12.0]       # optional: the float clip range calibrated in logit units
    error: [0.02, 0.41]  # optional: the calibration objective's value per head
    objective: tv        # optional: which objective produced `error`
    profile: paper       # optional (default paper): the integer profile of docs/numerics.md
    normaliser: hccs     # optional (default hccs)
    fallback_exp: somatile    # optional (default somatile): the integer exp of the fallback heads

``fallback_exp`` names which integer exp the fallback heads run, so that the file predicts the bits of the
hardware it is for: ``somatile`` (:mod:`somatile.model.intexp`, what the PL tile and every somatile backend
run) or ``aie4ml`` (:mod:`somatile.model.aie_exp`, aie4ml's exact-exp kernel, what the AI Engine runs for
``somatile build --top aie``; docs/aie.md). Profile ``paper`` only: the wide profile has its own exp.

Profile ``wide`` (docs/numerics.md, "Wide normalisers"): ``normaliser`` is hccs or pwl2, B/S/dmax follow
the wide rules (S in Q8, dmax in 2^-8 bit of int16 base-2 logits), ``mode``, ``out`` and ``scale`` are not
used (the logit unit is fixed, probabilities are Q15) and may be left out. A file is read for one profile:
``from_yaml(path, profile=...)`` refuses the other with an error that names both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import yaml

from somatile.model import aie_exp, hccs, intexp, wide
from somatile.model.files import load_yaml

FORMAT = "somatile-hccs-params"
VERSION = 1
_REQUIRED = ("format", "version", "cols", "mode", "out", "B", "S", "dmax", "fallback", "scale")
_OPTIONAL = ("c", "error", "objective", "allow_zero_floor", "profile", "normaliser", "fallback_exp")
_WIDE_OPTIONAL = ("mode", "out", "scale")
PROFILE_NORMALISERS = {"paper": ("hccs",), "wide": ("hccs", "pwl2")}
SOMATILE_EXP, AIE4ML_EXP = "somatile", "aie4ml"
FALLBACK_EXPS = (SOMATILE_EXP, AIE4ML_EXP)
"""``fallback_exp`` choices: somatile's integer exp (the PL tile's, the default) or aie4ml's exact-exp kernel."""


def check_fallback_exp(fallback_exp: str, profile: str) -> None:
    """ValueError naming ``fallback_exp`` unless it is one of :data:`FALLBACK_EXPS` that ``profile`` can run
    (aie4ml's exp only in profile paper). Callers that calibrate check it before the search."""
    if fallback_exp not in FALLBACK_EXPS:
        raise ValueError(f"fallback_exp: expected one of {list(FALLBACK_EXPS)}, got {fallback_exp!r}")
    if profile != "paper" and fallback_exp != SOMATILE_EXP:
        raise ValueError(f"fallback_exp: {fallback_exp!r} needs profile 'paper' (aie4ml's exact-exp kernel "
                         f"takes int8 logits); profile {profile!r} runs its own exp")


@dataclasses.dataclass(frozen=True)
class HccsParams:
    """Validated per-head HCCS integers plus the fallback flags and input scales of one model.

    B, S, dmax: int64 (H,); fallback: bool (H,) (True = the head runs the integer-exp softmax); scale:
    float64 (H,) logit scale per int8 step; cols: row length the integers were checked for; mode, out: the
    HCCS normalisation and output type; c, error: optional float (H,) calibration record; fallback_exp: the
    integer exp of the fallback heads (:data:`FALLBACK_EXPS`).
    """

    B: np.ndarray
    S: np.ndarray
    dmax: np.ndarray
    fallback: np.ndarray
    scale: np.ndarray
    cols: int
    mode: str = "div"
    out: str = "uint8"
    c: np.ndarray | None = None
    error: np.ndarray | None = None
    objective: str | None = None
    allow_zero_floor: bool = False
    profile: str = "paper"
    normaliser: str = "hccs"
    fallback_exp: str = SOMATILE_EXP

    def __post_init__(self):
        heads = len(np.atleast_1d(self.B))
        if not isinstance(self.cols, (int, np.integer)) or self.cols < 1:
            raise ValueError(f"cols: expected a positive integer row length, got {self.cols!r}")
        if self.profile not in PROFILE_NORMALISERS:
            raise ValueError(f"profile: expected one of {sorted(PROFILE_NORMALISERS)}, got {self.profile!r}")
        if self.normaliser not in PROFILE_NORMALISERS[self.profile]:
            raise ValueError(f"normaliser: expected one of {PROFILE_NORMALISERS[self.profile]} in profile "
                             f"{self.profile!r}, got {self.normaliser!r}")
        check_fallback_exp(self.fallback_exp, self.profile)
        hccs.code_of(hccs.MODE_CODES, "mode", self.mode)
        hccs.code_of(hccs.OUT_CODES, "out", self.out)
        if self.profile == "wide":
            if int(self.cols) > wide.MAX_COLS:
                raise ValueError(f"cols: {self.cols} exceeds the wide row limit {wide.MAX_COLS}")
            B, S, dmax = wide.check_params(self.normaliser, self.B, self.S, self.dmax, heads)
        else:
            B, S, dmax = hccs.check_params(self.B, self.S, self.dmax, int(self.cols), heads,
                                           allow_zero_floor=self.allow_zero_floor)
        fallback = np.atleast_1d(np.asarray(self.fallback))
        if fallback.dtype != np.bool_ or fallback.shape != (heads,):
            raise ValueError(f"fallback: expected {heads} booleans, got {self.fallback!r}")
        scale = np.atleast_1d(np.asarray(1.0 if self.scale is None else self.scale, np.float64))
        if scale.size == 1:
            scale = np.repeat(scale, heads)
        if scale.shape != (heads,):
            raise ValueError(f"scale: expected {heads} per-head scales, got {scale.size}")
        if self.profile == "paper":
            intexp.exp_mult_from_scale(scale)
        if self.fallback_exp == AIE4ML_EXP:
            aie_exp.exp_kq_from_scale(scale, fallback)
        for name in ("c", "error"):
            value = getattr(self, name)
            if value is not None:
                arr = np.atleast_1d(np.asarray(value, np.float64))
                if arr.shape != (heads,):
                    raise ValueError(f"{name}: expected {heads} per-head values, got {arr.size}")
                object.__setattr__(self, name, arr)
        for name, value in (("B", B), ("S", S), ("dmax", dmax), ("fallback", fallback), ("scale", scale)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "cols", int(self.cols))

    @property
    def heads(self) -> int:
        return len(self.B)

    @property
    def exp_mult(self) -> np.ndarray:
        """Integer input scale M per head for somatile's integer-exp softmax (derived from ``scale``)."""
        return intexp.exp_mult_from_scale(self.scale)

    @property
    def exp_kq(self) -> np.ndarray:
        """Step KQ per head for aie4ml's exact-exp kernel (derived from ``scale``; checked on fallback heads)."""
        return aie_exp.exp_kq_from_scale(self.scale, self.fallback)

    def apply_int(self, x: np.ndarray, mask=None, *, impl: str = "numba") -> np.ndarray:
        """Run the deployed integer normaliser on the profile's logits (H, R, N) (int8 "paper", int16
        "wide"): the normaliser per head, on fallback heads the integer exp ``fallback_exp`` names. Returns
        ``out`` dtype ("paper") or uint16 Q15 ("wide"); rows of length != cols are rejected, and so is a mask
        that leaves out elements of a fallback head's rows under aie4ml's exp (its kernel has no mask)."""
        if x.ndim != 3 or x.shape[0] != self.heads:
            raise ValueError(f"x: expected ({self.heads}, R, N) logits for {self.heads} heads, got {x.shape}")
        if x.shape[-1] != self.cols:
            raise ValueError(f"x: rows have {x.shape[-1]} elements, the parameters were checked for cols = "
                             f"{self.cols}")
        if self.profile == "wide":
            y = wide.wide_softmax(x, self.normaliser, self.B, self.S, self.dmax, mask=mask, impl=impl)
            fb = np.flatnonzero(self.fallback)
            if fb.size:
                y[fb] = wide.wide_softmax(np.ascontiguousarray(x[fb]), "exp", mask=None if mask is None else
                                          np.ascontiguousarray(mask[fb]), impl=impl)
            return y
        y = hccs.hccs_int(x, self.B, self.S, self.dmax, mode=self.mode, out=self.out, mask=mask, impl=impl,
                          allow_zero_floor=self.allow_zero_floor)
        fb = np.flatnonzero(self.fallback)
        if fb.size and self.fallback_exp == AIE4ML_EXP:
            if mask is not None and not np.all(np.asarray(mask)[fb]):
                raise ValueError(f"mask: fallback_exp 'aie4ml': the exact-exp kernel has no mask, and the mask "
                                 f"leaves out elements of fallback head {int(fb[0])}")
            y[fb] = aie_exp.aie_exp_softmax(np.ascontiguousarray(x[fb]), self.exp_kq[fb], out=self.out, impl=impl)
        elif fb.size:
            y[fb] = intexp.intexp_softmax(np.ascontiguousarray(x[fb]), self.exp_mult[fb], out=self.out,
                                          mask=None if mask is None else mask[fb], impl=impl)
        return y

    def apply_float(self, logits: np.ndarray, mask=None) -> np.ndarray:
        """The float reference of the deployed normaliser on float logits (H, R, N): per head the float
        clipped-linear family that the integers represent exactly (:func:`quant.float_params_from_int`),
        exact softmax on fallback heads. Returns float64 probabilities."""
        from somatile.model.quant import float_params_from_int
        if logits.ndim != 3 or logits.shape[0] != self.heads:
            raise ValueError(f"logits: expected ({self.heads}, R, N) for {self.heads} heads, got {logits.shape}")
        if self.profile == "wide":
            y = wide.float_reference(logits, self.normaliser, self.B, self.S, self.dmax, mask)
        else:
            y = hccs.hccs_float_bsd(logits, *float_params_from_int(self.B, self.S, self.dmax, self.scale), mask)
        fb = np.flatnonzero(self.fallback)
        if fb.size:
            y[fb] = hccs.softmax(logits[fb], None if mask is None else mask[fb])
        return y

    def to_dict(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, "profile": self.profile, "normaliser": self.normaliser,
             "cols": self.cols}
        if self.profile == "paper":
            d.update(mode=self.mode, out=self.out)
        d.update(B=self.B.tolist(), S=self.S.tolist(), dmax=self.dmax.tolist(), fallback=self.fallback.tolist())
        if self.profile == "paper":
            d.update(scale=self.scale.tolist(), fallback_exp=self.fallback_exp)
        if self.c is not None:
            d["c"] = self.c.tolist()
        if self.error is not None:
            d["error"] = self.error.tolist()
        if self.objective is not None:
            d["objective"] = self.objective
        if self.allow_zero_floor:
            d["allow_zero_floor"] = True
        return d

    def to_yaml(self, path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None))

    @classmethod
    def from_dict(cls, d: dict, source: str = "params") -> "HccsParams":
        """Build from a mapping in the YAML layout; errors name ``source`` and the key at fault."""
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a mapping with keys {list(_REQUIRED)}, got {type(d).__name__}")
        unknown = sorted(set(d) - set(_REQUIRED) - set(_OPTIONAL))
        if unknown:
            raise ValueError(f"{source}: unknown key {unknown[0]!r} (known: {list(_REQUIRED + _OPTIONAL)})")
        profile = d.get("profile", "paper")
        missing = [k for k in _REQUIRED if k not in d and not (profile == "wide" and k in _WIDE_OPTIONAL)]
        if missing:
            raise ValueError(f"{source}: missing key {missing[0]!r}")
        if d["format"] != FORMAT or d["version"] != VERSION:
            raise ValueError(f"{source}: key 'format'/'version': expected {FORMAT!r} version {VERSION}, got "
                             f"{d['format']!r} version {d['version']!r}")
        lists = {}
        for key, kind in (("B", int), ("S", int), ("dmax", int), ("fallback", bool), ("scale", float),
                          ("c", float), ("error", float)):
            if key not in d:
                continue
            value = d[key]
            if not isinstance(value, list) or not value:
                raise ValueError(f"{source}: key {key!r}: expected a non-empty list (one per head), got {value!r}")
            for i, v in enumerate(value):
                number = isinstance(v, (int, float)) and not isinstance(v, bool)
                ok = isinstance(v, bool) if kind is bool else number and (kind is float or float(v).is_integer())
                if not ok:
                    raise ValueError(f"{source}: key {key!r}: head {i}: expected {kind.__name__}, got {v!r}")
            lists[key] = value
        for key in ("allow_zero_floor",):
            if key in d and not isinstance(d[key], bool):
                raise ValueError(f"{source}: key {key!r}: expected true or false, got {d[key]!r}")
        for key in ("profile", "normaliser", "mode", "out", "objective", "fallback_exp"):
            if key in d and not isinstance(d[key], str):
                raise ValueError(f"{source}: key {key!r}: expected a string, got {d[key]!r}")
        lengths = {k: len(v) for k, v in lists.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"{source}: per-head lists differ in length: {lengths}")
        try:
            return cls(B=np.array(lists["B"], np.int64), S=np.array(lists["S"], np.int64),
                       dmax=np.array(lists["dmax"], np.int64), fallback=np.array(lists["fallback"], bool),
                       scale=np.array(lists.get("scale", 1.0), np.float64), cols=d["cols"],
                       mode=d.get("mode", "div"), out=d.get("out", "uint8"), c=lists.get("c"),
                       error=lists.get("error"), objective=d.get("objective"),
                       allow_zero_floor=bool(d.get("allow_zero_floor", False)), profile=profile,
                       normaliser=d.get("normaliser", "hccs"), fallback_exp=d.get("fallback_exp", SOMATILE_EXP))
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from exc

    @classmethod
    def from_yaml(cls, path, profile: str | None = None) -> "HccsParams":
        """Read a parameter file; with ``profile`` a file of the other profile is an error naming both."""
        path = Path(path)
        try:
            data = load_yaml(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{path}: cannot read HCCS parameters: {exc}") from exc
        params = cls.from_dict(data, str(path))
        if profile is not None and params.profile != profile:
            raise ValueError(f"{path}: key 'profile': the parameters are for profile {params.profile!r}, "
                             f"expected {profile!r} (calibrate again with --profile {profile})")
        return params
