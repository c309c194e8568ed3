"""Board descriptions as data: YAML files -> one frozen, validated :class:`BoardConfig`.

A board file is a flat mapping of parameters plus two optional sections (``fpga:`` for open FPGA boards,
``aie:`` for Versal AI Engine facts). ``extends: NAME`` merges the named file underneath (sections merge
key by key), so ``base.yaml`` holds the shared defaults and each board states only what differs. Files
with ``abstract: true`` are bases, not boards.

Every value is checked against :data:`SCHEMA`; a bad file raises :class:`BoardError` naming the file, the
key, the value and what was expected. The same check applies to command-line overrides
(``somatile build --set lanes=16``), so a parameter is never accepted on one path and rejected on another.

The tile parameters (``lanes``, ``ring``, ...) are declared once, in ``hw/tile_params.py``: their schema
entries here are generated from that declaration, and a board holds them as one
:class:`~somatile.hw.tile_params.TileParams` (``cfg.tile``; ``cfg.lanes`` reads ``cfg.tile.lanes``).

Parameters flow one way (STYLE rule 4): the RTL takes :meth:`BoardConfig.array_kwargs` /
:meth:`BoardConfig.hccs_kwargs`, the firmware header and the host ``info()`` read the same object.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import yaml

from somatile.hw.tile_params import TILE_PARAMS, TileParam, TileParamError, TileParams
from somatile.model.files import load_yaml  # noqa: F401  (the board loader and --set read YAML with it)

BOARDS_DIR = Path(__file__).resolve().parent
DEFAULT_BOARD = "sim"
KINDS = ("sim", "fpga", "versal")


class BoardError(ValueError):
    """A board file, a key in it, or an override is wrong; the message names which and what was expected."""


def _power_of_two(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(v):
        if not (lo <= v <= hi and v & (v - 1) == 0):
            return f"a power of two from {lo} to {hi}"
        return None
    return check


def _int_range(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(v):
        return None if lo <= v <= hi else f"an integer from {lo} to {hi}"
    return check


def _one_of(*choices) -> Callable[[Any], str | None]:
    def check(v):
        return None if v in choices else "one of " + ", ".join(map(str, choices))
    return check


def _pattern(regex: str, what: str) -> Callable[[Any], str | None]:
    """A string that reaches a shell script or Tcl must match ``regex`` whole (an allow-list: what a part
    name or an option is, rather than a list of the characters a shell or Tcl would act on)."""
    compiled = re.compile(regex)

    def check(v):
        return None if compiled.fullmatch(v) else f"{what} (matching {regex})"
    return check


_NEXTPNR_WORD = re.compile(r"[A-Za-z0-9_.,:=/+-]+")


def _nextpnr_options(v) -> str | None:
    # The options go into the build's shell script: words of options and values only.
    words = v.split()
    if (words and not words[0].startswith("--")) or not all(_NEXTPNR_WORD.fullmatch(w) for w in words):
        return f"nextpnr options ('--name [value] ...', words matching {_NEXTPNR_WORD.pattern})"
    # The build passes these from keys of their own; nextpnr refuses an option given twice.
    own = [w for w in words if w.split("=")[0] in _NEXTPNR_OWN]
    if own:
        return (f"nextpnr options other than {', '.join(own)} (set "
                f"{' and '.join(_NEXTPNR_OWN[w.split('=')[0]] for w in own)} instead)")
    return None


_NEXTPNR_OWN = {"--placer": "fpga.tile_placer", "--router": "fpga.tile_router", "--seed": "fpga.seed"}


def _positive(v) -> str | None:
    return None if v > 0 and math.isfinite(v) else "a positive finite number"


def _one_line(v) -> str | None:
    return None if v.strip() and v.isprintable() else "a non-empty line of printable characters"


_part_name = _pattern(r"[A-Za-z0-9-]+", "a part name: letters, digits and dashes")
# Only a class of amaranth-boards: any other 'module:Class' would import (and run) whatever module it names.
_platform_ref = _pattern(r"amaranth_boards(\.[a-z_][a-z0-9_]*)+:[A-Za-z_][A-Za-z0-9_]*",
                         "an amaranth-boards platform class, e.g. 'amaranth_boards.ulx3s:ULX3S_85F_Platform'")
# The board name (the file's stem) reaches Tcl and shell comments and build folder names.
_board_name = _pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", "a board file name of letters, digits, '_', '.' and '-'")


@dataclass(frozen=True)
class Param:
    """One board parameter: its type, its check and what it means (the docs table is generated from this). A
    ``dict`` parameter is per top, each top's value an ``item`` (int or str) that ``check`` checks."""
    type: type
    check: Callable[[Any], str | None] | None
    doc: str
    item: type = int


