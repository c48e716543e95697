"""Shared fixtures: one small in-process cluster for the whole session."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client, LocalCluster


#: Seconds the warm-up may take before it is stopped (a fresh clone: 162-185 s here).
WARMUP_LIMIT = 900


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Before the test workers start (the whole suite, or a marker's share of it): compile
    the kernels into Numba's on-disk cache in one process a CPU (``warm_kernels.py``), so
    that no kernel is compiled by several workers at once. With a warm cache this takes a
    quarter of a minute; ``NBODY_DASK_TEST_WARMUP=0`` skips it."""
    config = session.config
    if (hasattr(config, "workerinput") or os.environ.get("NBODY_DASK_TEST_WARMUP") == "0"
            or config.args_source is not pytest.Config.ArgsSource.TESTPATHS
            or config.option.collectonly):
        return
    import nbody_dask

    script = Path(__file__).with_name("warm_kernels.py")
    shares = max(1, min(os.cpu_count() or 1, 4))
    # the copy of the package these tests import (Numba caches beside its sources)
    package = str(Path(nbody_dask.__path__[0]).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [package, *filter(None, [os.environ.get("PYTHONPATH")])])}
    start = time.perf_counter()
    runs = [subprocess.Popen([sys.executable, str(script), str(share), str(shares)], env=env)
            for share in range(shares)]
    failed = []
    for run in runs:  # a warm-up that hangs must not hang the suite: the tests compile
        try:
            run.wait(timeout=max(1.0, WARMUP_LIMIT - (time.perf_counter() - start)))
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
        if run.returncode != 0:
            failed.append(run.args)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"Numba's cache warmed in {time.perf_counter() - start:.0f} s "
                            f"({shares} processes; NBODY_DASK_TEST_WARMUP=0 skips it)"
                            + (f"; FAILED: {failed}" if failed else ""))


@pytest.fixture(scope="session")
def client():
    """A threaded in-process LocalCluster: 1 worker, 2 threads, dashboard on 127.0.0.1."""
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address="127.0.0.1:0",
                      worker_dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as c:
        yield c


@pytest.fixture
def kernel_threads():
    """For a test that changes this thread's Numba thread count: set back afterwards, so
    that no later test runs with it."""
    import numba

    before = numba.get_num_threads()
    yield
    numba.set_num_threads(before)


@pytest.fixture
def store(tmp_path):
    """Path of a trajectory store that does not exist yet."""
    return tmp_path / "run.zarr"


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail loudly if simulate() gets as far as starting a cluster."""
    from nbody_dask import clusters

    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started before the input was validated")
    monkeypatch.setattr(clusters, "local", refuse)


class S3Server:
    """A local S3-compatible server (moto's standalone server) with IAM credentials checked."""

    bucket = "nbody"

    def __init__(self, endpoint: str, key: str, secret: str) -> None:
        self.endpoint = endpoint
        self.key, self.secret = key, secret
        self.options = self.storage_options(key, secret)

    def storage_options(self, key: str, secret: str, endpoint: str | None = None) -> dict:
        return {"key": key, "secret": secret, "client_kwargs": {
            "endpoint_url": endpoint or self.endpoint, "region_name": "us-east-1"}}

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                     aws_access_key_id=self.key, aws_secret_access_key=self.secret
                     ).create_bucket(Bucket=name)

    def url(self, name: str) -> str:
        """A fresh store URL in the bucket."""
        import uuid

        return f"s3://{self.bucket}/{uuid.uuid4().hex[:8]}/{name}"


@contextlib.contextmanager
def _moto_server():
    """moto's S3 server on 127.0.0.1 (a subprocess, as s3fs's own tests run it), with one
    IAM user whose key is the only one accepted, and a bucket ``nbody``: yields the
    :class:`S3Server` and the server's process."""
    import json
    import os
    import socket
    import subprocess
    import sys
    import time

    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # The first 3 requests go unauthenticated (they create the user, its key and its
    # policy); every later request must carry that key.
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    # moto's server with its conditional writes atomic, as S3's are (tests/moto_server.py)
    server_script = os.path.join(os.path.dirname(__file__), "moto_server.py")
    process = subprocess.Popen([sys.executable, server_script, "-H", "127.0.0.1", "-p",
                                str(port)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # a bare TCP connect: an HTTP probe would use up an unauthenticated request
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "no moto server"
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        anyone = dict(endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="anyone", aws_secret_access_key="anyone")
        iam = boto3.client("iam", **anyone)
        iam.create_user(UserName="nbody")
        key = iam.create_access_key(UserName="nbody")["AccessKey"]
        policy = {"Version": "2012-10-17",
                  "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="nbody", PolicyName="all",
                            PolicyDocument=json.dumps(policy))
        server = S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
        server.create_bucket(S3Server.bucket)
        yield server, process
    finally:
        if process.poll() is None:
            process.kill()  # also when paused (SIGSTOP), which SIGTERM would not end
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def s3():
    """moto's S3 server (:func:`_moto_server`), shared by the session."""
    with _moto_server() as (server, _):
        yield server


@pytest.fixture
def own_s3():
    """A moto S3 server of the test's own, and its process (to kill or pause)."""
    with _moto_server() as (server, process):
        yield server, process


def _interrupt_cli_run(arguments: list[str], store, snapshots: int, signum: int
                       ) -> tuple[int, str]:
    """Start ``nbody-dask`` with ``arguments`` (a run writing to the local ``store``), send
    it ``signum`` once ``snapshots`` snapshots are committed, and return its exit code and
    standard error (the orphaned workers of a killed driver are killed too)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from nbody_dask.storage import committed_snapshots

    proc = subprocess.Popen([sys.executable, "-m", "nbody_dask.cli", *arguments],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None
            try:
                if (store / "nbody" / "zarr.json").exists() and \
                        committed_snapshots(store) >= snapshots:
                    break
            except (ValueError, OSError):
                pass
            time.sleep(0.02)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a killed driver's orphaned workers
        except ProcessLookupError:
            pass
    return proc.returncode, err


@pytest.fixture
def interrupt_cli_run():
    """``interrupt_cli_run(arguments, store, snapshots, signum) -> (returncode, stderr)``:
    a CLI run interrupted by a signal once it has committed ``snapshots`` snapshots."""
    return _interrupt_cli_run
