"""Kubernetes manifests for the dask-kubernetes operator: ``DaskCluster``, ``DaskWorkerGroup``.

Specs are built with dask-kubernetes' own ``make_cluster_spec`` / ``make_worker_spec`` and then
given what an nbody_dask run needs: one Dask worker per pod with ``--nthreads`` equal to its CPU
limit (the kernels release the GIL), requests equal to limits (a guaranteed QoS class, so a
worker is not throttled below the cores it plans for), ``dask cuda worker`` and an
``nvidia.com/gpu`` limit for GPU pods, and optionally a shared volume for the trajectory store
(workers write their own chunks, so every worker and the driver must see the same path).

Defaults come from ``nbody.kubernetes`` in :mod:`dask.config`. Everything is checked before
dask-kubernetes is imported. ``deploy/kubernetes`` holds hand-written manifests of the same
shape; ``tests/test_kubernetes.py`` validates both against the operator's CRDs.
"""

from __future__ import annotations

import re
from typing import Any

from . import config
from ._optional import optional_import
from ._validate import check_int
from .plan import check_layout

__all__ = ["cluster_spec", "worker_group_spec"]

# A DNS-1123 label; the operator appends "-scheduler", "-default-worker-<hash>" and the like
# to the cluster name, so leave room under the 63-character limit.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def _check_name(param: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"{param} must be a lower-case DNS label of at most 40 characters "
                         f"(a-z, 0-9, '-'), got {value!r}")
    return value


def _settings(**given: Any) -> dict[str, Any]:
    """``given`` with None replaced by ``nbody.kubernetes.<key>``, checked."""
    defaults = config.get("kubernetes")
    s = {key: defaults[key.replace("_", "-")] if value is None else value
         for key, value in given.items()}
    if not s["image"] or not isinstance(s["image"], str):
        raise ValueError(
            f"image must name the container image of nbody_dask (build deploy/kubernetes/"
            f"Dockerfile and push it), got {s['image']!r}; pass image= or set "
            "nbody.kubernetes.image (DASK_NBODY__KUBERNETES__IMAGE)")
    check_int("n_workers", s["n_workers"], 0)
    check_int("worker_cpu", s["worker_cpu"], 1)
    check_int("gpus_per_worker", s["gpus_per_worker"], 0)
    check_layout(s["layout"])
    memory = s["worker_memory"]
    if not isinstance(memory, str) or not _QUANTITY.match(memory):
        raise ValueError(f"worker_memory must be a Kubernetes quantity such as '4Gi', "
                         f"got {memory!r}")
    if s["volume_claim"] is not None:
        _check_name("volume_claim", s["volume_claim"])
        if not str(s["mount_path"]).startswith("/"):
            raise ValueError(f"mount_path must be an absolute path, got {s['mount_path']!r}")
    return s


def _operator():
    return optional_import("dask_kubernetes.operator", "kubernetes", "nbody_dask.k8s")


def _worker(s: dict[str, Any], env: dict[str, str] | None) -> dict[str, Any]:
    """The ``worker`` block (replicas + pod spec) of a cluster or worker group."""
    gpus = s["gpus_per_worker"]
    command = "dask cuda worker" if gpus else "dask worker"
    resources = {"cpu": str(s["worker_cpu"]), "memory": s["worker_memory"]}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    worker = _operator().make_worker_spec(
        image=s["image"], n_workers=s["n_workers"], env=env,
        resources={"requests": dict(resources), "limits": dict(resources)},
        worker_command=command)
    container = worker["spec"]["containers"][0]
    if gpus:  # dask cuda worker: one worker process per GPU, each with one thread
        container["args"] += ["--nthreads", "1"]
    elif s["layout"] == "rows":  # one Dask thread; the parallel kernel uses the pod's cores
        container["args"] += ["--nthreads", "1", "--nworkers", "1"]
        container["env"] = [*(container.get("env") or []),
                            {"name": "NUMBA_NUM_THREADS", "value": str(s["worker_cpu"])}]
    else:
        container["args"] += ["--nthreads", str(s["worker_cpu"]), "--nworkers", "1"]
    _mount_store(worker["spec"], s)
    return _prune_nulls(worker)


def _mount_store(pod_spec: dict[str, Any], s: dict[str, Any]) -> None:
    if s["volume_claim"] is None:
        return
    pod_spec["volumes"] = [{"name": "store",
                            "persistentVolumeClaim": {"claimName": s["volume_claim"]}}]
    for container in pod_spec["containers"]:
        container["volumeMounts"] = [{"name": "store", "mountPath": s["mount_path"]}]