FPGA_TOPS = ("hccs", "tile", "array", "soc")
"""The tops ``somatile build`` places and routes on a board of kind fpga (boards/build.py)."""

# Top-level parameters. Every board has all of them (base.yaml gives defaults); the tile's come from their
# declaration in hw/tile_params.py.
SCHEMA: dict[str, Param] = {
    "description": Param(str, _one_line, "one line about the board"),
    "kind": Param(str, _one_of(*KINDS), "sim: simulation only; fpga: open toolchain P&R; versal: Vivado project"),
    "clock_mhz": Param(float, _positive, "clock target of the tile logic (MHz)"),
    **{name: Param(p.type, p.problem, p.doc) for name, p in TILE_PARAMS.items()},
}

# Section for boards of kind "fpga": how the open toolchain reaches the part.
FPGA_SCHEMA: dict[str, Param] = {
    "platform": Param(str, _platform_ref, "amaranth-boards platform class as 'module:Class'"),
    "family": Param(str, _one_of("ecp5", "ice40"), "FPGA family (selects nextpnr-ecp5 or nextpnr-ice40)"),
    "device": Param(str, _part_name, "part name as the vendor writes it"),
    "speed_grade": Param(str, _part_name, "speed grade used by nextpnr"),
    "osc_mhz": Param(float, _positive, "board oscillator feeding the PLL (MHz)"),
    "router": Param(str, _one_of("router1", "router2"),
                    "nextpnr router for the HCCS unit (optional, default router1)"),
    "tile_router": Param(str, _one_of("router1", "router2"),
                         "nextpnr router for the tile and the tile array (optional, default router1; router2 "
                         "finishes designs on which router1 stalls, router1 gives the faster small units)"),
    "tile_placer": Param(str, _one_of("heap", "static"),
                         "nextpnr placer for the tile, the tile array and the SoC (optional, default heap; "
                         "static, the electrostatic placer, spreads a large design with fewer long routes)"),
    "tile_nextpnr_opts": Param(dict, _nextpnr_options,
                               "further nextpnr options for the tile, the tile array and the SoC, e.g. "
                               "'--tmg-ripup' (router2 rips up timing-critical nets again; it may not stop: on the "
                               "reduced ULX3S tile it ran past 1,000 iterations): one string for every top or a "
                               "mapping of tops to strings, like seed (optional, default none)", item=str),
    "tile_opts_budget_s": Param(float, _positive,
                                "seconds a tile or array build with tile_nextpnr_opts may run before it is "
                                "stopped and run again without them (optional, default 1200)"),
    "dsp_registers": Param(str, _one_of("fabric", "packed"),
                           "registers around the multiplier blocks: 'packed' moves plain ones into the ECP5 "
                           "MULT18X18D's own input/output registers after synthesis (boards/dsp_pack.py; ecp5 "
                           "only), 'fabric' keeps Yosys' netlist (optional, default fabric)"),
    "seed": Param(dict, _int_range(0, 2**31 - 1),
                  "nextpnr's --seed, the placer's random start: one integer for every top, or a mapping of "
                  "tops (" + ", ".join(FPGA_TOPS) + ") to integers, e.g. the seed a sweep "
                  "(`somatile build --sweep fpga.seed=1,2,3`, every seed's row in docs/boards.md) found to meet "
                  "the clock for each; 0 or a top left out passes no --seed (nextpnr's own start) (optional, "
                  "default 0)"),
    # At most 10 %: the build finds the tile's and an SoC CPU's clocks in nextpnr's report by the constraint
    # nearest each target (100 and 75 MHz on the ULX3S), which a larger margin could swap.
    "timing_margin_pct": Param(dict, _int_range(0, 10),
                               "percent by which the clock nextpnr places and routes toward exceeds the board's "
                               "(the oscillator's constraint scaled, so the PLL's outputs are derived from it): "
                               "router2 judges a route's timing from estimates the final analysis exceeds by up to "
                               "~0.15 ns (docs/hardware.md), so a route it finds met at the board's clock can miss "
                               "it; Fmax is reported against clock_mhz as always. One integer for every top or a "
                               "mapping of tops to integers, like seed (optional, default 0)"),
}
# Keys of a section that a board file may leave out.
SECTION_DEFAULTS: dict[str, dict[str, Any]] = {"fpga": {"router": "router1", "tile_router": "router1",
                                                        "tile_placer": "heap", "dsp_registers": "fabric",
                                                        "tile_nextpnr_opts": "",
                                                        "tile_opts_budget_s": 1200.0, "seed": 0,
                                                        "timing_margin_pct": 0},
                                               "soc": {"peripheral": "tile_array", "data_ram": "block", "cpu_mhz": 0.0}}

