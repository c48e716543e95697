"""Restarts identical to a continuous run: driver killed, SIGTERM, a worker killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster

import nbody_dask
import nbody_dask.clusters
from nbody_dask.storage import committed_snapshots

# 300 bodies in 3 tiles (a real multi-tile graph), 41 snapshots.
RUN = ["--ic", "plummer", "--n", "300", "--seed", "3", "--steps", "200", "--dt", "0.015625",
       "--softening", "0.05", "--snapshot-every", "5", "--tile-size", "100", "--no-progress"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, client):
    """The uninterrupted run, in process (other cluster layout: results must not care)."""
    from click.testing import CliRunner

    from nbody_dask.cli import main

    store = tmp_path_factory.mktemp("reference") / "ref.zarr"
    result = CliRunner().invoke(main, ["run", *RUN, "--store", str(store)])
    assert result.exit_code == 0, result.output
    return xr.open_zarr(store).load()


def _start(store, *args):
    return subprocess.Popen([sys.executable, "-m", "nbody_dask.cli", *args, "--store",
                             str(store)] if args and args[0] == "run" else
                            [sys.executable, "-m", "nbody_dask.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_commits(proc, store, count, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if (store / "nbody" / "zarr.json").exists():
            try:
                if committed_snapshots(store) >= count:
                    return
            except (ValueError, OSError):
                pass
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} snapshots committed in {timeout} s")


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _resume(store):
    proc = subprocess.run([sys.executable, "-m", "nbody_dask.cli", "resume", str(store),
                           "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def _assert_identical(store, reference):
    traj = nbody_dask.open_trajectory(store).load()
    assert traj.sizes["time"] == reference.sizes["time"]
    for name in ("position", "velocity", "total_energy", "momentum", "angular_momentum"):
        np.testing.assert_array_equal(traj[name].values, reference[name].values, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", [2, 11, 27])
@pytest.mark.xdist_group("reference")  # one process runs the reference
def test_driver_killed_then_resumed_is_bit_identical(tmp_path, reference, kill_after):
    store = tmp_path / "killed.zarr"
    proc = _start(store, "run", *RUN)
    try:
        _wait_for_commits(proc, store, kill_after)
        proc.send_signal(signal.SIGKILL)  # the driver only: no chance to clean up
        proc.wait(timeout=30)
    finally:
        _kill_group(proc)  # then its orphaned workers
    committed = committed_snapshots(store)
    assert kill_after <= committed < reference.sizes["time"]
    assert nbody_dask.open_trajectory(store).sizes["time"] == committed
    _resume(store)
    _assert_identical(store, reference)


@pytest.mark.parametrize(("signum", "code", "said"), [
    (signal.SIGTERM, 143, "interrupted by SIGTERM"),
    # Ctrl-C as SIGTERM (before: `Aborted!`, exit 1, or a wall of tracebacks)
    (signal.SIGINT, 130, "interrupted by Ctrl-C (SIGINT)"),
])
@pytest.mark.slow
@pytest.mark.xdist_group("reference")  # one process runs the reference
def test_signal_commits_and_exits_cleanly_then_resumes(tmp_path, reference, signum, code,
                                                        said):
    store = tmp_path / "term.zarr"
    proc = _start(store, "run", *RUN)
    try:
        _wait_for_commits(proc, store, 5)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        _kill_group(proc)
    assert proc.returncode == code, err
    assert said in err and f"nbody-dask resume {store}" in err
    assert "Traceback" not in err and "Aborted" not in err
    committed = committed_snapshots(store)
    assert 5 <= committed < reference.sizes["time"]
    _resume(store)
    _assert_identical(store, reference)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["direct", "tree"])
def test_worker_killed_mid_run_gives_identical_result(tmp_path, method):
    """SIGKILL one of two worker processes a third of the way through."""
    ds = nbody_dask.plummer(400, seed=2)
    kw = dict(steps=36, dt=1 / 64, softening=0.05, snapshot_every=5, tile_size=100,
              progress=False, method=method)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=50) as cluster, \
            Client(cluster) as c:
        expected = nbody_dask.simulate(ds, client=c, **kw).isel(time=-1).load()
        victim = next(iter(c.run(os.getpid).values()))
        killed = []

        def kill_once(step, record):
            if step >= 12 and not killed:
                os.kill(victim, signal.SIGKILL)
                killed.append(step)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = nbody_dask.simulate(ds, client=c, store=tmp_path / "w.zarr",
                                      callback=kill_once, **kw)
    assert killed
    # Dask recomputes what it still can; otherwise simulate() restarts from a snapshot.
    for w in caught:
        assert issubclass(w.category, RuntimeWarning), w
        assert "restarting from snapshot" in str(w.message), w
    last = got.isel(time=-1).load()
    np.testing.assert_array_equal(last.position.values, expected.position.values)
    np.testing.assert_array_equal(last.velocity.values, expected.velocity.values)


def test_resume_checks_the_configuration(client, tmp_path):
    store = tmp_path / "r.zarr"
    ds = nbody_dask.uniform_cube(20, seed=1)
    nbody_dask.simulate(ds, steps=10, dt=0.01, store=store, snapshot_every=5, client=client,
                        progress=False)
    with pytest.raises(ValueError, match=r"resume: dt=0\.02 differs from the store's dt=0\.01"):
        nbody_dask.simulate(store=store, resume=True, dt=0.02, client=client)
    with pytest.raises(ValueError, match="do not pass bodies"):
        nbody_dask.simulate(ds, store=store, resume=True, client=client)
    with pytest.raises(ValueError, match="conflict"):
        nbody_dask.simulate(store=store, resume=True, overwrite=True, client=client)
    with pytest.raises(FileNotFoundError, match="to resume"):
        nbody_dask.simulate(store=tmp_path / "none.zarr", resume=True, client=client)
    # a finished run resumes to itself, untouched; a resume's ids come back unindexed
    before = xr.open_zarr(store).load()
    again = nbody_dask.simulate(store=store, resume=True, dt=0.01, dtype="float64",
                                client=client, progress=False)
    assert "body" not in again.xindexes
    xr.testing.assert_identical(before, again.load().set_xindex("body"))


@pytest.mark.parametrize("processes", [False, True])
def test_local_cluster_binds_loopback_only(processes):
    """In-process (the default): no socket but the dashboard's; with processes, loopback."""
    scheme = "tcp://127.0.0.1:" if processes else "inproc://"
    with nbody_dask.clusters.local(n_workers=1, threads_per_worker=1,
                                   processes=processes) as cluster:
        assert cluster.scheduler_address.startswith(scheme)
        assert all(w.address.startswith(scheme) for w in cluster.workers.values())
        with Client(cluster) as client:
            assert nbody_dask.clusters.dashboard_link(client).startswith("http://127.0.0.1:")
        server = cluster.scheduler.http_server
        hosts = {sock.getsockname()[0] for sock in server._sockets.values()}
        assert hosts == {"127.0.0.1"}
        if not processes:  # every socket this process listens on, workers' HTTP included
            import psutil

            listening = {c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                         if c.status == psutil.CONN_LISTEN}
            assert listening <= {"127.0.0.1"}, listening


