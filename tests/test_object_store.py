"""Trajectories in an object store (S3, against moto's server on 127.0.0.1).

The store is written by the workers straight to the bucket; the commit protocol and the
writer lease work without rename and without trusting listings.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

import nbody_dask
from nbody_dask import lease
from nbody_dask.cli import main
from nbody_dask.location import StoreUnreachableError, store_location
from nbody_dask.storage import committed_snapshots

pytestmark = pytest.mark.timeout(300)

PARAMS = dict(steps=20, dt=0.01, softening=0.05, snapshot_every=5, tile_size=32)


def _bodies():
    return nbody_dask.plummer(80, seed=11)


@pytest.fixture(scope="module")
def local_reference(client, tmp_path_factory):
    """The same run into a local store: what the bucket must hold, bit for bit."""
    store = tmp_path_factory.mktemp("local") / "ref.zarr"
    return nbody_dask.simulate(_bodies(), store=store, client=client, progress=False,
                               **PARAMS).load()


def _assert_identical(traj, reference):
    assert traj.sizes == reference.sizes
    for name in ("position", "velocity", "mass", "total_energy", "momentum",
                 "angular_momentum"):
        np.testing.assert_array_equal(traj[name].values, reference[name].values, err_msg=name)


@pytest.mark.slow
def test_run_to_s3_reads_back_with_xarray_bit_identical(client, s3, local_reference):
    url = s3.url("run.zarr")
    traj = nbody_dask.simulate(_bodies(), store=url, storage_options=s3.options,
                               client=client, progress=False, **PARAMS)
    _assert_identical(traj.load(), local_reference)
    # a plain xarray reader needs nothing from nbody_dask
    plain = xr.open_zarr(url, storage_options=s3.options).load()
    _assert_identical(plain, local_reference)
    assert plain.attrs["nbody_dask_version"] == nbody_dask.__version__
    assert committed_snapshots(url, s3.options) == 5
    assert nbody_dask.verify_trajectory(url, s3.options) == 5
    assert lease.holder(store_location(url, s3.options)) is None  # released at the end


@pytest.mark.slow
def test_existing_object_store_is_kept_unless_overwrite(client, s3):
    url = s3.url("kept.zarr")
    run = dict(store=url, storage_options=s3.options, client=client, progress=False,
               steps=2, dt=0.01, softening=0.05)
    nbody_dask.simulate(nbody_dask.plummer(16, seed=1), **run)
    with pytest.raises(FileExistsError, match=f"store '{url}' already exists; pass "
                                              "overwrite=True"):
        nbody_dask.simulate(nbody_dask.plummer(16, seed=2), **run)
    again = nbody_dask.simulate(nbody_dask.plummer(24, seed=2), overwrite=True, **run)
    assert again.sizes["body"] == 24
    location = store_location(url, s3.options)
    location.write_bytes("notes.txt", b"mine")
    with pytest.raises(ValueError, match="holds entries nbody_dask did not write: notes.txt"):
        nbody_dask.simulate(nbody_dask.plummer(16, seed=3), overwrite=True, **run)
    assert location.read_bytes("notes.txt") == b"mine"


@pytest.mark.slow
def test_cli_runs_summarises_exports_and_continues_an_s3_store(s3, tmp_path):
    url = s3.url("cli.zarr")
    options = json.dumps(s3.options)
    runner = CliRunner()
    result = runner.invoke(main, ["run", "--n", "40", "--steps", "4", "--snapshot-every", "2",
                                  "--no-progress", "--store", url, "--storage-options",
                                  options])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["info", url, "--storage-options", options])
    assert result.exit_code == 0, result.output
    assert f"store        {url}" in result.output
    assert "snapshots    3 committed" in result.output
    assert "verified     every chunk of 3 snapshot(s)" in result.output
    # its last snapshot as initial conditions, and exported to a file
    last = nbody_dask.open_trajectory(url, s3.options).isel(time=-1).load()
    result = runner.invoke(main, ["export", url, str(tmp_path / "last.npz"),
                                  "--storage-options", options])
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "last.npz") as exported:
        np.testing.assert_array_equal(exported["position"], last.position.values)
    result = runner.invoke(main, ["run", "--ic", url, "--steps", "2", "--no-progress",
                                  "--store", str(tmp_path / "next.zarr"),
                                  "--storage-options", options])
    assert result.exit_code == 0, result.output
    following = nbody_dask.open_trajectory(tmp_path / "next.zarr").isel(time=0).load()
    np.testing.assert_array_equal(following.position.values, last.position.values)
    assert float(following.time) == float(last.time)


# -- the writer lease without rename, and with listings that lag -------------------------

def test_lease_is_exclusive_and_taken_over_when_stale_in_s3(s3, monkeypatch):
    location = store_location(s3.url("lease.zarr"), s3.options)
    first = lease.WriterLease(location)
    first.acquire()
    try:
        with pytest.raises(lease.StoreInUseError, match=r"is in use by run \w+ \(pid"):
            lease.WriterLease(location).acquire()
        assert lease.holds(location, first.run_id)
        # another host's lease whose heartbeat stopped long ago is stale: taken over
        record = {"run_id": "f" * 32, "host": "elsewhere.example", "pid": 1,
                  "pid_started": 0.0, "started": 0.0, "heartbeat": time.time() - 3600}
        location.create("writer.lease.1", json.dumps(record).encode())
        second = lease.WriterLease(location, timeout=60)
        second.acquire()
        assert second.generation == 2
        assert not first.held()
        with pytest.raises(lease.LeaseLostError, match="was taken over"):
            first.check()
        # a listing that lags behind the newest write still finds the newest generation
        monkeypatch.setattr(type(location), "names", lambda self: ["zarr.json"])
        assert lease.holder(location).run_id == second.run_id
        second.release()
    finally:
        first.release()
    monkeypatch.undo()
    assert lease.holder(location) is None


def test_exclusive_create_is_a_conditional_put(s3):
    location = store_location(s3.url("x.zarr"), s3.options)
    location.create("marker", b"one")
    with pytest.raises(FileExistsError):
        location.create("marker", b"two")
    assert location.read_bytes("marker") == b"one"


# -- a driver SIGKILLed mid-run, resumed ---------------------------------------------------

RUN = ["--ic", "plummer", "--n", "200", "--seed", "3", "--steps", "120", "--dt", "0.015625",
       "--softening", "0.05", "--snapshot-every", "5", "--tile-size", "100", "--no-progress"]


@pytest.mark.slow
def test_driver_killed_then_resumed_from_s3_is_bit_identical(client, s3, tmp_path):
    reference_store = tmp_path / "ref.zarr"
    result = CliRunner().invoke(main, ["run", *RUN, "--store", str(reference_store)])
    assert result.exit_code == 0, result.output
    reference = xr.open_zarr(reference_store).load()

    url, options = s3.url("killed.zarr"), json.dumps(s3.options)
    proc = subprocess.Popen([sys.executable, "-m", "nbody_dask.cli", "run", *RUN, "--store",
                             url, "--storage-options", options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "fewer than 4 snapshots committed in 180 s"
            try:
                if committed_snapshots(url, s3.options) >= 4:
                    break
            except ValueError:  # not laid out yet
                pass
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)  # the driver only: no chance to clean up
        proc.wait(timeout=30)
    finally:
        import os

        try:
            os.killpg(proc.pid, signal.SIGKILL)  # then its orphaned workers
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    committed = committed_snapshots(url, s3.options)
    assert 4 <= committed < reference.sizes["time"]
    assert lease.holder(store_location(url, s3.options)) is not None  # the dead run's lease
    resumed = subprocess.run([sys.executable, "-m", "nbody_dask.cli", "resume", url,
                              "--storage-options", options, "--no-progress"],
                             capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    _assert_identical(xr.open_zarr(url, storage_options=s3.options).load(), reference)


# -- unreachable endpoint, bad credentials: one line, at once, nothing started --------------

def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("case", ["endpoint", "key", "secret", "bucket"])
def test_bad_endpoint_or_credentials_fail_in_one_line_before_any_work(s3, case, no_cluster):
    options = {
        "endpoint": s3.storage_options(s3.key, s3.secret,
                                       f"http://127.0.0.1:{_closed_port()}"),
        "key": s3.storage_options("AKIANOTAREALKEY00000", s3.secret),
        "secret": s3.storage_options(s3.key, "not-the-secret"),
        "bucket": s3.options,
    }[case]
    url = "s3://no-such-bucket/run.zarr" if case == "bucket" else s3.url("bad.zarr")
    why = {"endpoint": "cannot reach the object store (EndpointConnectionError",
           "key": "access denied, check the credentials",
           "secret": "access denied, check the credentials",
           "bucket": "bucket 'no-such-bucket' does not exist"}[case]
    start = time.monotonic()
    why = re.escape(why)
    with pytest.raises(StoreUnreachableError, match=rf"^store '{url}': {why}") as error:
        nbody_dask.simulate(_bodies(), store=url, storage_options=options, progress=False,
                            **PARAMS)
    assert time.monotonic() - start < 10
    assert "\n" not in str(error.value)
    with pytest.raises(StoreUnreachableError, match=why):
        nbody_dask.open_trajectory(url, storage_options=options)
    with pytest.raises(StoreUnreachableError, match=why):
        nbody_dask.simulate(store=url, storage_options=options, resume=True)


def test_cli_bad_endpoint_is_one_line_in_under_10_s(s3):
    options = json.dumps(s3.storage_options(s3.key, s3.secret,
                                            f"http://127.0.0.1:{_closed_port()}"))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nbody_dask.cli", "run", "--n", "16",
                           "--steps", "1", "--no-progress", "--store", s3.url("cli.zarr"),
                           "--storage-options", options], capture_output=True, text=True,
                          timeout=60)
    assert time.monotonic() - start < 10
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the object store" in lines[0], proc.stderr


# -- credentials from the environment, as the Kubernetes manifest gives them ---------------

@pytest.mark.slow
def test_the_kubernetes_s3_job_runs_with_its_secret_as_environment(s3, tmp_path):
    """deploy/kubernetes/daskjob-s3.yaml: its driver command, run here (smaller) with its
    Secret's variables set to this server's values, writes a store xarray opens."""
    import os
    import shlex
    from pathlib import Path

    import yaml

    manifest = Path(__file__).parents[1] / "deploy" / "kubernetes" / "daskjob-s3.yaml"
    secret, job = yaml.safe_load_all(manifest.read_text())
    values = {"AWS_ACCESS_KEY_ID": s3.key, "AWS_SECRET_ACCESS_KEY": s3.secret,
              "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": s3.endpoint}
    assert set(secret["stringData"]) == set(values)
    pod = job["spec"]["job"]["spec"]["containers"][0]
    workers = job["spec"]["cluster"]["spec"]["worker"]["spec"]["containers"][0]
    for container in (pod, workers):  # driver and workers both get the Secret
        assert container["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    words = shlex.split(pod["args"][0])
    assert words[:2] == ["nbody-dask", "run"]
    at = words.index("--scheduler")
    del words[at:at + 2]  # here: the embedded local cluster instead of the operator's
    url = words[words.index("--store") + 1]
    assert url.startswith("s3://")
    smaller = {"--n": "64", "--steps": "4", "--snapshot-every": "2"}
    for option, value in smaller.items():
        words[words.index(option) + 1] = value
    s3.create_bucket(url[len("s3://"):].split("/")[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run([sys.executable, "-m", "nbody_dask.cli", *words[1:]],
                          env={**env, **values}, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    traj = xr.open_zarr(url, storage_options=s3.options)
    assert traj.sizes == {"time": 3, "body": 64, "axis": 3}
    assert traj.attrs["layout"] == "rows"
    assert np.isfinite(traj.position.values).all()


# -- the endpoint lost or silent mid-run (issue 33, item 3) -----------------------------------

def _run_in_background(server, url, timeout=3):
    """`nbody-dask run` to ``url`` in a subprocess (many small snapshots: several seconds),
    with requests that time out after ``timeout`` s."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "DASK_NBODY__OBJECT_STORE__TIMEOUT": str(timeout)}
    return subprocess.Popen(
        [sys.executable, "-m", "nbody_dask.cli", "run", *_RUN_ARGS, "--no-progress",
         "--store", url, "--storage-options", json.dumps(server.options)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


#: The run the endpoint tests interrupt: many small snapshots, several seconds.
_RUN_ARGS = ("--n", "256", "--steps", "1000", "--dt", "0.001", "--softening", "0.05",
             "--snapshot-every", "10")


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "nbody_dask.cli", *args],
                          capture_output=True, text=True, timeout=300)