# Section for boards of kind "versal": facts of one AI Engine tile (notes/anchors.md section 3, AM020/UG1079).
# The counts and sizes among them are positive integers.
_AIE_COUNTS = {
    "int8_macs_per_cycle": "int8 MACs per AI Engine tile per cycle",
    "data_memory_bytes": "data memory per AI Engine tile (bytes)",
    "program_memory_bytes": "program memory per AI Engine tile (bytes)",
    "stream_ports_in": "core stream input ports",
    "stream_ports_out": "core stream output ports",
    "stream_port_bits": "width of one core stream port (bits)",
    "cascade_bits": "cascade interface width (bits)",
    "tiles": "AI Engine tiles on the device",
    "array_columns": "AI Engine array columns",
    "array_rows": "AI Engine array rows",
}
AIE_SCHEMA: dict[str, Param] = {
    "part": Param(str, _part_name, "Versal part number for the Vivado project"),
    "generation": Param(str, _one_of("AIE", "AIE-ML"), "AI Engine generation"),
    **{name: Param(int, _positive, doc) for name, doc in _AIE_COUNTS.items()},
    "clock_mhz": Param(float, _positive, "AI Engine clock (MHz)"),
    "memory_tile_bytes": Param(int, _int_range(0, 1 << 30), "memory tile size (bytes; 0 where there are none)"),
}

# Section ``soc:`` of boards of kind "sim" or "fpga": the SoC of hw/soc.py (``somatile build --top soc``).
def _soc_choice(name: str, why: str) -> Callable[[Any], str | None]:
    def check(v):
        from somatile.hw import soc_map

        choices = getattr(soc_map, name)
        return None if v in choices else f"one of {', '.join(choices)} ({why})"
    return check


SOC_SCHEMA: dict[str, Param] = {
    "cpu": Param(str, _soc_choice("CPUS", "the soft CPUs shipped as Verilog in pip packages"),
                 "soft CPU running the firmware: picorv32 (RV32IM) or picorv32_rv32i (no multiplier, smaller)"),
    "peripheral": Param(str, _soc_choice("PERIPHERALS", "hw/soc_map.py"),
                        "what the CPU drives: tile_array (the tile array, its command layer in hardware) or "
                        "hccs_unit (the 1-lane HCCS unit alone, the command layer in the firmware: HCCS only, no "
                        "decode) (optional, default tile_array)"),
    "data_ram": Param(str, _soc_choice("DATA_RAMS", "hw/soc_map.py"),
                      "data memory: block (block RAM) or spram (iCE40 UltraPlus SB_SPRAM256KA pairs, 64 KiB each) "
                      "(optional, default block)"),
    "cpu_mhz": Param(float, lambda v: None if v >= 0 and math.isfinite(v) else "0 or a positive clock in MHz",
                     "clock of the CPU, its memories and the UART (MHz): 0 runs them on the tile clock "
                     "(clock_mhz, one clock domain); another value gives them a clock domain of their own, the "
                     "PLL's second output on an ECP5, with the tile bus crossing in asynchronous FIFOs "
                     "(optional, default 0)"),
    "baud": Param(int, _int_range(1200, 50_000_000), "UART bit rate on the board's USB-serial pins (bit/s)"),
    "code_kib": Param(int, _power_of_two(4, 512), "code memory: block RAM holding the firmware image (KiB)"),
    "data_kib": Param(int, _power_of_two(4, 512), "data memory: the firmware's buffers and stack (KiB)"),
    "max_payload": Param(int, _power_of_two(1024, 65536),
                         "largest wire-frame payload the firmware buffers (bytes; HELLO reports it, the host "
                         "splits longer transfers)"),
    "tile_timeout_ms": Param(int, _int_range(1, 60_000),
                             "how long the firmware waits for the tile array's answer to one command (ms of the "
                             "board's clock) before it reports TILE_TIMEOUT"),
}

