"""Thin helpers to get a Dask cluster. Optional back ends are imported only when asked for.

Any :class:`distributed.Client` works with :func:`nbody_dask.simulate`; these helpers only
choose safe defaults (everything bound to 127.0.0.1, dashboard included).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import dask
from distributed import Client, LocalCluster

from . import config
from ._optional import optional_import
from ._validate import check_int
from .plan import check_layout

__all__ = ["KINDS", "make", "local", "slurm", "cuda", "kubernetes", "connect", "client_context",
           "total_threads", "shaped_layout"]


def local(
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    **kwargs: Any,
) -> LocalCluster:
    """A :class:`distributed.LocalCluster`: in this process by default, else bound to loopback.

    By default (``nbody.local-cluster.processes: false``) the scheduler and the workers are
    threads of the calling process, talking in-process: nothing is spawned, so a script
    without an ``if __name__ == "__main__":`` guard, ``python -c``, a script read from stdin,
    a notebook and the REPL all work, and the user's code runs once. The kernels release the
    GIL, so the worker threads share the cores. ``processes=True`` starts worker processes
    (spawned: the calling script then needs the guard) with the scheduler on
    ``nbody.local-cluster.host``.

    Parameters
    ----------
    n_workers : int, optional
        Workers; ``nbody.local-cluster.n-workers`` (1) by default.
    threads_per_worker : int, optional
        Threads per worker; every core by default. The kernels release the GIL, so threads
        in one process share the work without copying tiles between processes.
    **kwargs
        Passed to :class:`~distributed.LocalCluster` (``processes``, ``memory_limit``, ...).
    """
    config.validate()
    defaults = config.get("local-cluster")
    n_workers = check_int("n_workers", config.get("local-cluster.n-workers", n_workers), 1)
    if threads_per_worker is None:
        threads_per_worker = defaults.get("threads-per-worker") or max(
            1, (os.cpu_count() or 1) // n_workers)
    processes = bool(kwargs.pop("processes", defaults.get("processes", False)))
    if processes:
        kwargs.setdefault("host", defaults["host"])
    kwargs.setdefault("dashboard_address", defaults["dashboard-address"])
    # the workers' HTTP servers (/health, /metrics) on the scheduler's host, never on every
    # interface (distributed's default)
    kwargs.setdefault("worker_dashboard_address",
                      f"{defaults['host'] if processes else '127.0.0.1'}:0")
    kwargs.setdefault("silence_logs", logging.WARNING)
    _quiet_about_reported_errors()
    return LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                        processes=processes, **kwargs)


#: Errors of tasks that the driver re-raises with a message of its own (a non-finite state
#: naming the step and body, bodies outrunning the tree's margin, a lost lease, and the
#: faults of a store: a full disk, a lost mount or object-store endpoint, a response cut
#: short when the endpoint goes away mid-read).
REPORTED_ERRORS = ("NonFiniteStateError", "FarFieldError", "LeaseLostError", "OSError(",
                   "PermissionError(", "EndpointConnectionError", "ConnectTimeoutError",
                   "ReadTimeoutError", "ConnectionClosedError", "TimeoutError(",
                   "ClientPayloadError(", "ServerDisconnectedError(")


class _ReportedErrorsFilter(logging.Filter):
    """Drops distributed's "Compute Failed" records (task, traceback) of the errors in
    :data:`REPORTED_ERRORS`: the driver says the same in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Async instruction for") and str(
                record.msg).endswith("CancelledError"):  # in flight when a failed run stops
            return False
        if not str(record.msg).startswith("Compute Failed"):
            return True
        text = " ".join(map(str, record.args or ()))
        return not any(name in text for name in REPORTED_ERRORS)


def _quiet_about_reported_errors() -> None:
    """Install :class:`_ReportedErrorsFilter` on this process's worker loggers (once)."""
    for name in ("distributed.worker", "distributed.worker.state_machine"):
        worker_logger = logging.getLogger(name)
        if not any(isinstance(f, _ReportedErrorsFilter) for f in worker_logger.filters):
            worker_logger.addFilter(_ReportedErrorsFilter())


