"""What the streaming row normalisers share (hw/hccs.py ``HCCS``, hw/wide.py ``WideNormaliser``): their ports.

A row unit takes rows of logits as beats on ``i`` and answers each with the row's probabilities as beats on
``o``; ``cfg`` (always ready) writes one head's parameters; ``status`` carries sticky error bits and ``busy``,
``clear_status`` clears the sticky bits. Each unit declares its beat, parameter and status layouts and its
configuration class (a frozen dataclass that validates itself).
"""

from __future__ import annotations

from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


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