def _wait_for_commits(server, url, run, count=2):
    import time

    from nbody_dask.storage import committed_snapshots

    deadline = time.monotonic() + 120
    while True:
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "the run committed nothing"
        try:
            if committed_snapshots(url, server.options) >= count:
                return
        except (ValueError, FileNotFoundError):
            pass
        time.sleep(0.2)


def _one_line_about(run, url, limit):
    """The run's end within ``limit`` seconds: exit 1 and one line naming the store, the
    snapshots committed and the resume command; no traceback."""
    import subprocess

    try:
        out, err = run.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        run.kill()
        raise AssertionError(f"the run did not stop within {limit} s") from None
    assert run.returncode == 1, (out, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"Error: writing to the store '{url}' failed"), err
    assert "snapshot(s) are committed and intact" in lines[0], err
    assert f"nbody-dask resume {url}" in lines[0], err


@pytest.mark.slow
def test_a_killed_endpoint_ends_the_run_in_one_line(own_s3):
    server, process = own_s3
    url = server.url("killed.zarr")
    run = _run_in_background(server, url)
    _wait_for_commits(server, url, run)
    process.kill()
    _one_line_about(run, url, limit=90)


@pytest.mark.slow
def test_a_paused_endpoint_ends_the_run_in_one_line_then_resumes(own_s3, tmp_path):
    """An endpoint that stops answering (SIGSTOP: connections accepted, nothing answered)
    ends the run as a lost one does, within the bounded time (requests' timeout, and a
    deadline on every store operation); once it answers again, the run resumes."""
    import signal

    server, process = own_s3
    url = server.url("paused.zarr")
    run = _run_in_background(server, url, timeout=2)
    _wait_for_commits(server, url, run)
    process.send_signal(signal.SIGSTOP)
    try:
        _one_line_about(run, url, limit=60)  # two deadlines of 4 x 2 s, and the slack
    finally:
        process.send_signal(signal.SIGCONT)
    resumed = _cli("resume", url, "--no-progress", "--storage-options",
                   json.dumps(server.options))
    assert resumed.returncode == 0, resumed.stderr
    local = tmp_path / "local.zarr"
    reference = _cli("run", *_RUN_ARGS, "--no-progress", "--store", str(local))
    assert reference.returncode == 0, reference.stderr
    got = xr.open_zarr(url, storage_options=server.options)
    want = xr.open_zarr(local)
    assert got.sizes == want.sizes
    assert np.array_equal(got.position.values, want.position.values)
