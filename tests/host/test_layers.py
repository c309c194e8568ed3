"""The layers of somatile.host (host/__init__.py): each module imports only the layers below it, and the
tile-bus framing (hw/tile_bus.py) sits below both host/ and sim/. Read with ``ast``; nothing is imported."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# module -> the modules of somatile.host it may import ("" is the package itself, for url_options)
HOST_LAYERS = {
    "device": set(),
    "protocol": {"device"},
    "tile_driver": {"", "device", "protocol"},
}


def somatile_imports(path: Path) -> set[str]:
    """Every ``somatile.*`` module ``path`` imports, at any depth; ``from somatile.host import protocol``
    counts as somatile.host.protocol, ``from somatile.host import url_options`` as somatile.host."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("somatile.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("somatile."):
            package = ROOT / node.module.split(".")[1] if node.module.count(".") == 1 else None
            for alias in node.names:
                if package is not None and (package / f"{alias.name}.py").exists():
                    found.add(f"{node.module}.{alias.name}")
                else:
                    found.add(node.module)
    return found


def host_modules(names: set[str]) -> set[str]:
    return {n.removeprefix("somatile.host").lstrip(".") for n in names
            if n == "somatile.host" or n.startswith("somatile.host.")}


@pytest.mark.parametrize("module", HOST_LAYERS)
def test_each_host_layer_imports_only_the_layers_below_it(module):
    extra = host_modules(somatile_imports(ROOT / "host" / f"{module}.py")) - HOST_LAYERS[module]
    assert not extra, f"host/{module}.py imports host modules {sorted(extra)}"


def test_tile_bus_framing_is_below_host_and_sim():
    framing = somatile_imports(ROOT / "hw" / "tile_bus.py")
    assert not {n for n in framing if n.startswith(("somatile.host", "somatile.sim"))}
    assert not host_modules(somatile_imports(ROOT / "sim" / "serve_tile.py"))
