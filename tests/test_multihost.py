"""Several hosts on one machine: scheduler and workers in separate network namespaces.

Two namespaces joined by a veth pair are two hosts with their own addresses and no loopback
between them; the scheduler and the driver live in one, two worker processes in the other,
and the store is on the shared filesystem (as on a cluster). Needs root (``ip netns``);
skipped, visibly, elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import nbody_dask

SCHEDULER_IP, WORKER_IP = "10.213.7.1", "10.213.7.2"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def two_hosts():
    """Namespaces (scheduler host, worker host) joined by a veth pair; removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    tag = f"nbd{os.getpid() % 100000}"
    hosts = (f"{tag}-s", f"{tag}-w")
    try:
        for host in hosts:
            _ip("netns", "add", host)
    except subprocess.CalledProcessError as exc:
        for host in hosts:
            _ip("netns", "del", host, check=False)
        pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
    try:
        _ip("link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        for host, dev, addr in ((hosts[0], f"{tag}a", SCHEDULER_IP),
                                (hosts[1], f"{tag}b", WORKER_IP)):
            _ip("link", "set", dev, "netns", host)
            _ip("-n", host, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", host, "link", "set", dev, "up")
            _ip("-n", host, "link", "set", "lo", "up")
        yield hosts
    finally:
        for host in hosts:  # deleting a namespace deletes its end of the veth pair, and both go
            _ip("netns", "del", host, check=False)


def _in(host: str, *argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", host, *argv], **kwargs)


DRIVER = textwrap.dedent("""
    import sys
    from distributed import Client
    import nbody_dask
    address, store = sys.argv[1:]
    with Client(address, timeout="20s") as client:
        client.wait_for_workers(2, timeout=60)
        hosts = sorted({w.split("://")[1].rsplit(":", 1)[0] for w in client.nthreads()})
        print("worker hosts:", *hosts)
        bodies = nbody_dask.plummer(700, seed=11)
        for method in ("direct", "tree"):  # the tree re-cuts its 4 spatial tiles 5 times
            nbody_dask.simulate(bodies, steps=12, dt=1 / 64, softening=0.02, tile_size=200,
                                snapshot_every=4, store=f"{store}-{method}", client=client,
                                progress=False, method=method)
    print("done")
""")


@pytest.mark.slow
def test_simulation_across_two_hosts_matches_a_local_run(two_hosts, tmp_path, client):
    sched_host, worker_host = two_hosts
    address = f"tcp://{SCHEDULER_IP}:8786"
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("scheduler", "worker")}
    procs = [
        _in(sched_host, sys.executable, "-m", "distributed.cli.dask_scheduler",
            "--host", SCHEDULER_IP, "--port", "8786",
            "--dashboard-address", f"{SCHEDULER_IP}:0",
            stdout=logs["scheduler"], stderr=subprocess.STDOUT),
        _in(worker_host, sys.executable, "-m", "distributed.cli.dask_worker", address,
            "--host", WORKER_IP, "--nworkers", "2", "--nthreads", "1",
            "--no-dashboard", "--death-timeout", "60",
            stdout=logs["worker"], stderr=subprocess.STDOUT),
    ]
    store = tmp_path / "two-hosts.zarr"
    try:
        t0 = time.monotonic()
        driver = subprocess.run(
            ["ip", "netns", "exec", sched_host, sys.executable, "-c", DRIVER, address,
             str(store)], capture_output=True, text=True, timeout=240)
        logs_text = "".join((tmp_path / f"{n}.log").read_text() for n in logs)
        assert driver.returncode == 0, driver.stderr[-3000:] + logs_text[-3000:]
        assert f"worker hosts: {WORKER_IP}" in driver.stdout, driver.stdout
        assert time.monotonic() - t0 < 240
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs.values():
            log.close()

    # The same runs on this host's in-process cluster give the same bits.
    for method in ("direct", "tree"):
        across = nbody_dask.open_trajectory(f"{store}-{method}").isel(time=-1).load()
        local = nbody_dask.simulate(nbody_dask.plummer(700, seed=11), steps=12, dt=1 / 64,
                                    softening=0.02, tile_size=200, snapshot_every=4,
                                    store=tmp_path / f"local-{method}.zarr", client=client,
                                    progress=False, method=method).isel(time=-1).load()
        assert across.attrs["method"] == method
        for name in ("position", "velocity", "total_energy"):
            np.testing.assert_array_equal(across[name].values, local[name].values)

