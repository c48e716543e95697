"""Which kernel a tile-pair task runs: the Numba CPU kernel or the Numba CUDA kernel.

``backend="cpu"`` always runs the CPU kernel; ``"cuda"`` requires every worker to have a GPU
(dask-cuda's ``LocalCUDACluster``, ``dask cuda worker``, or any worker where
``numba.cuda.is_available()``); ``"auto"`` runs the CUDA kernel on workers that have a GPU and
the CPU kernel elsewhere. Results are bit-reproducible for a fixed backend and tile size; on a
cluster that mixes GPU and CPU workers under ``"auto"`` they depend on which worker ran which
task (the kernels round differently), while staying within float round-off.
"""

from __future__ import annotations

import functools
from types import ModuleType

from distributed import Client

__all__ = ["worker_has_gpu", "cluster_backend", "tile_kernels"]


@functools.lru_cache(maxsize=1)
def worker_has_gpu() -> bool:
    """True in a process that can run Numba CUDA kernels (checked once per process)."""
    from .kernels.cuda import available

    return available()


def cluster_backend(client: Client, backend: str) -> str:
    """The backend to plan with on this cluster: ``"cpu"``, ``"cuda"`` or ``"auto"`` (mixed).

    Raises
    ------
    RuntimeError
        If ``backend == "cuda"`` and a worker has no GPU, naming how many.
    """
    if backend == "cpu":
        return "cpu"
    has_gpu = client.run(worker_has_gpu)
    n_gpu = sum(has_gpu.values())
    if backend == "cuda" and n_gpu < len(has_gpu):
        raise RuntimeError(
            f"backend='cuda' needs a CUDA GPU on every worker, but "
            f"{len(has_gpu) - n_gpu} of {len(has_gpu)} worker(s) have none "
            "(numba.cuda.is_available() is False there); use backend='cpu' or 'auto', or "
            "start GPU workers (dask-cuda)")
    if n_gpu == 0:
        return "cpu"
    return "cuda" if n_gpu == len(has_gpu) else "auto"


def tile_kernels(backend: str) -> ModuleType:
    """The kernel module a task on this worker uses for ``backend``."""
    if backend == "cuda" or (backend == "auto" and worker_has_gpu()):
        from .kernels import cuda

        return cuda
    from .kernels import cpu

    return cpu
