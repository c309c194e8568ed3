"""How the local pool starts its workers (somatile.eval.jobs.start_method): forked on Linux, so that a
worker starts with the models its parent loaded; spawned when the caller runs threads of its own. (A module of
its own: test_jobs.py keeps a Dask cluster, and with it threads, alive across its tests.)"""

import pytest

from somatile.eval import jobs


_LOADED_IN_PARENT: list = []


def loaded_in_parent(_job):
    """What a worker sees of the state its parent loaded before the pool started."""
    return len(_LOADED_IN_PARENT)


@pytest.mark.skipif(not jobs.sys.platform.startswith("linux"), reason="workers fork on Linux only (spawn elsewhere)")
def test_linux_workers_inherit_what_the_parent_loaded():
    """On Linux the pool forks: a worker starts with the parent's loaded models instead of loading them again
    (a spawned worker would import this module afresh and see an empty list)."""
    _LOADED_IN_PARENT.append("weights")
    try:
        assert jobs.start_method() == "fork"
        assert jobs.run(loaded_in_parent, [0, 1], n_jobs=2) == [1, 1]
    finally:
        _LOADED_IN_PARENT.clear()


def test_a_process_with_threads_spawns_its_workers():
    """A caller running threads of its own (their locks could be taken at the fork) gets spawned workers."""
    import threading
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()
    try:
        assert jobs.start_method() == "spawn"
        _LOADED_IN_PARENT.append("weights")
        assert jobs.run(loaded_in_parent, [0, 1], n_jobs=2) == [0, 0]
    finally:
        stop.set()
        worker.join()
        _LOADED_IN_PARENT.clear()