# The parameters of one tile, named as the RTL names them (the fields of TileParams).
TILE_KEYS = tuple(TILE_PARAMS)

_SECTIONS: dict[str, tuple[str, dict[str, Param]]] = {"fpga": ("fpga", FPGA_SCHEMA), "versal": ("aie", AIE_SCHEMA)}
_META_KEYS = ("extends", "abstract")
SOC_KINDS = ("sim", "fpga")


_EXPECTED = {int: "an integer", float: "a number", str: "a string"}


def _coerce(where: str, key: str, value: Any, param: Param) -> Any:
    """Check one value against its parameter; return it in the parameter's type. A ``dict`` parameter is
    per top: one value for every top (returned as it is) or a mapping of :data:`FPGA_TOPS` to values, each
    checked as the parameter's ``item`` (returned as a dict)."""
    if param.type is dict:
        each = dataclasses.replace(param, type=param.item)
        items = {int: "integers", str: "strings"}[param.item]
        if isinstance(value, dict):
            unknown = [t for t in value if t not in FPGA_TOPS]
            if unknown:
                raise BoardError(f"{where}: key '{key}': got top {unknown[0]!r}, expected a mapping of tops "
                                 f"({', '.join(FPGA_TOPS)}) to {items}")
            return {t: _coerce(where, f"{key}.{t}", v, each) for t, v in value.items()}
        if not isinstance(value, param.item) or isinstance(value, bool):
            raise BoardError(f"{where}: key '{key}': got {value!r} ({type(value).__name__}), expected "
                             f"{_EXPECTED[param.item]} or a mapping of tops ({', '.join(FPGA_TOPS)}) to {items}")
        return _coerce(where, key, value, each)
    expected = _EXPECTED[param.type]
    ok_type = (isinstance(value, param.type) and not isinstance(value, bool)) or (
        param.type is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok_type:
        raise BoardError(f"{where}: key '{key}': got {value!r} ({type(value).__name__}), expected {expected}")
    typed = param.type(value)
    problem = param.check(typed) if param.check else None
    if problem:  # the value as the file wrote it
        raise BoardError(f"{where}: key '{key}': got {value!r}, expected {problem}")
    return typed


def _tile(where: str, values: Mapping[str, Any]) -> TileParams:
    """The tile of a board; a rule between tile parameters that the values break is a BoardError."""
    try:
        return TileParams(**values)
    except TileParamError as exc:
        raise BoardError(f"{where}: key '{exc.name}': got {exc.value!r}, expected {exc.expected} "
                         f"(rule of the tile RTL, somatile.hw.tile_params.TileParams)") from None


@dataclass(frozen=True)
class BoardConfig:
    """A validated board: every key of :data:`SCHEMA` plus the kind's section.

    The tile parameters are one :class:`TileParams`, ``tile``; each can also be read as an attribute of the
    board (``cfg.lanes`` is ``cfg.tile.lanes``). Frozen; derive variants with :meth:`with_overrides`, which
    validates like the YAML does. ``source`` is the board file, ``chain`` the files merged into it (base
    first).
    """
    name: str
    source: Path
    chain: tuple[Path, ...]
    description: str
    kind: str
    clock_mhz: float
    tile: TileParams
    fpga: Mapping[str, Any] | None = None
    aie: Mapping[str, Any] | None = None
    soc: Mapping[str, Any] | None = None
    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def total_heads(self) -> int:
        """Heads over the whole array."""
        return self.n_tiles * self.heads

    def array_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the tile array and of one tile (the fields of :attr:`tile`)."""
        return dataclasses.asdict(self.tile)

    def hccs_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the standalone HCCS unit (``hw/hccs.py``)."""
        return {"lanes": self.hccs_lanes, "n_max": self.n_max, "heads": self.heads, "out_type": self.hccs_out}

    def wide_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the wide profile's row unit (``hw/wide.py``), the ``hccs`` top of a board with
        ``profile: wide``: ``hccs_lanes`` int16 lanes."""
        return {"lanes": self.hccs_lanes, "n_max": self.n_max, "heads": self.heads}

    def per_top(self, key: str, top: str) -> int | str:
        """``top``'s value of the per-top ``fpga`` key ``key`` (one value or a mapping of tops; 0, or "" for a
        string parameter, for a top the mapping leaves out)."""
        value = self.fpga[key]
        return value.get(top, FPGA_SCHEMA[key].item()) if isinstance(value, Mapping) else value

    def nextpnr_seed(self, top: str) -> int:
        """nextpnr's ``--seed`` for ``top`` from ``fpga.seed`` (0: none given)."""
        return self.per_top("seed", top)

    def parameters(self) -> dict[str, Any]:
        """Every parameter as plain data (for manifests, the firmware header and the host ``info()``)."""
        out = {k: getattr(self, k) for k in SCHEMA}
        out["name"] = self.name
        if self.fpga is not None:
            out["fpga"] = dict(self.fpga)
        if self.aie is not None:
            out["aie"] = dict(self.aie)
        if self.soc is not None:
            out["soc"] = dict(self.soc)
        return out

    def with_overrides(self, overrides: Mapping[str, Any], origin: str = "--set") -> "BoardConfig":
        """A copy with parameters replaced, each validated; ``origin`` names the source in errors. A key is a
        top-level parameter (``lanes``) or ``SECTION.KEY`` for a key of the board's ``fpga``, ``versal`` or
        ``soc`` section (``fpga.seed``)."""
        changes, sections = {}, {}
        for key, value in overrides.items():
            section, dot, sub = key.partition(".")
            if dot:
                schema = _section_schema(self, origin, key, value)
                changes[key] = _coerce(f"{origin} {key}={value!r} (board {self.name})", key, value, schema[sub])
                sections.setdefault(section, dict(getattr(self, section)))[sub] = changes[key]
                continue
            if key not in SCHEMA or key in ("kind",):
                allowed = ", ".join(k for k in SCHEMA if k != "kind")
                raise BoardError(f"{origin} {key}={value!r}: unknown or fixed parameter '{key}'; "
                                 f"expected one of: {allowed} (or SECTION.KEY of the board's sections)")
            changes[key] = _coerce(f"{origin} {key}={value!r} (board {self.name})", key, value, SCHEMA[key])
        where = f"{origin} on board {self.name}"
        tile = _tile(where, {**self.array_kwargs(), **{k: v for k, v in changes.items() if k in TILE_PARAMS}})
        top = {k: v for k, v in changes.items() if k not in TILE_PARAMS and "." not in k}
        new = dataclasses.replace(self, **top, **{a: MappingProxyType(m) for a, m in sections.items()}, tile=tile,
                                  overrides=MappingProxyType({**self.overrides, **changes}))
        _check_consistency(new, where)
        return new

    def with_soc(self, changes: Mapping[str, Any], origin: str = "soc override") -> "BoardConfig":
        """A copy with keys of the ``soc:`` section replaced, each validated like the YAML."""
        if self.soc is None:
            raise BoardError(f"{origin} on board {self.name}: the board has no soc section")
        soc = _check_section(f"{origin} on board {self.name}", "soc", {**self.soc, **changes}, SOC_SCHEMA)
        return dataclasses.replace(self, soc=soc)


