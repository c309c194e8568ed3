"""somatile.host: the device API (`open`), the wire protocol, and the backends behind it.

Layers, each module importing only the ones above it in this list:

- `device`: the abstract device API (`Device`, `DeviceInfo`, `Transport`) and its errors (`DeviceError`,
  `DeviceTimeout`, `ProtocolError`);
- `protocol`: the wire protocol of docs/protocol.md (frames, CRC, the parser, both ends of the link);
- `tile_driver`: `TileDevice`, the device that speaks the wire protocol over any `Transport`, and
  `open_transport`;
- the links, one per URL scheme (`BACKENDS`): `transport_tcp`, `transport_serial`, `emu` (the reference
  firmware and golden tiles in-process), `sim_backend` (the tile RTL in Verilator behind the firmware,
  started through `transport_firmware`), `metal_backend`.

The tile-bus framing between the firmware's host build and its tile servers is `somatile.hw.tile_bus`, below
both this package and `somatile.sim`. Kept light: the backends (the tile model, sockets, pyserial, Verilator,
Metal) load only when a URL asks for them.
"""

from __future__ import annotations

import importlib
import urllib.parse

# URL scheme -> module providing ``open_url(url: urllib.parse.SplitResult, **options) -> Device``.
BACKENDS: dict[str, str] = {
    "emu": "somatile.host.emu",
    "sim": "somatile.host.sim_backend",
    "tcp": "somatile.host.transport_tcp",
    "serial": "somatile.host.transport_serial",
    "metal": "somatile.host.metal_backend",
}


def open(url: str = "emu://", **options):  # noqa: A001 - the name users expect: somatile.host.open(url)
    """Open the device at ``url`` and return a `somatile.host.device.Device`.

    URLs: ``emu://[?board=NAME]`` (the golden tile model in-process), ``sim://?board=NAME`` (the tile RTL in
    Verilator behind the firmware), ``tcp://HOST:PORT`` and ``serial:///dev/ttyUSB0[?baud=N]`` (a board or
    a host build running the firmware), ``metal://`` (the Apple GPU). Keyword options go to the backend
    (for example ``timeout=`` and ``retries=`` for the wire-protocol backends).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in BACKENDS:
        raise ValueError(f"device URL {url!r}: unknown scheme {parts.scheme!r}; expected one of "
                         f"{', '.join(s + '://' for s in BACKENDS)}")
    module = importlib.import_module(BACKENDS[parts.scheme])
    return module.open_url(parts, **options)


def url_options(parts: urllib.parse.SplitResult) -> dict[str, str]:
    """The query of a device URL as a dict; a repeated key is an error naming it."""
    out: dict[str, str] = {}
    for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if key in out:
            raise ValueError(f"device URL {parts.geturl()!r}: option {key!r} given twice")
        out[key] = value
    return out
