"""Many independent jobs on a local process pool (the default) or a Dask distributed cluster.

The work users repeat is embarrassingly parallel (evaluation windows x variants, board builds, parameter
sweeps): :func:`run` maps one picklable, module-level function over a list of jobs and hands each result to
a callback in the order the jobs were given, whatever order they finish in, so a caller that merges results
gets the same output serially, with ``jobs=2`` and on a cluster.

- ``jobs=1`` runs in this process (no pickling; what a debugger wants).
- ``jobs=N`` (default: the cores this process may use) runs a ``concurrent.futures`` process pool. On Linux
  its workers are forked (:func:`start_method`): they inherit what the caller already loaded (the model's
  weights, numba's compiled kernels), so a worker costs nothing to start; a spawned worker re-imported
  somatile and re-read the weights (about 5 s for SmolLM2), which on two cores cost a third of the parallel
  run of a small evaluation. A fork is safe only when no other thread holds a lock the child could need, so
  the pool forks only when this process runs no other Python thread (tqdm's monitor thread is stopped first;
  the row kernels' thread pools or an in-process Dask cluster make it spawn); the tokenizer's native thread
  pool is switched off in the children (``TOKENIZERS_PARALLELISM``). Elsewhere (macOS, whose system frameworks are not fork-safe, and Windows) the
  workers are spawned.
- ``cluster="tcp://HOST:PORT"`` submits to a running ``dask.distributed`` scheduler (Dask rather than Ray:
  it installs from pip as pure Python, runs the same ``Client`` against a laptop's ``LocalCluster`` or a
  cluster's scheduler, and needs no object store or runtime environment beyond the workers' own install of
  somatile). Workers must have the package and its model wheels installed.

``cost`` (optional, one number per job, for example a window's length) orders submission to the pool or
cluster longest first: with few workers, a long job started last runs alone at the end while the other
workers idle (the longest-processing-time rule). Results are still delivered in job order.

Every job runs with one BLAS thread (:func:`one_blas_thread`) on every backend: a float32 matrix product
rounds differently when OpenBLAS splits it over more threads, and a calibration's discrete choices (int8
scales, HCCS parameters) can flip on such a last-bit difference, so without the pin the same evaluation
gave 35.36, 34.44 or 36.04 integer-HCCS perplexity on one window depending on the thread counts of the
processes that ran it. One thread per job is also what a pool of one worker per core wants.

A failed job raises after every other job has finished (its exception names the job); the tqdm bar shows
jobs done, running and failed.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Sequence


def one_blas_thread():
    """A context manager that limits the BLAS libraries loaded in this process (numpy's OpenBLAS) to one
    thread and restores their limits on exit (threadpoolctl; an environment variable would act only before
    the library is loaded). Forked children inherit the limit."""
    import numpy  # noqa: F401 - loads OpenBLAS, so threadpoolctl finds it
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=1, user_api="blas")


class _OneBlasThread:
    """``fn`` run under :func:`one_blas_thread`: picklable (for spawned pool workers and Dask workers) as long
    as ``fn`` is a module-level function."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def __call__(self, job):
        with one_blas_thread():
            return self.fn(job)


def default_jobs() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def start_method() -> str:
    """The process pool's start method: ``fork`` on Linux when this process runs no other Python thread
    (after :func:`_quiet_threads_before_fork`), else ``spawn`` (macOS and Windows, or a caller with threads
    of its own, for example an in-process Dask cluster, whose locks a forked child could inherit taken)."""
    if not sys.platform.startswith("linux"):
        return "spawn"
    _quiet_threads_before_fork()
    return "fork" if threading.active_count() == 1 else "spawn"


def _quiet_threads_before_fork() -> None:
    """Stop the helper threads a forked child would inherit in an unknown state (see the module docstring)."""
    from tqdm import tqdm
    tqdm.monitor_interval = 0   # no new monitor thread from the bars created while jobs run
    monitor = getattr(tqdm, "monitor", None)
    if monitor is not None:
        monitor.exit()
        tqdm.monitor = None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def check(jobs: int | None, cluster: str | None) -> int:
    """``jobs`` (None: :func:`default_jobs`) as a positive integer, or ValueError naming the option."""
    if cluster is not None and not (isinstance(cluster, str) and "://" in cluster):
        raise ValueError(f"--cluster: expected a Dask scheduler address such as tcp://HOST:8786, got {cluster!r}")
    n = default_jobs() if jobs is None else jobs
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--jobs: expected an integer >= 1, got {jobs!r}")
    return n


class JobError(RuntimeError):
    """One or more jobs failed; ``failures`` maps the job index to its exception."""

    def __init__(self, failures: dict[int, BaseException], labels: Sequence[str]):
        self.failures = failures
        first = min(failures)
        super().__init__(f"{len(failures)} of {len(labels)} jobs failed; first: {labels[first]}: "
                         f"{type(failures[first]).__name__}: {failures[first]}")


def run(fn: Callable[[Any], Any], jobs: Sequence[Any], *, n_jobs: int | None = None, cluster: str | None = None,
        on_result: Callable[[int, Any], None] | None = None, labels: Sequence[str] | None = None,
        desc: str = "jobs", cost: Sequence[float] | None = None) -> list:
    """``[fn(job) for job in jobs]`` on the chosen backend; ``on_result(index, result)`` is called in job order
    as soon as every earlier job is done (so a caller can write partial results that never have holes)."""
    n = check(n_jobs, cluster)
    fn = _OneBlasThread(fn)
    if cost is not None and len(cost) != len(jobs):
        raise ValueError(f"cost: expected one number per job ({len(jobs)}), got {len(cost)}")
    # Submission order: longest first (stable, so equal costs keep job order).
    order = sorted(range(len(jobs)), key=lambda i: -cost[i]) if cost is not None else list(range(len(jobs)))
    labels = list(labels) if labels is not None else [f"job {i}" for i in range(len(jobs))]
    results: dict[int, Any] = {}
    failures: dict[int, BaseException] = {}
    delivered = 0
    from tqdm import tqdm
    bar = tqdm(total=len(jobs), desc=desc, unit="job", leave=False)

    def finish(i, value=None, error=None):
        nonlocal delivered
        if error is not None:
            failures[i] = error
        else:
            results[i] = value
        while delivered < len(jobs) and (delivered in results or delivered in failures):
            if delivered in results and on_result is not None and not failures:
                on_result(delivered, results[delivered])
            delivered += 1
        bar.update(1)

    def status(running: int):
        bar.set_postfix(running=running, failed=len(failures), refresh=False)

    try:
        if cluster is None and n == 1:
            for i, job in enumerate(jobs):
                status(1)
                try:
                    finish(i, fn(job))
                except Exception as exc:  # noqa: BLE001 - reported with the job's label below
                    finish(i, error=exc)
        elif cluster is None:
            ctx = multiprocessing.get_context(start_method())
            with ProcessPoolExecutor(max_workers=min(n, max(len(jobs), 1)), mp_context=ctx) as pool:
                pending = {pool.submit(fn, jobs[i]): i for i in order}
                while pending:
                    status(min(n, len(pending)))
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        i = pending.pop(future)
                        exc = future.exception()
                        finish(i, None if exc else future.result(), exc)
        else:
            from dask.distributed import Client, as_completed
            with Client(cluster, timeout=30) as client:
                # Dask runs higher priorities first: the submission rank, so longest first as on the pool.
                futures = [client.submit(fn, jobs[i], key=f"somatile-{desc}-{i}-{os.getpid()}", pure=False,
                                         priority=len(order) - rank) for rank, i in enumerate(order)]
                index = {f.key: i for i, f in zip(order, futures)}
                for future in as_completed(futures):
                    i = index[future.key]
                    exc = future.exception()
                    finish(i, None if exc else future.result(), exc)
    finally:
        bar.close()
    if failures:
        raise JobError(failures, labels)
    return [results[i] for i in range(len(jobs))]