def _prune_nulls(node: Any) -> Any:
    """Drop ``None`` values (``make_*_spec`` emits ``env: null``), as the API server does."""
    if isinstance(node, dict):
        return {k: _prune_nulls(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_prune_nulls(v) for v in node]
    return node


def cluster_spec(
    name: str | None = None,
    *,
    image: str | None = None,
    n_workers: int | None = None,
    worker_cpu: int | None = None,
    layout: str | None = None,
    worker_memory: str | None = None,
    gpus_per_worker: int | None = None,
    volume_claim: str | None = None,
    mount_path: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A ``DaskCluster`` manifest (``kubernetes.dask.org/v1``) for an nbody_dask run.

    Parameters
    ----------
    name : str, optional
        Cluster name, a DNS label; ``nbody.kubernetes.name`` (``nbody-dask``) by default.
    image : str, optional
        Image with nbody_dask installed (``deploy/kubernetes/Dockerfile``); required, here or
        in ``nbody.kubernetes.image``.
    n_workers : int, optional
        Worker pods of the default worker group.
    worker_cpu : int, optional
        Cores per worker pod: its CPU request and limit, and the threads of its kernels.
    layout : {"rows", "pairs"}, optional
        Task layout the workers are shaped for (pass the same to :func:`nbody_dask.simulate`):
        ``"rows"`` (``nbody.kubernetes.layout``, the HPC layout), one Dask thread and a
        parallel kernel of ``worker_cpu`` threads; ``"pairs"``, ``worker_cpu`` Dask threads.
    worker_memory : str, optional
        Memory request and limit per worker pod, a Kubernetes quantity (``"4Gi"``).
    gpus_per_worker : int, optional
        ``nvidia.com/gpu`` per worker pod; above 0 the pods run ``dask cuda worker`` and the
        CUDA kernel (``backend="auto"``).
    volume_claim : str, optional
        A ReadWriteMany PersistentVolumeClaim mounted at ``mount_path`` on every worker, for
        the trajectory store; the driver must see it at the same path.
    mount_path : str, optional
        Where ``volume_claim`` is mounted (``/data``).
    env : dict, optional
        Environment variables of scheduler and workers (``DASK_NBODY__...`` overrides work).

    Returns
    -------
    dict
        The manifest, without null fields; pass it to ``KubeCluster(custom_cluster_spec=...)``
        or write it as YAML for ``kubectl apply``.
    """
    name = _check_name("name", config.get("kubernetes.name", name))
    s = _settings(image=image, n_workers=n_workers, worker_cpu=worker_cpu, layout=layout,
                  worker_memory=worker_memory, gpus_per_worker=gpus_per_worker,
                  volume_claim=volume_claim, mount_path=mount_path)
    spec = _operator().make_cluster_spec(name=name, image=s["image"], env=env)
    spec["spec"]["worker"] = _worker(s, env)
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    scheduler["args"] = ["dask", "scheduler", "--host", "0.0.0.0"]
    scheduler["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"cpu": "1", "memory": "2Gi"}}
    return _prune_nulls(spec)


def worker_group_spec(
    cluster: str | None = None,
    name: str = "gpu",
    *,
    image: str | None = None,
    n_workers: int | None = None,
    worker_cpu: int | None = None,
    layout: str | None = None,
    worker_memory: str | None = None,
    gpus_per_worker: int = 1,
    volume_claim: str | None = None,
    mount_path: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A ``DaskWorkerGroup`` manifest: more workers, GPU ones by default, for ``cluster``.

    Parameters are those of :func:`cluster_spec`; ``name`` is the group's suffix (the object
    is called ``<cluster>-<name>``) and ``gpus_per_worker`` defaults to 1. With
    ``backend="auto"`` (the default), tasks on these workers run the CUDA kernel and tasks on
    the CPU workers the CPU kernel.
    """
    cluster = _check_name("cluster", config.get("kubernetes.name", cluster))
    _check_name("name", name)
    s = _settings(image=image, n_workers=n_workers, worker_cpu=worker_cpu, layout=layout,
                  worker_memory=worker_memory, gpus_per_worker=gpus_per_worker,
                  volume_claim=volume_claim, mount_path=mount_path)
    return {"apiVersion": "kubernetes.dask.org/v1", "kind": "DaskWorkerGroup",
            "metadata": {"name": _check_name("worker group name", f"{cluster}-{name}")},
            "spec": {"cluster": cluster, "worker": _worker(s, env)}}