def slurm(jobs: int = 1, layout: str = "rows", **kwargs: Any):
    """A dask-jobqueue ``SLURMCluster``: each Slurm job runs Dask workers.

    Parameters
    ----------
    jobs : int
        Jobs to submit at once (``cluster.scale(jobs=...)``); 0 to scale later.
    layout : {"rows", "pairs"}
        The task layout the workers are shaped for; pass the same to
        :func:`nbody_dask.simulate`. ``"rows"`` (the HPC layout): one worker process per job
        with one Dask thread, the job booking ``cores`` CPUs (``--cpus-per-task``) for the
        parallel kernel. ``"pairs"``: ``processes`` workers per job sharing ``cores`` threads.
    **kwargs
        Passed to :class:`dask_jobqueue.SLURMCluster`; anything not given is read from the
        standard ``jobqueue.slurm`` configuration (see ``deploy/slurm/jobqueue.yaml``):
        ``cores``, ``memory``, ``queue``, ``account``, ``walltime``, ``interface``, ...
        The job scripts use this Python (``python=sys.executable``) unless told otherwise.

    Raises
    ------
    ValueError
        For an unknown layout, or ``layout="rows"`` with ``processes`` other than 1.
    """
    check_layout(layout)
    jobqueue = optional_import("dask_jobqueue", "slurm", "nbody_dask.clusters.slurm")
    kwargs.setdefault("python", sys.executable)
    if layout == "rows":
        if kwargs.get("processes", 1) != 1:
            raise ValueError(f"layout='rows' runs one worker process per job, got "
                             f"processes={kwargs['processes']!r}")
        cores = kwargs.pop("cores", None) or dask.config.get("jobqueue.slurm.cores")
        kwargs.update(cores=1, processes=1)
        kwargs.setdefault("job_cpu", cores)
    cluster = jobqueue.SLURMCluster(**kwargs)
    if jobs:
        cluster.scale(jobs=jobs)
    return cluster


def cuda(**kwargs: Any):
    """A dask-cuda ``LocalCUDACluster``: one worker per GPU of this machine, on loopback."""
    dask_cuda = optional_import("dask_cuda", "gpu", "nbody_dask.clusters.cuda")
    kwargs.setdefault("host", "127.0.0.1")
    kwargs.setdefault("dashboard_address", "127.0.0.1:0")
    return dask_cuda.LocalCUDACluster(**kwargs)


_SPEC_KEYS = ("name", "image", "n_workers", "worker_cpu", "layout", "worker_memory",
              "gpus_per_worker", "volume_claim", "mount_path", "env")


def kubernetes(**kwargs: Any):
    """A dask-kubernetes operator ``KubeCluster`` (needs the operator in the cluster).

    Parameters
    ----------
    **kwargs
        Those of :func:`nbody_dask.k8s.cluster_spec` (``image``, ``n_workers``,
        ``worker_cpu``, ``worker_memory``, ``gpus_per_worker``, ``volume_claim``, ...;
        defaults in ``nbody.kubernetes``) build the ``DaskCluster``; the rest (``namespace``,
        ``shutdown_on_close``, ``resource_timeout``, ...) go to
        :class:`dask_kubernetes.operator.KubeCluster`. See ``deploy/kubernetes``.

    Raises
    ------
    ValueError
        For a bad spec value (no image, say), before anything is contacted.
    RuntimeError
        If no Kubernetes credentials or API server can be found.
    """
    from . import k8s

    spec = k8s.cluster_spec(**{k: kwargs.pop(k) for k in _SPEC_KEYS if k in kwargs})
    operator = optional_import("dask_kubernetes.operator", "kubernetes",
                         "nbody_dask.clusters.kubernetes")
    kwargs.setdefault("resource_timeout", 60)
    before = set(operator.KubeCluster._instances)
    try:
        return operator.KubeCluster(custom_cluster_spec=spec, **kwargs)
    except Exception as exc:
        if "credentials" in str(exc).lower() or "kubeconfig" in str(exc).lower():
            for stillborn in set(operator.KubeCluster._instances) - before:
                stillborn.shutdown_on_close = False  # nothing was created: no atexit reaping
            raise RuntimeError(f"nbody_dask.clusters.kubernetes: no Kubernetes cluster to talk "
                               f"to ({exc}); set KUBECONFIG or run inside a pod") from None
        raise


