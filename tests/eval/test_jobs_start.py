"""How the local pool starts its workers (somatile.eval.jobs.start_method): forked on Linux, so that a
worker starts with the models its parent loaded; spawned when the caller runs threads of its own. Each case runs
in a fresh Python process: the test process itself may hold threads from earlier tests (Dask, the row kernels'
pools), and which start method it gets then depends on the order of the tests."""

import subprocess
import sys

import pytest

SCRIPT = '''
import sys, threading
from somatile.eval import jobs

LOADED = []


def loaded_in_parent(_job):
    """What a worker sees of the state its parent loaded before the pool started."""
    return len(LOADED)


if __name__ == "__main__":
    if sys.argv[1] == "threads":
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
    LOADED.append("weights")
    print(jobs.start_method(), jobs.run(loaded_in_parent, [0, 1], n_jobs=2))
'''


def _run(tmp_path, case: str) -> str:
    script = tmp_path / "pool_case.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), case], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork on Linux only (spawn elsewhere)")
def test_linux_workers_inherit_what_the_parent_loaded(tmp_path):
    """On Linux the pool forks: a worker starts with the parent's loaded state (a spawned worker would import
    the script afresh and see an empty list)."""
    assert _run(tmp_path, "alone") == "fork [1, 1]"


def test_a_process_with_threads_spawns_its_workers(tmp_path):
    """A caller running threads of its own (their locks could be taken at the fork) gets spawned workers."""
    assert _run(tmp_path, "threads") == "spawn [0, 0]"
