"""The numba cache of a module is dropped when a source it inlines changes, and kept otherwise."""

import numba

from somatile.model import nbcache


def test_drop_stale_follows_the_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    (tmp_path / "kern.py").write_text("# a module with @njit(cache=True) functions\n")
    (tmp_path / "dep.py").write_text("X = 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    old = cache / "kern.f-10.py311.nbi"
    other = cache / "dep.g-3.py311.nbi"
    old.write_text("stale")
    other.write_text("another module's cache")
    sources = ("kern.py", "dep.py")
    nbcache.drop_stale(str(tmp_path / "kern.py"), sources)      # no stamp yet: whatever is there may be stale
    assert not old.exists() and other.exists() and (cache / "kern.deps").is_file()
    fresh = cache / "kern.f-10.py311.nbc"
    fresh.write_text("compiled against dep.py X = 1")
    nbcache.drop_stale(str(tmp_path / "kern.py"), sources)      # nothing changed: kept
    assert fresh.exists()
    (tmp_path / "dep.py").write_text("X = 2\n")
    nbcache.drop_stale(str(tmp_path / "kern.py"), sources)      # the inlined file changed: dropped
    assert not fresh.exists() and other.exists()
