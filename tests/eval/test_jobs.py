"""The job layer: results in job order on every backend, failures named, bad options refused; a small
`somatile eval smollm2` giving the same numbers serially, with --jobs 2, on a Dask cluster and resumed; and
`somatile eval minilm --quick` the same serially, with --jobs 2 and on a Dask cluster."""

import json
import os

import pytest

from somatile.host.cli import main as cli
from somatile.eval import jobs


def square_after(job):
    """Later jobs finish first (sleep shorter), so in-order delivery is actually exercised."""
    import time
    time.sleep(0.02 * (4 - job))
    if job == 3 and os.environ.get("SOMATILE_TEST_FAIL"):
        raise ValueError("job three refuses")
    return job * job


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_results_arrive_in_job_order(n_jobs):
    seen = []
    assert jobs.run(square_after, [0, 1, 2, 3], n_jobs=n_jobs, on_result=lambda i, r: seen.append((i, r))) == \
        [0, 1, 4, 9]
    assert seen == [(0, 0), (1, 1), (2, 4), (3, 9)]


def blas_threads(job):
    """The thread counts of the BLAS libraries loaded in the process that runs the job."""
    import numpy  # noqa: F401 - OpenBLAS is loaded with numpy
    from threadpoolctl import threadpool_info
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_every_job_runs_with_one_blas_thread(n_jobs):
    """A calibration's discrete choices flipped on the last-bit differences of OpenBLAS's thread split, so
    results depended on which process ran a job; after a serial run the caller's own limit is restored."""
    before = blas_threads(None)
    assert before, "numpy's BLAS is visible to threadpoolctl"
    assert jobs.run(blas_threads, [0, 1, 2], n_jobs=n_jobs) == [[1] * len(before)] * 3
    assert blas_threads(None) == before


def note_start(job):
    """Appends the job's name to a log file when it starts (O_APPEND: one line per write, any process)."""
    import time
    log, name, seconds = job
    with open(log, "a") as f:
        f.write(name + "\n")
    time.sleep(seconds)
    return name


def _check_long_job_starts_first(tmp_path, **kw):
    """Three jobs on two workers: each starts once, and the long one before the second short one."""
    log = str(tmp_path / "starts.log")
    names = ["short a", "short b", "long"]
    work = [(log, "short a", 0.2), (log, "short b", 0.2), (log, "long", 0.4)]
    assert jobs.run(note_start, work, cost=[1, 1, 4], **kw) == names      # delivered in job order
    starts = open(log).read().split("\n")[:-1]
    assert sorted(starts) == ["long", "short a", "short b"]
    assert starts.index("long") < starts.index("short b")


def test_longest_job_is_submitted_first(tmp_path):
    """Two workers, three jobs: the queue is first in, first out, so the long job submitted first starts
    before the second short one (job order would start it last, alone on the pool at the end)."""
    _check_long_job_starts_first(tmp_path, n_jobs=2)


def test_cost_must_match_the_jobs():
    with pytest.raises(ValueError, match=r"cost: expected one number per job \(2\), got 1"):
        jobs.run(square_after, [0, 1], n_jobs=1, cost=[1])


def test_a_failed_job_is_named(monkeypatch):
    monkeypatch.setenv("SOMATILE_TEST_FAIL", "1")
    seen = []
    with pytest.raises(jobs.JobError, match="1 of 4 jobs failed; first: window 3: ValueError: job three refuses"):
        jobs.run(square_after, [0, 1, 2, 3], n_jobs=1, labels=[f"window {i}" for i in range(4)],
                 on_result=lambda i, r: seen.append(i))
    assert seen == [0, 1, 2]          # the jobs before the failure were delivered


@pytest.mark.parametrize("n_jobs,cluster,message", [
    (0, None, "--jobs: expected an integer >= 1, got 0"),
    (True, None, "--jobs: expected an integer >= 1"),
    (1, "localhost", "--cluster: expected a Dask scheduler address"),
])
def test_bad_options(n_jobs, cluster, message):
    with pytest.raises(ValueError, match=message):
        jobs.check(n_jobs, cluster)


EVAL = ["eval", "smollm2", "--chars", "1000", "--window", "128", "--long-window", "0", "--calibration-tokens",
        "96", "--only", "default", "int_hccs", "wide_pwl2"]


def _windows(out):
    r = json.loads((out / "results.json").read_text())
    return {v["key"]: [(w["start"], w["length"], w["nll"], w["scored"]) for w in v["windows"]] for v in r["variants"]}, r


@pytest.fixture(scope="module")
def cluster_address():
    """A Dask scheduler with two worker processes on this machine."""
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def test_longest_job_has_the_highest_priority_on_the_cluster(tmp_path, cluster_address):
    _check_long_job_starts_first(tmp_path, cluster=cluster_address)


def test_cluster_jobs_run_with_one_blas_thread(cluster_address):
    assert jobs.run(blas_threads, [0, 1], cluster=cluster_address) == [[1], [1]]


def test_eval_is_the_same_serial_parallel_on_a_cluster_and_resumed(tmp_path, cluster_address):
    """Bit-identical window NLLs whatever ran them (float32 forward passes with one BLAS thread are
    deterministic; each window starts from a fresh state); the layer calibrations run as jobs too (wide_pwl2
    needs the wide searches)."""
    assert cli(EVAL + ["--out", str(tmp_path / "serial"), "--jobs", "1"]) == 0
    serial, _ = _windows(tmp_path / "serial")
    assert len(serial["default"]) >= 2
    assert cli(EVAL + ["--out", str(tmp_path / "pool"), "--jobs", "2"]) == 0
    assert _windows(tmp_path / "pool")[0] == serial
    assert cli(EVAL + ["--out", str(tmp_path / "cluster"), "--cluster", cluster_address]) == 0
    assert _windows(tmp_path / "cluster")[0] == serial
    # Resuming the serial run with --jobs 2: the calibration, assembled from layer jobs of other processes
    # this time, must be recognised as the same, so every window is taken from the cache.
    assert cli(EVAL + ["--out", str(tmp_path / "serial"), "--jobs", "2", "--resume"]) == 0
    resumed, r = _windows(tmp_path / "serial")
    assert resumed == serial and r["jobs"]["resumed"] == r["jobs"]["count"] == 3 * len(serial["default"])


def test_minilm_eval_is_the_same_serial_parallel_and_on_a_cluster(tmp_path, cluster_address):
    """Layer calibrations and chunks of three sentences x variants as jobs: the same calibration and the same
    embedding cosines bit for bit (the forward pass runs one sentence at a time)."""
    def outcome(*options):
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        assert cli(["eval", "minilm", "--quick", "--chunk", "3", "--out", str(out), *options]) == 0
        r = json.loads((out / "results.json").read_text())
        assert r["jobs"]["count"] == 6 + 3 * (1 + len(r["variants"]))   # layers + chunks x (reference, variants)
        return r["calibration"], r["variants"]

    serial = outcome("--jobs", "1")
    assert outcome("--jobs", "2") == serial
    assert outcome("--cluster", cluster_address) == serial