def _section_schema(cfg: BoardConfig, origin: str, key: str, value: Any) -> dict[str, Param]:
    """The schema of the section an override ``SECTION.KEY`` names (a section is its BoardConfig attribute)."""
    section, _, sub = key.partition(".")
    schemas = {**dict(_SECTIONS.values()), "soc": SOC_SCHEMA}
    present = [name for name in schemas if getattr(cfg, name) is not None]
    if section not in present:
        raise BoardError(f"{origin} {key}={value!r}: board {cfg.name} has no section '{section}'; its sections: "
                         f"{', '.join(present) or 'none'}")
    if sub not in schemas[section]:
        raise BoardError(f"{origin} {key}={value!r}: unknown key '{sub}' of section '{section}'; expected one "
                         f"of: {', '.join(schemas[section])}")
    return schemas[section]


def _tile_attribute(param: TileParam) -> property:
    return property(lambda cfg: getattr(cfg.tile, param.name), doc=param.doc)


# cfg.lanes, cfg.ring, ...: each tile parameter read through the board.
for _param in TILE_PARAMS.values():
    setattr(BoardConfig, _param.name, _tile_attribute(_param))


def parse_assignments(items: list[str] | None) -> dict[str, Any]:
    """``["lanes=16", "clock_mhz=48"]`` -> ``{"lanes": 16, "clock_mhz": 48}`` (values read as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise BoardError(f"--set {item!r}: expected KEY=VALUE, e.g. lanes=16")
        try:
            out[key.strip()] = load_yaml(text)
        except yaml.YAMLError as exc:
            raise BoardError(f"--set {item!r}: value is not a YAML scalar ({exc})") from exc
    return out


def _resolve(name_or_path: str | Path, relative_to: Path | None = None) -> Path:
    text = str(name_or_path)
    candidates = []
    if text.endswith((".yaml", ".yml")) or "/" in text:
        p = Path(text)
        candidates.append(p if p.is_absolute() or relative_to is None else relative_to / p)
        candidates.append(p)
    else:
        if relative_to is not None:
            candidates.append(relative_to / f"{text}.yaml")
        candidates.append(BOARDS_DIR / f"{text}.yaml")
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise BoardError(f"board '{text}': no such board file (looked for {', '.join(map(str, candidates))}); "
                     f"known boards: {', '.join(names())}")


def _read(path: Path) -> dict:
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as exc:
        raise BoardError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise BoardError(f"{path}: expected a mapping of parameters at the top level, got {type(data).__name__}")
    if not isinstance(data.get("abstract", False), bool):
        raise BoardError(f"{path}: key 'abstract': got {data['abstract']!r}, expected true or false")
    return data


def _merged(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, tuple[Path, ...]]:
    """The file's mapping with its ``extends`` chain merged underneath; returns (mapping, chain base-first)."""
    if path in seen:
        loop = " -> ".join(str(p.name) for p in (*seen, path))
        raise BoardError(f"{path}: key 'extends': cycle {loop}")
    data = _read(path)
    parent = data.get("extends")
    if parent is None:
        return data, (path,)
    if not isinstance(parent, str):
        raise BoardError(f"{path}: key 'extends': got {parent!r}, expected the name of another board file")
    base, chain = _merged(_resolve(parent, path.parent), (*seen, path))
    merged = dict(base)
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    merged.pop("abstract", None)
    if "abstract" in data:
        merged["abstract"] = data["abstract"]
    return merged, (*chain, path)


