"""Keep numba's on-disk cache honest across modules.

Numba invalidates a cached function only when the source file that defines it changes. A kernel that inlines
another module's ``@njit`` functions or constants (the Soma step calls the row kernels of hccs.py, the wide
kernels use intexp.py's polynomial) would otherwise keep running stale machine code after that other file
changed. :func:`drop_stale` keeps a stamp of the sources a module compiles in beside its cache and deletes the
module's cache files when the stamp no longer matches. Best effort: an unwritable cache directory leaves
numba's own behaviour.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numba


def drop_stale(module_file: str, sources: tuple[str, ...]) -> None:
    """Delete the numba cache of the module at ``module_file`` unless ``sources`` (file names in the same
    folder, the module itself included) are unchanged since it was written."""
    here = Path(module_file).resolve().parent
    stem = Path(module_file).stem
    cache = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else here / "__pycache__"
    digest = hashlib.sha256(b"".join((here / name).read_bytes() for name in sources)).hexdigest()
    stamp = cache / f"{stem}.deps"
    try:
        if stamp.exists() and stamp.read_text() == digest:
            return
        for stale in cache.rglob(f"{stem}.*.nb[ic]"):
            stale.unlink()
        cache.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest)
    except OSError:
        pass
