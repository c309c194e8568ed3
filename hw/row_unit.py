"""What the streaming row normalisers share (hw/hccs.py ``HCCS``, hw/wide.py ``WideNormaliser``): their ports.

A row unit takes rows of logits as beats on ``i`` and answers each with the row's probabilities as beats on
``o``; ``cfg`` (always ready) writes one head's parameters; ``status`` carries sticky error bits and ``busy``,
``clear_status`` clears the sticky bits. Each unit declares its beat, parameter and status layouts and its
configuration class (a frozen dataclass that validates itself).
"""

from __future__ import annotations

from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2


class RowUnitConfig:
    """What the row units' configurations (frozen dataclasses with ``lanes``, ``heads``, ``n_max`` and
    ``div_bits``) share: the checks of those four (each bad value named with what was expected) and the
    beat and head-index sizes."""

    def check_fields(self, lane_choices: tuple, n_max_limit: int | None, div_choices: tuple):
        if self.lanes not in lane_choices:
            raise ValueError(f"lanes: expected one of {lane_choices}, got {self.lanes!r}")
        if not (isinstance(self.heads, int) and 1 <= self.heads <= 256):
            raise ValueError(f"heads: expected an integer from 1 to 256, got {self.heads!r}")
        limit = "" if n_max_limit is None else f" up to {n_max_limit}"
        if not (isinstance(self.n_max, int) and self.lanes <= self.n_max <= (n_max_limit or self.n_max)
                and self.n_max % self.lanes == 0):
            raise ValueError(f"n_max: expected a positive multiple of lanes ({self.lanes}){limit}, got {self.n_max!r}")
        if self.div_bits not in div_choices:
            names = ", ".join(map(str, div_choices[:-1])) + f" or {div_choices[-1]}"
            raise ValueError(f"div_bits: expected {names} quotient bits per cycle, got {self.div_bits!r}")

    @property
    def beats_max(self) -> int:
        return self.n_max // self.lanes

    @property
    def head_bits(self) -> int:
        return max(1, ceil_log2(self.heads))


class RowUnit(wiring.Component):
    """Base of a row unit: ``Unit(config=Config(...))`` or ``Unit(**config_fields)``.

    Subclasses set ``config_class`` and implement ``layouts(config) -> (in_beat, out_beat, cfg, status)``."""

    config_class: type

    def __init__(self, config=None, **params):
        if config is None:
            config = self.config_class(**params)
        elif params:
            raise TypeError("pass either config= or keyword parameters, not both")
        self.config = config
        in_beat, out_beat, cfg, status = self.layouts(config)
        super().__init__({"i": In(stream.Signature(in_beat)), "o": Out(stream.Signature(out_beat)),
                          "cfg": In(stream.Signature(cfg)), "status": Out(status), "clear_status": In(1)})

    @classmethod
    def layouts(cls, config):
        raise NotImplementedError

    @classmethod
    def port_signature(cls, config) -> wiring.Signature:
        """The unit's streams as the part that contains it offers them to another (``Out`` on the owner, ``In``
        on the part that drives them): while ``active`` is high, ``i``, ``o`` and ``cfg`` are the unit's own
        (same layouts and handshakes); while it is low the owner drives the unit and ``o.valid`` stays low."""
        in_beat, out_beat, cfg, _ = cls.layouts(config)
        return wiring.Signature({"active": In(1), "i": In(stream.Signature(in_beat)),
                                 "o": Out(stream.Signature(out_beat)), "cfg": In(stream.Signature(cfg))})