@pytest.mark.slow
def test_long_run_keeps_tasks_and_memory_flat(client):
    """600 steps of a 2-tile system: no futures or keys accumulate, memory stays level."""
    import gc

    import psutil

    scheduler = client.cluster.scheduler
    # the shared cluster may still hold futures of an earlier test's failed run (its
    # exception's frames, until the garbage collector frees them): count this run's alone
    gc.collect()
    time.sleep(0.5)
    before = set(scheduler.tasks)
    samples = []

    def ours() -> set:
        return set(scheduler.tasks) - before

    def sample(step, record):
        samples.append((step, len(ours()), psutil.Process().memory_info().rss))

    ds = nbody_dask.plummer(64, seed=8)
    nbody_dask.simulate(ds, steps=600, dt=1e-4, softening=0.05, snapshot_every=25,
                        tile_size=32, client=client, progress=False, callback=sample)
    tasks = [t for _, t, _ in samples]
    rss = [r for _, _, r in samples]
    half = len(samples) // 2
    assert max(tasks[half:]) <= 1.5 * max(tasks[:half]) + 50
    # Bounded by the look-ahead (5 submissions of 25 steps of 2 + 4 + 2 tasks), not the run.
    lookahead = nbody_dask.config.get("lookahead")
    assert max(tasks) <= (lookahead + 1) * 25 * 8
    assert rss[-1] - rss[3] < 100 * 2**20
    deadline = time.monotonic() + 10
    while ours() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ours()  # everything released once simulate() returns


@pytest.mark.slow
def test_second_ctrl_c_stops_at_once(tmp_path):
    store = tmp_path / "int2.zarr"
    # steps of ~10 ms, 20 to a snapshot: the steps in flight after the first Ctrl-C take far
    # longer than the 0.2 s before the second
    slow = ["--ic", "plummer", "--n", "4000", "--tile-size", "1000", "--steps", "100000",
            "--dt", "0.001", "--softening", "0.05", "--snapshot-every", "20", "--no-progress"]
    proc = _start(store, "run", *slow)
    try:
        _wait_for_commits(proc, store, 2)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        _kill_group(proc)
    assert proc.returncode == 130, err
    assert "stopped at once by a second Ctrl-C" in err and "Traceback" not in err
    assert committed_snapshots(store) >= 2
