"""The Metal sources of somatile, assembled for both dispatch paths from one text.

Each kernel family (``hccs``, ``intexp``, ``wide``, ``soma``, ``sfa``) is ``host/metal/<family>.metal``
assembled after a generated prelude (the model's integer constants as ``#define`` lines, so no width is
re-declared by hand) and ``common.metal`` (shared helpers). Metal's runtime compiler cannot resolve includes of user files, hence the
assembly here rather than ``#include`` lines.

- PyObjC and the CPU emulator compile `library_source(family)` whole and call its ``kernel void`` entries.
- MLX builds a kernel from a body only: `mlx_spec(family, entry)` gives the same source as the ``header``
  and, as the body, the entry point's own body preceded by aliases from the entry's parameter names to the
  thread attributes MLX names (``group`` -> ``threadgroup_position_in_grid`` ...). Buffer parameters keep
  their names, which MLX declares the same way (inputs ``const device T*``, then outputs ``device T*``).

`python -m somatile.host.metal_kernels OUTDIR` writes every assembled source for a compile check on a Mac
(``xcrun -sdk macosx metal -c OUTDIR/hccs.metal``, see docs/metal.md).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from pathlib import Path

from somatile.host.metal_emu import GRID_ATTRIBUTES, METAL_DIR, EntryPoint, parse_entry_points

FAMILIES: dict[str, tuple[str, ...]] = {
    "hccs": ("common.metal", "hccs.metal"),
    "intexp": ("common.metal", "intexp.metal"),
    "wide": ("common.metal", "intexp.metal", "wide.metal"),
    "soma": ("common.metal", "hccs.metal", "intexp.metal", "wide.metal", "soma.metal"),
    "sfa": ("common.metal", "sfa.metal"),
}

SOMA_GEOMETRY = ("heads", "kv_heads", "dim", "ring", "sinks", "include_self", "gated", "field_keys",
                 "profile", "hccs_clb", "gamma_q15")
"""Word order of the Soma kernel's int32 geometry buffer (``SOMA_G_<NAME>`` in the kernel)."""
SOMA_PARAM_ROWS = ("norm_code",)
"""Rows the Soma kernel's parameter table has after soma_int.PARAM_ROWS (``SOMA_P_<NAME>``): each query
head's normaliser code within its profile (``soma_int.norm_codes``, so a wide fallback head runs exp)."""
SOMA_MAX_SLOTS = 4096
"""Sinks + ring slots per KV head that the Soma kernel's threadgroup memory holds (5 bytes per slot: int16
logit, valid byte, Q15 probability; 20 KiB of the 32 KiB a threadgroup may use)."""
SFA_MAX_SLOTS = 1024
"""Semantic-pool slots whose softmax weights the SFA pool kernel holds in threadgroup memory."""


