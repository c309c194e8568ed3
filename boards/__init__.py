"""somatile.boards: boards as data.

``load(name_or_path)`` returns a frozen, validated :class:`BoardConfig` from ``boards/NAME.yaml`` (or a
path); ``names()`` lists the boards. ``somatile build`` (``somatile.boards.build``) turns a board into
Verilog, a register map, a manifest and, for open FPGA boards, a placed and routed bitstream with a report.
"""

from .config import DEFAULT_BOARD, SCHEMA, BoardConfig, BoardError, load, names, parse_assignments

__all__ = ["DEFAULT_BOARD", "SCHEMA", "BoardConfig", "BoardError", "load", "names", "parse_assignments"]
