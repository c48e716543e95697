"""Shared fixtures: one small in-process cluster for the whole session."""

from __future__ import annotations

import pytest
from distributed import Client, LocalCluster


@pytest.fixture(scope="session")
def client():
    """A threaded in-process LocalCluster: 1 worker, 2 threads, dashboard on 127.0.0.1."""
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as c:
        yield c


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