def prelude() -> str:
    """``#define`` lines for every model constant the kernels use, read from the model modules."""
    from somatile.model import hccs, intexp, soma_int, wide
    from somatile.model import soma_fixed as soma

    values = {
        "HCCS_INV_SHIFT": hccs.INV_SHIFT,
        "HCCS_UINT8_MAX": hccs.UINT8_MAX,
        "HCCS_INT16_MAX": hccs.INT16_MAX,
        "HCCS_UINT8_NUMERATOR": hccs.UINT8_NUMERATOR,
        "HCCS_INT16_NUMERATOR": hccs.INT16_NUMERATOR,
        "HCCS_NO_MAX": -(1 << hccs.INPUT_BITS),
        "EXP_FRAC_BITS": intexp.EXP_FRAC_BITS,
        "EXP_ONE": intexp.EXP_ONE,
        "EXP_ZERO_SHIFT": intexp.EXP_ZERO_SHIFT,
        "EXP_POLY_A": intexp.POLY_A,
        "EXP_POLY_B": intexp.POLY_B,
        "EXP_POLY_C": intexp.POLY_C,
        "EXP_SUM_NORM_BITS": intexp.SUM_NORM_BITS,
        "EXP_UINT8_NUMERATOR": intexp.UINT8_NUMERATOR,
        "EXP_INT16_NUMERATOR": intexp.INT16_NUMERATOR,
        "WIDE_LOGIT_MIN": wide.LOGIT_MIN,
        "WIDE_LOGIT_FRAC_BITS": wide.LOGIT_FRAC_BITS,
        "WIDE_PROB_ONE": wide.PROB_ONE,
        "WIDE_ZERO_SHIFT": wide.ZERO_SHIFT,
        "WIDE_S_FRAC_BITS": wide.S_FRAC_BITS,
        "WIDE_SUM_NORM_BITS": wide.SUM_NORM_BITS,
        "WIDE_RECIP_BITS": wide.RECIP_BITS,
        "WIDE_PWL2_SEGMENTS": wide.PWL2_SEGMENTS,
        "WIDE_PWL2_SEG_BITS": wide.PWL2_SEG_BITS,
        "WIDE_PWL2_KNOTS": wide.PWL2_KNOTS,
        "WIDE_NORM_EXP": wide.NORM_EXP,
        "WIDE_NORM_HCCS": wide.NORM_HCCS,
        "WIDE_NORM_PWL2": wide.NORM_PWL2,
        "SOMA_MAX_SLOTS": SOMA_MAX_SLOTS,
        "SFA_MAX_SLOTS": SFA_MAX_SLOTS,
        "SOMA_COUNTER_MAX": soma.COUNTER_MAX,
        "SOMA_GAMMA_ONE": soma.GAMMA_Q15_ONE,
        "SOMA_FIELD_FRAC_BITS": soma.FIELD_FRAC_BITS,
        "SOMA_GATE_ONE": soma.GATE_ONE,
        "SOMA_GATE_HALF": soma_int.GATE_HALF,
        "SOMA_GATE_FRAC_BITS": soma_int.GATE_FRAC_BITS,
        "SOMA_INT16_MIN": soma_int.INT16_MIN,
        "SOMA_INT16_MAX": soma_int.INT16_MAX,
        "SOMA_NORM_EXP": soma.NORM_EXP,
        "SOMA_PROFILE_WIDE": soma.PROFILE_WIDE,
        # Per profile, the saturation bounds of the normaliser input and of the output (SOMA_WIDE_OUT_MAX ...).
        **{f"SOMA_{profile.upper()}_{kind.upper()}_{end}": value for profile, limits in soma_int.LIMITS.items()
           for kind in ("logit", "out") for end, value in zip(("MIN", "MAX"), limits[kind])},
        **{f"SOMA_G_{name.upper()}": i for i, name in enumerate(SOMA_GEOMETRY)},
        **{f"SOMA_P_{name.upper()}": i for i, name in enumerate(soma_int.PARAM_ROWS + SOMA_PARAM_ROWS)},
    }
    lines = ["// Generated by somatile.host.metal_kernels from the model modules; do not edit."]
    # A tuple becomes a comma list, for an array initialiser in braces.
    lines += [f"#define {name} " + (", ".join(str(int(v)) for v in value) if isinstance(value, tuple)
                                    else f"({int(value)})") for name, value in values.items()]
    return "\n".join(lines) + "\n"


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"Metal kernel family {family!r}: expected one of {sorted(FAMILIES)}")


@functools.lru_cache(maxsize=None)
def library_source(family: str) -> str:
    """The complete Metal source of ``family``: prelude, common helpers and the family's kernels."""
    _check_family(family)
    parts = [prelude()] + [(METAL_DIR / name).read_text() for name in FAMILIES[family]]
    return "\n".join(parts)


def _entry_body(source: str, name: str) -> str:
    match = re.search(r"(?:\bkernel|\[\[\s*kernel\s*\]\])\s+void\s+" + re.escape(name) + r"\s*\(", source)
    if not match:
        raise ValueError(f"no kernel named {name!r} in the assembled source")
    start = source.index("{", match.end())
    depth, i = 1, start + 1
    while depth:
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        i += 1
    return source[start + 1:i - 1]


@dataclasses.dataclass(frozen=True)
class MlxSpec:
    """Arguments of ``mx.fast.metal_kernel`` for one entry point, and its buffer element types."""

    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    header: str
    source: str
    entry: EntryPoint


def _mlx_swizzle(param) -> str:
    """MLX declares the grid attributes as uint3: a scalar parameter takes .x, a 2-vector .xy."""
    if param.attribute not in GRID_ATTRIBUTES or param.element.endswith("3"):
        return ""
    return ".xy" if param.element.endswith("2") else ".x"


@functools.lru_cache(maxsize=None)
def mlx_spec(family: str, entry_name: str) -> MlxSpec:
    """The MLX body-only form of entry point ``entry_name`` of ``family`` (see the module docstring)."""
    header = library_source(family)
    entries = {e.name: e for e in parse_entry_points(header)}
    if entry_name not in entries:
        raise ValueError(f"Metal kernel family {family!r} has no entry point {entry_name!r}; "
                         f"have {sorted(entries)}")
    entry = entries[entry_name]
    buffers = [entry.buffers[i] for i in sorted(entry.buffers)]
    inputs = tuple(p.name for p in buffers if re.search(r"\bconst\b", p.type_text))
    outputs = tuple(p.name for p in buffers if p.name not in inputs)
    if [p.name for p in buffers] != list(inputs + outputs):
        raise ValueError(f"kernel {entry_name}: MLX needs every input buffer before every output buffer")
    aliases = "".join(f"  const {p.element} {p.name} = {p.attribute}{_mlx_swizzle(p)};\n" for p in entry.params
                      if p.attribute != "buffer")
    return MlxSpec(f"somatile_{entry_name}", inputs, outputs, header, aliases + _entry_body(header, entry_name),
                   entry)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m somatile.host.metal_kernels OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        (out / f"{family}.metal").write_text(library_source(family))
        print(out / f"{family}.metal")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