KINDS = {"local": local, "slurm": slurm, "cuda": cuda, "kubernetes": kubernetes}


def shaped_layout(kind: str) -> str | None:
    """The task layout the workers of ``make(kind)`` are shaped for by default (None: the
    ``nbody.layout`` setting): ``"rows"`` for Slurm, ``nbody.kubernetes.layout`` for
    Kubernetes CPU pods."""
    if kind == "slurm":
        return "rows"
    if kind == "kubernetes" and not config.get("kubernetes.gpus-per-worker"):
        return config.get("kubernetes.layout")
    return None


def make(kind: str, **kwargs: Any):
    """A cluster of the given kind: ``"local"``, ``"slurm"``, ``"cuda"`` or ``"kubernetes"``.

    Raises
    ------
    ValueError
        For an unknown kind, listing the known ones.
    ImportError
        If the kind's optional package is missing, naming the extra to install.
    """
    if kind not in KINDS:
        raise ValueError(f"cluster kind must be one of {sorted(KINDS)}, got {kind!r}")
    return KINDS[kind](**kwargs)


def connect(address: str | None = None, *, scheduler_file: str | None = None,
            timeout: str = "10s", **kwargs: Any) -> Client:
    """A client of a running scheduler, by address or scheduler file; fails within ``timeout``.

    Raises
    ------
    ValueError
        Unless exactly one of ``address`` and ``scheduler_file`` is given.
    OSError
        If the scheduler cannot be reached in time (with the address in the message).
    """
    if (address is None) == (scheduler_file is None):
        raise ValueError("connect() needs exactly one of address= and scheduler_file=")
    target = address if address is not None else f"scheduler file {scheduler_file!r}"
    if scheduler_file is not None and not os.path.exists(scheduler_file):
        raise FileNotFoundError(f"no scheduler file at {scheduler_file!r}")
    if scheduler_file is not None:
        try:
            with open(scheduler_file) as f:
                info = json.load(f)
            ok = isinstance(info, dict) and isinstance(info.get("address"), str)
        except (OSError, UnicodeDecodeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{scheduler_file!r} is not a Dask scheduler file (JSON with an "
                             "'address', as `dask scheduler --scheduler-file` writes)")
    try:
        return Client(address, scheduler_file=scheduler_file, timeout=timeout, **kwargs)
    except (OSError, TimeoutError) as exc:
        raise OSError(f"cannot reach the Dask scheduler at {target} within {timeout}: "
                      f"{exc}") from None


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
        try:
            yield new_client
        except KeyboardInterrupt:
            # stopped at once (a second Ctrl-C): the cluster closes under steps in flight, and
            # its workers' failed heartbeats and cancelled tasks are no news
            with _no_logs():
                new_client.close()
                cluster.close()
            raise


@contextlib.contextmanager
def _no_logs() -> Iterator[None]:
    """No log records in this process while the block runs (every thread)."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(before)


def dashboard_link(client: Client) -> str:
    """The dashboard's URL, with the address it is really bound to.

    For an in-process cluster Dask builds the link from the machine's address although the
    dashboard listens on ``nbody.local-cluster.dashboard-address`` (127.0.0.1): a link that
    would not open.
    """
    from distributed.utils import format_dashboard_link

    scheduler = getattr(getattr(client, "cluster", None), "scheduler", None)
    server = getattr(scheduler, "http_server", None)
    if getattr(server, "port", None):
        return format_dashboard_link(server.address or "127.0.0.1", server.port)
    return client.dashboard_link


def total_threads(client: Client) -> int:
    """Worker threads on the cluster behind ``client`` (at least 1)."""
    return max(1, sum(client.nthreads().values()))
