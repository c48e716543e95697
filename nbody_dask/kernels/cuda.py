"""Numba CUDA tile-pair kernel, same contract as :mod:`nbody_dask.kernels.cpu`.

NVIDIA's classic N-body shape: one thread per target body; each block stages a tile of
``BLOCK`` sources in shared memory, synchronises, every thread accumulates over the tile,
synchronises, next tile. The last source tile is padded with zero-mass bodies (a masked
tail), so any lengths work. ``fastmath`` lets ``1 / sqrt`` compile to the hardware
reciprocal square root. float32 and float64; no float64 literal enters the float32 kernel.

``import nbody_dask`` does not import this module, and importing it needs no GPU: kernels are
compiled on first use. (``numba.cuda`` is imported at module level because the simulator
swaps the ``cuda`` global of kernels for its own.) Without a GPU, Numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before Numba is imported) runs the same code on the CPU, one
Python thread per CUDA thread: slow, for tests of a few hundred bodies.

Not yet done (needs a GPU to measure): device buffers reused across tasks, pinned host
memory and streams; today each call copies its tile pair to the device and back.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, float64

__all__ = ["BLOCK", "available", "accel_tile", "accel_potential_tile"]

#: Threads per block, and sources staged in shared memory per pass.
BLOCK = 128


def available() -> bool:
    """True when Numba can run CUDA kernels here (a GPU, or the simulator)."""
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver counts as no GPU
        return False


@functools.cache
def _kernel(dtype_name: str):
    """Compile (once per process and dtype) the tile-pair kernel."""
    ftype = {"float32": float32, "float64": float64}[dtype_name]

    @cuda.jit(fastmath=True)
    def tile_pair(xt, yt, zt, xs, ys, zs, ms, eps2, with_potential, diagonal, out):
        sx = cuda.shared.array(BLOCK, ftype)
        sy = cuda.shared.array(BLOCK, ftype)
        sz = cuda.shared.array(BLOCK, ftype)
        sm = cuda.shared.array(BLOCK, ftype)
        i = cuda.grid(1)
        tid = cuda.threadIdx.x
        nt = xt.shape[0]
        ns = xs.shape[0]
        zero = ftype(0)
        one = ftype(1)
        active = i < nt
        xi = xt[i] if active else zero
        yi = yt[i] if active else zero
        zi = zt[i] if active else zero
        ax = zero
        ay = zero
        az = zero
        phi = zero
        for base in range(0, ns, BLOCK):
            j = base + tid
            if j < ns:
                sx[tid] = xs[j]
                sy[tid] = ys[j]
                sz[tid] = zs[j]
                sm[tid] = ms[j]
            else:  # masked tail: a massless source contributes nothing
                sx[tid] = zero
                sy[tid] = zero
                sz[tid] = zero
                sm[tid] = zero
            cuda.syncthreads()
            if active:
                for k in range(BLOCK):
                    dx = sx[k] - xi
                    dy = sy[k] - yi
                    dz = sz[k] - zi
                    r2 = dx * dx + dy * dy + dz * dz + eps2
                    inv = one / math.sqrt(r2) if r2 > zero else zero
                    mi = sm[k] * inv
                    s = mi * inv * inv
                    ax += s * dx
                    ay += s * dy
                    az += s * dz
                    phi -= mi
            cuda.syncthreads()
        if active:
            out[0, i] = ax
            out[1, i] = ay
            out[2, i] = az
            if with_potential:
                if diagonal and eps2 > zero:
                    phi += ms[i] / math.sqrt(eps2)  # remove the self term -m_i / eps
                out[3, i] = phi

    return tile_pair


def _launch(xt, yt, zt, xs, ys, zs, ms, eps2, with_potential: bool, diagonal: bool):
    dtype = np.result_type(xt)
    nt = xt.shape[0]
    out = np.zeros((4 if with_potential else 3, nt), dtype=dtype)
    if nt == 0 or xs.shape[0] == 0:
        return out
    blocks = (nt + BLOCK - 1) // BLOCK
    d_out = cuda.to_device(out)
    args = [cuda.to_device(np.ascontiguousarray(a)) for a in (xt, yt, zt, xs, ys, zs, ms)]
    _kernel(dtype.name)[blocks, BLOCK](*args, dtype.type(eps2), with_potential, diagonal,
                                       d_out)
    return d_out.copy_to_host()


def accel_tile(xt, yt, zt, xs, ys, zs, ms, eps2):
    """Partial accelerations (3, nt) of targets due to sources (G = 1), on the GPU."""
    return _launch(xt, yt, zt, xs, ys, zs, ms, eps2, False, False)


def accel_potential_tile(xt, yt, zt, xs, ys, zs, ms, eps2, diagonal):
    """Partial accelerations and potentials (4, nt), as the CPU kernel of the same name."""
    return _launch(xt, yt, zt, xs, ys, zs, ms, eps2, True, bool(diagonal))