def _check_section(where: str, section: str, raw: Any, schema: dict[str, Param]) -> MappingProxyType:
    if not isinstance(raw, dict):
        raise BoardError(f"{where}: key '{section}': expected a mapping with keys {', '.join(schema)}")
    raw = {**SECTION_DEFAULTS.get(section, {}), **raw}
    unknown = set(raw) - set(schema)
    if unknown:
        raise BoardError(f"{where}: key '{section}.{sorted(unknown)[0]}': unknown; expected one of "
                         f"{', '.join(schema)}")
    missing = [k for k in schema if k not in raw]
    if missing:
        raise BoardError(f"{where}: key '{section}.{missing[0]}': missing ({schema[missing[0]].doc})")
    return MappingProxyType({k: _coerce(where, f"{section}.{k}", raw[k], p) for k, p in schema.items()})


def _check_consistency(cfg: BoardConfig, where: str) -> None:
    """Relations between parameters that no single key can check, beyond the tile's own rules (head_dim a
    multiple of the memory word, n_max covering ring + sinks: ``TileParams``, applied when the board's tile
    is made, so a bad board fails at load time, not mid-build).
    """
    if cfg.fpga is not None and cfg.fpga["dsp_registers"] == "packed" and cfg.fpga["family"] != "ecp5":
        raise BoardError(f"{where}: key 'fpga.dsp_registers': got 'packed', expected 'fabric' for family "
                         f"{cfg.fpga['family']!r} (register packing handles the ECP5 MULT18X18D only)")
    if cfg.aie is not None:
        if cfg.aie["data_memory_bytes"] != cfg.local_memory_bytes:
            raise BoardError(f"{where}: key 'local_memory_bytes': got {cfg.local_memory_bytes}, expected the AI "
                             f"Engine tile's data memory aie.data_memory_bytes = {cfg.aie['data_memory_bytes']}")
        if cfg.n_tiles > cfg.aie["tiles"]:
            raise BoardError(f"{where}: key 'n_tiles': got {cfg.n_tiles}, expected at most aie.tiles = "
                             f"{cfg.aie['tiles']}")


