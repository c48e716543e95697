"""Thin helpers to get a Dask cluster. Optional back ends are imported only when asked for.

Any :class:`distributed.Client` works with :func:`nbody_dask.simulate`; these helpers only
choose safe defaults (everything bound to 127.0.0.1, dashboard included).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from distributed import Client, LocalCluster

from . import config

__all__ = ["local", "client_context", "total_threads"]


def local(
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    **kwargs: Any,
) -> LocalCluster:
    """A :class:`distributed.LocalCluster` bound to loopback.

    Parameters
    ----------
    n_workers : int, optional
        Worker processes; ``nbody.local-cluster.n-workers`` (1) by default.
    threads_per_worker : int, optional
        Threads per worker; every core by default. The kernels release the GIL, so threads
        in one process share the work without copying tiles between processes.
    **kwargs
        Passed to :class:`~distributed.LocalCluster` (``processes``, ``memory_limit``, ...).
    """
    defaults = config.get("local-cluster")
    n_workers = config.get("local-cluster.n-workers", n_workers)
    if threads_per_worker is None:
        threads_per_worker = defaults.get("threads-per-worker") or max(
            1, (os.cpu_count() or 1) // n_workers)
    kwargs.setdefault("host", defaults["host"])
    kwargs.setdefault("dashboard_address", defaults["dashboard-address"])
    kwargs.setdefault("silence_logs", logging.WARNING)
    return LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, **kwargs)


@contextlib.contextmanager
def client_context(client: Client | None) -> Iterator[Client]:
    """Yield ``client``, or start a :func:`local` cluster for the duration of the block."""
    if client is not None:
        if not isinstance(client, Client):
            raise TypeError(
                f"client must be a distributed.Client or None, got {type(client).__name__}")
        yield client
        return
    with local() as cluster, Client(cluster) as new_client:
        yield new_client


def total_threads(client: Client) -> int:
    """Worker threads on the cluster behind ``client`` (at least 1)."""
    return max(1, sum(client.nthreads().values()))
