"""Numeric kernels: pure Numba functions on structure-of-arrays, no Dask.

Threading layer: Dask may call a parallel kernel (:mod:`~nbody_dask.kernels.rows`,
:mod:`~nbody_dask.kernels.tree`) from several threads of one process (an in-process
cluster), and Numba's default ``workqueue`` layer aborts the process on concurrent parallel
calls. Unless ``NUMBA_THREADING_LAYER`` is set, importing this package asks Numba for a
thread-safe layer (``omp`` or ``tbb``), which takes effect if no parallel Numba code ran in
the process before.
"""

import os

import numba

if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "threadsafe"