def load(name_or_path: str | Path = DEFAULT_BOARD, overrides: Mapping[str, Any] | None = None) -> BoardConfig:
    """Load a board by name (``boards/NAME.yaml``) or path; apply ``overrides`` like ``--set``.

    Raises :class:`BoardError` naming the file, key, value and what was expected.
    """
    path = _resolve(name_or_path)
    where = str(path)
    problem = _board_name(path.stem)
    if problem:
        raise BoardError(f"{where}: board name {path.stem!r} (the file name): expected {problem}")
    data, chain = _merged(path)
    if data.get("abstract"):
        raise BoardError(f"{where}: is an abstract base (abstract: true), not a board; known boards: "
                         f"{', '.join(names())}")
    allowed = set(SCHEMA) | set(_META_KEYS) | {s for s, _ in _SECTIONS.values()} | {"soc"}
    for key in data:
        if key not in allowed:
            raise BoardError(f"{where}: key '{key}': unknown; expected one of {', '.join(sorted(allowed))}")
    missing = [k for k in SCHEMA if k not in data]
    if missing:
        raise BoardError(f"{where}: key '{missing[0]}': missing ({SCHEMA[missing[0]].doc}); "
                         f"set it in the board or in its base")
    values = {k: _coerce(where, k, data[k], p) for k, p in SCHEMA.items()}
    sections: dict[str, Any] = {}
    for kind, (section, schema) in _SECTIONS.items():
        if values["kind"] == kind:
            sections[section] = _check_section(where, section, data.get(section), schema)
        elif section in data:
            raise BoardError(f"{where}: key '{section}': only boards of kind '{kind}' have this section "
                             f"(this board is kind '{values['kind']}')")
    if values["kind"] in SOC_KINDS and "soc" in data:
        sections["soc"] = _check_section(where, "soc", data["soc"], SOC_SCHEMA)
    elif "soc" in data:
        raise BoardError(f"{where}: key 'soc': only boards of kind {' or '.join(SOC_KINDS)} have an SoC "
                         f"(this board is kind '{values['kind']}')")
    tile = _tile(where, {k: values.pop(k) for k in TILE_KEYS})
    cfg = BoardConfig(name=path.stem, source=path, chain=chain, tile=tile, **values, **sections)
    _check_consistency(cfg, where)
    if overrides:
        cfg = cfg.with_overrides(overrides)
    return cfg


def names() -> list[str]:
    """Names of the boards in ``boards/`` (abstract bases left out), sorted, the default first."""
    found = []
    for p in sorted(BOARDS_DIR.glob("*.yaml")):
        try:
            abstract = bool(_read(p).get("abstract"))
        except BoardError:
            abstract = False  # a broken file is still a board the user meant; load() reports what is wrong
        if not abstract:
            found.append(p.stem)
    return sorted(found, key=lambda n: (n != DEFAULT_BOARD, n))
