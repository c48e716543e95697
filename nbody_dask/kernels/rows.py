"""The parallel CPU kernel of the ``"rows"`` layout: one target tile against every source tile.

One call computes a whole row of tile pairs on all the cores of a node (Numba ``prange``).
The work is cut into blocks of one source tile and :data:`TARGET_BLOCK` targets, and every
block runs the serial kernel of :mod:`nbody_dask.kernels.cpu` on its slice. A target's sum
over a source tile therefore runs in one thread, in source order, with the same register
blocking (blocks are a multiple of 4 targets, so the remainder targets fall where they do in
the serial kernel): the result is bit-identical to the serial kernel for any thread count.

Dask may call this from several threads of one process: see :mod:`nbody_dask.kernels` for the
thread-safe threading layer it runs on.
"""

from __future__ import annotations

import os

import numba
import numpy as np
from numba import njit, prange

from .cpu import accel_potential_tile, accel_rate_tile, accel_tile

__all__ = ["TARGET_BLOCK", "row_forces", "rate_forces", "set_threads"]

#: Targets per block (a multiple of the serial kernel's register blocking, 4).
TARGET_BLOCK = 128


@njit(parallel=True, nogil=True, cache=True)
def row_forces(xt, yt, zt, xs, ys, zs, ms, starts, eps2, with_potential, diagonal):
    """Partial forces on a target tile from each source tile (G = 1).

    Parameters
    ----------
    xt, yt, zt : ndarray, shape (nt,)
        Target positions.
    xs, ys, zs, ms : ndarray, shape (ns,)
        Positions and masses of all source tiles, concatenated.
    starts : ndarray of int64, shape (T + 1,)
        Source tile ``j`` is ``starts[j]:starts[j + 1]``.
    eps2 : float32 or float64
        Squared softening, in the arrays' dtype.
    with_potential : bool
        Also the potential (row 3).
    diagonal : int
        Index of the source tile that is the target tile (its self terms are left out of
        the potential), or -1.

    Returns
    -------
    ndarray, shape (T, 3 or 4, nt)
        Entry ``j`` equals the serial kernel's result for the pair (target, source tile j).
    """
    nt = xt.shape[0]
    n_sources = starts.shape[0] - 1
    n_blocks = (nt + TARGET_BLOCK - 1) // TARGET_BLOCK
    out = np.empty((n_sources, 4 if with_potential else 3, nt), dtype=xt.dtype)
    for k in prange(n_sources * n_blocks):
        j = k // n_blocks
        lo = (k % n_blocks) * TARGET_BLOCK
        hi = min(nt, lo + TARGET_BLOCK)
        a = starts[j]
        b = starts[j + 1]
        if with_potential:
            out[j, :, lo:hi] = accel_potential_tile(xt[lo:hi], yt[lo:hi], zt[lo:hi], xs[a:b],
                                                    ys[a:b], zs[a:b], ms[a:b], eps2,
                                                    j == diagonal, lo)
        else:
            out[j, :, lo:hi] = accel_tile(xt[lo:hi], yt[lo:hi], zt[lo:hi], xs[a:b], ys[a:b],
                                          zs[a:b], ms[a:b], eps2)
    return out


@njit(parallel=True, nogil=True, cache=True)
def rate_forces(xt, yt, zt, mt, own, xs, ys, zs, ms, eps2, with_potential):
    """:func:`~nbody_dask.kernels.cpu.accel_rate_tile` on all the cores: blocks of
    :data:`TARGET_BLOCK` targets in parallel, each with the serial kernel, so the result is
    bit-identical to it for any thread count."""
    nt = xt.shape[0]
    n_blocks = (nt + TARGET_BLOCK - 1) // TARGET_BLOCK
    out = np.empty((5 if with_potential else 4, nt), dtype=xt.dtype)
    for k in prange(n_blocks):
        lo = k * TARGET_BLOCK
        hi = min(nt, lo + TARGET_BLOCK)
        out[:, lo:hi] = accel_rate_tile(xt[lo:hi], yt[lo:hi], zt[lo:hi], mt[lo:hi],
                                        own[lo:hi], xs, ys, zs, ms, eps2, with_potential)
    return out


def set_threads(threads: int | None) -> None:
    """Threads of the next :func:`row_forces` call in this thread.

    None: every core this process may run on (its CPU affinity, which Slurm and container
    runtimes set to the job's cores), at most ``NUMBA_NUM_THREADS``.
    """
    most = numba.config.NUMBA_NUM_THREADS
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else most
    numba.set_num_threads(max(1, min(int(threads), most)))
