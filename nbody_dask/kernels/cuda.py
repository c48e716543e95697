"""Numba CUDA tile-pair kernel, same contract as :mod:`nbody_dask.kernels.cpu`.

NVIDIA's classic N-body shape: targets in threads (``TARGETS_PER_THREAD`` each, one by
default); each block stages a tile of ``BLOCK`` sources in shared memory, synchronises,
every thread accumulates over the tile, synchronises, next tile. The last source tile is
padded with zero-mass bodies (a masked tail), so any lengths work. ``1 / r`` is the softened
law of :mod:`nbody_dask.kernels.law` compiled for the device with libdevice's ``rsqrt`` (one
special-function instruction, where ``1 / sqrt`` under ``fastmath`` is two).
Each staged chunk is summed on its own and then added to the running total (two-level
summation): in float32 over ~10^5 sources this keeps the round-off at the CPU kernel's level,
where one serial sum was far further off (docs/performance.md). float32 and float64; no
float64 literal enters the float32 kernel.

``import nbody_dask`` does not import this module, and importing it needs no GPU: kernels are
compiled on first use. (``numba.cuda`` is imported at module level because the simulator
swaps the ``cuda`` global of kernels for its own.) Without a GPU, Numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before Numba is imported) runs the same code on the CPU, one
Python thread per CUDA thread: slow, for tests of a few hundred bodies.

Device transfers (the lesson of every GPU N-body port): a step makes T^2 tile-pair tasks over
T tiles, so copying both tiles for every pair would move each tile 2T times per step.
:func:`tile_pair_forces`, which the task graph calls, keeps one device copy per host array
in :data:`DEVICE_CACHE` for as long as the host array lives (tiles are immutable: each drift
makes new arrays), so each worker copies each tile's positions once per step and the masses
once per run; only the (3, n) partial result comes back per pair. Not done: pinned host
buffers and streams to overlap the copies with compute (they need a GPU to measure).
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections import OrderedDict

import numba
import numpy as np
from numba import cuda, float32, float64

from . import law
from .shortrange import LAW_POLYNOMIALS, LAW_SPLIT, walk_constants

__all__ = ["BLOCK", "TARGETS_PER_THREAD", "SIMULATOR_SHAPE", "VARIANTS", "available",
           "accel_tile", "accel_potential_tile", "tile_pair_forces", "tile_pair_rate_forces",
           "short_pair_forces",
           "DeviceCache",
           "DEVICE_CACHE"]

#: Threads per block, and sources staged in shared memory per pass (default). With
#: :data:`TARGETS_PER_THREAD` the fastest shape measured on an H200 (docs/performance.md).
BLOCK = 256
#: Target bodies per thread (default): each source read from shared memory serves this many.
#: 8 fit in registers; 16 spill.
TARGETS_PER_THREAD = 8
#: The default launch shape under Numba's simulator, which runs a Python thread per CUDA
#: thread: a small block keeps simulated runs fast (every shape of :data:`VARIANTS` is still
#: checked there explicitly).
SIMULATOR_SHAPE = (32, 1)
#: Launch shapes ``nbody-dask bench --backend cuda`` compares: (block, targets per thread).
VARIANTS = ((128, 1), (256, 1), (512, 1), (128, 2), (256, 2), (64, 4), (128, 4), (256, 4),
            (64, 8), (128, 8), (256, 8))


def available() -> bool:
    """True when Numba can run CUDA kernels here (a GPU, or the simulator)."""
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver counts as no GPU
        return False


def _reciprocal_sqrt(dtype_name: str):
    """The device's reciprocal square root ``(x, one) -> 1 / sqrt(x)`` (one special-function
    instruction on a GPU), as :func:`nbody_dask.kernels.law.compile_for` wants it.

    Numba's simulator has no libdevice, so there the same value comes from ``1 / sqrt``.
    """
    if numba.config.ENABLE_CUDASIM:
        return cuda.jit(device=True)(lambda x, one: one / math.sqrt(x))
    from numba.cuda import libdevice

    rsqrt = libdevice.rsqrtf if dtype_name == "float32" else libdevice.rsqrt
    return cuda.jit(device=True, inline=True, fastmath=True)(lambda x, one: rsqrt(x))


@functools.cache
def _inverse_distance(dtype_name: str):
    """The softened law of :mod:`nbody_dask.kernels.law`, as an inlined device function."""
    return law.compile_for(cuda.jit(device=True, inline=True, fastmath=True),
                           _reciprocal_sqrt(dtype_name))


@functools.cache
def _short_range_factors():
    """TreePM's pair law, :func:`nbody_dask.kernels.law.polynomial_long_range`'s and
    :func:`~nbody_dask.kernels.law.fast_short_range`'s own sources as inlined device
    functions (arithmetic only: the same on every target)."""
    jit = cuda.jit(device=True, inline=True, fastmath=True)
    return jit(law.polynomial_long_range.py_func), jit(law.fast_short_range.py_func)


@functools.cache
def _kernel(dtype_name: str, with_potential: bool, block: int, per_thread: int,
            short: bool = False, rate: bool = False):
    """Compile (once per process and variant) the tile-pair kernel.

    Block ``b`` covers ``b * per_thread`` targets: thread ``t`` takes targets
    ``t, t + b, ...`` (coalesced loads and stores), keeping their sums in registers, so each
    source staged in shared memory is read once for ``per_thread`` interactions.
    ``with_potential`` is a compile-time constant: the acceleration-only kernel does no
    potential arithmetic. With ``short`` (also compile-time), TreePM's short range
    (:func:`short_pair_forces`): each pair at its minimum image in the periodic box, with
    the CPU pairs' law (Newton's less the long range, or Newton's times the split factors
    beyond the polynomials' cutoff), pairs beyond the cutoff or at ``r = 0`` dropped;
    ``constants`` is then :func:`~nbody_dask.kernels.shortrange.walk_constants`, in the
    run's dtype (the pairs' polynomials where it has them, as on the CPU). With ``rate``
    (compile-time, not with ``short``), individual time steps' pairwise criterion as
    :func:`nbody_dask.kernels.cpu.accel_rate_tile`: ``pt`` has the targets' masses as a
    fourth row, ``own`` each target's index among the sources (-1: none; its self term
    enters the potential with zero mass), and a last row of ``out`` the sum of the squared
    pairwise rates (sources at the target's very position left out).
    """
    ftype = {"float32": float32, "float64": float64}[dtype_name]
    inverse_distance = _inverse_distance(dtype_name)
    long_range_terms, split_factors = _short_range_factors()

    @cuda.jit(device=True, inline=True, fastmath=True)
    def nearest(d, box, half):
        """``d`` moved by a box length into [-box/2, box/2] (``|d| < box``: wrapped
        positions)."""
        d = d - box if d > half else d
        return d + box if d < -half else d

    @cuda.jit(fastmath=True)
    def tile_pair(pt, ps, ms, eps2, diagonal, constants, own, out):
        sx = cuda.shared.array(block, ftype)
        sy = cuda.shared.array(block, ftype)
        sz = cuda.shared.array(block, ftype)
        sm = cuda.shared.array(block, ftype)
        xi = cuda.local.array(per_thread, ftype)
        yi = cuda.local.array(per_thread, ftype)
        zi = cuda.local.array(per_thread, ftype)
        ax = cuda.local.array(per_thread, ftype)
        ay = cuda.local.array(per_thread, ftype)
        az = cuda.local.array(per_thread, ftype)
        phi = cuda.local.array(per_thread, ftype)
        cx = cuda.local.array(per_thread, ftype)
        cy = cuda.local.array(per_thread, ftype)
        cz = cuda.local.array(per_thread, ftype)
        cphi = cuda.local.array(per_thread, ftype)
        mt = cuda.local.array(per_thread, ftype)
        rate2 = cuda.local.array(per_thread, ftype)
        crate = cuda.local.array(per_thread, ftype)
        mine = cuda.local.array(per_thread, numba.int64)
        tid = cuda.threadIdx.x
        first = cuda.blockIdx.x * block * per_thread + tid
        nt = pt.shape[1]
        ns = ps.shape[1]
        zero = ftype(0)
        one = ftype(1)
        if short:
            box = constants[0]
            half = box / (one + one)
            cut2 = constants[2] * constants[2]
            split = constants[LAW_SPLIT:LAW_POLYNOMIALS]
            poly = constants[LAW_POLYNOMIALS:]
            polynomial = poly[0] > zero
        for p in range(per_thread):
            i = first + p * block
            active = i < nt  # inactive lanes compute on a dummy target and store nothing
            xi[p] = pt[0, i] if active else zero
            yi[p] = pt[1, i] if active else zero
            zi[p] = pt[2, i] if active else zero
            ax[p] = zero
            ay[p] = zero
            az[p] = zero
            phi[p] = zero
            if rate:
                mt[p] = pt[3, i] if active else zero
                mine[p] = own[i] if active else -1
                rate2[p] = zero
        for base in range(0, ns, block):
            j = base + tid
            if j < ns:
                sx[tid] = ps[0, j]
                sy[tid] = ps[1, j]
                sz[tid] = ps[2, j]
                sm[tid] = ms[j]
            else:  # masked tail: a massless source contributes nothing
                sx[tid] = zero
                sy[tid] = zero
                sz[tid] = zero
                sm[tid] = zero
            cuda.syncthreads()
            for p in range(per_thread):
                cx[p] = zero
                cy[p] = zero
                cz[p] = zero
                cphi[p] = zero
                if rate:
                    crate[p] = zero
            for k in range(block):
                xs = sx[k]
                ys = sy[k]
                zs = sz[k]
                mk = sm[k]
                for p in range(per_thread):
                    dx = xs - xi[p]
                    dy = ys - yi[p]
                    dz = zs - zi[p]
                    if short:
                        dx = nearest(dx, box, half)
                        dy = nearest(dy, box, half)
                        dz = nearest(dz, box, half)
                        r2 = dx * dx + dy * dy + dz * dz
                        mass = mk if (r2 > zero) and (r2 <= cut2) else zero
                        inv = inverse_distance(dx, dy, dz, eps2, zero, one)
                        if polynomial:  # Newton's less the long range
                            lf, le = long_range_terms(r2, poly, one)
                            s = mass * (inv * inv * inv - lf)
                            e = mass * (inv - le)
                        else:
                            g, e, _ = split_factors(math.sqrt(r2), split, one)
                            s = mass * g * inv * inv * inv
                            e = mass * e * inv
                        cx[p] += s * dx
                        cy[p] += s * dy
                        cz[p] += s * dz
                        if with_potential:
                            cphi[p] -= e
                        continue
                    inv = inverse_distance(dx, dy, dz, eps2, zero, one)
                    if rate:
                        inv3 = inv * inv * inv
                        s = mk * inv3
                        cx[p] += s * dx
                        cy[p] += s * dy
                        cz[p] += s * dz
                        if with_potential:
                            cphi[p] -= (zero if base + k == mine[p] else mk) * inv
                        d2 = dx * dx + dy * dy + dz * dz
                        pair = (mt[p] + mk if (d2 > zero) and (base + k < ns) else zero) * inv3
                        crate[p] += pair * pair
                        continue
                    mi = mk * inv
                    if with_potential and diagonal and base + k == first + p * block:
                        mi = zero  # the self term: left out, not subtracted afterwards
                    s = mi * inv * inv
                    cx[p] += s * dx
                    cy[p] += s * dy
                    cz[p] += s * dz
                    if with_potential:
                        cphi[p] -= mi
            for p in range(per_thread):  # one staged chunk's sum joins the running total
                ax[p] += cx[p]
                ay[p] += cy[p]
                az[p] += cz[p]
                phi[p] += cphi[p]
                if rate:
                    rate2[p] += crate[p]
            cuda.syncthreads()
        for p in range(per_thread):
            i = first + p * block
            if i < nt:
                out[0, i] = ax[p]
                out[1, i] = ay[p]
                out[2, i] = az[p]
                if with_potential:
                    out[3, i] = phi[p]
                if rate:
                    out[out.shape[0] - 1, i] = rate2[p]

    return tile_pair


class DeviceCache:
    """Device copies of host arrays, each kept while its host array is alive (LRU-bounded).

    Keyed by the host array's identity; a weak reference tells a live entry from a recycled
    ``id``, and drops the entry when the host array is freed. Arrays must not be modified in
    place after their first use (nbody_dask's tiles never are). Thread-safe.

    Parameters
    ----------
    max_bytes : int
        Device memory the cache may hold; least recently used copies go first.
    """

    def __init__(self, max_bytes: int = 2 << 30) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[int, int], tuple[weakref.ref, object, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, host: np.ndarray, *more: np.ndarray):
        """The device copy of ``host`` (copied now if not cached); with ``more`` arrays of
        its length, of ``host`` and those stacked as rows (a tree's coordinates, say), kept
        while ``host`` lives (the rows must not change while it does)."""
        key = (id(host), len(more))  # host alone and host stacked are different copies
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0]() is host:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[1]
        device = cuda.to_device(np.stack([host, *more]) if more else
                                np.ascontiguousarray(host))
        with self._lock:
            self.misses += 1
            self._drop(key)
            ref = weakref.ref(host, lambda r, k=key: self._forget(k, r))
            nbytes = host.nbytes * (1 + len(more))
            self._entries[key] = (ref, device, nbytes)
            self.nbytes += nbytes
            while self.nbytes > self.max_bytes and len(self._entries) > 1:
                self._drop(next(iter(self._entries)))
        return device

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def _drop(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry[2]

    def _forget(self, key: tuple[int, int], ref: weakref.ref) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is ref:  # not a newer array with the same id
                self._drop(key)


#: The process's cache of device copies of tiles (see :class:`DeviceCache`).
DEVICE_CACHE = DeviceCache()


def _run(d_target, d_source, d_mass, nt: int, ns: int, dtype: np.dtype, eps2,
         with_potential: bool, diagonal: bool, block: int | None = None,
         per_thread: int | None = None, constants: np.ndarray | None = None,
         own: np.ndarray | None = None) -> np.ndarray:
    simulated = numba.config.ENABLE_CUDASIM
    block = block or (SIMULATOR_SHAPE[0] if simulated else BLOCK)
    per_thread = per_thread or (SIMULATOR_SHAPE[1] if simulated else TARGETS_PER_THREAD)
    rate = own is not None
    rows = (4 if with_potential else 3) + rate
    if nt == 0 or ns == 0:
        return np.zeros((rows, nt), dtype=dtype)
    d_out = cuda.device_array((rows, nt), dtype=dtype)
    blocks = math.ceil(nt / (block * per_thread))
    short = constants is not None
    d_constants = cuda.to_device(np.asarray(constants if short else [0], dtype=dtype))
    d_own = cuda.to_device(np.asarray(own, dtype=np.int64)) if rate else _no_own()
    _kernel(dtype.name, bool(with_potential), block, per_thread, short, rate)[blocks, block](
        d_target, d_source, d_mass, dtype.type(eps2), diagonal, d_constants, d_own, d_out)
    return d_out.copy_to_host()


@functools.cache
def _no_own():
    """The ``own`` argument of the kernels without ``rate``, which never read it: copied to
    the device once, not at every launch."""
    return cuda.to_device(np.full(1, -1, dtype=np.int64))


def tile_pair_forces(target_position: np.ndarray, source_position: np.ndarray,
                     source_mass: np.ndarray, eps2, with_potential: bool,
                     diagonal: bool = False, *, block: int | None = None,
                     per_thread: int | None = None) -> np.ndarray:
    """Partial forces (3 or 4, nt) of a tile pair from (3, n) position arrays, on the GPU.

    The inputs' device copies come from :data:`DEVICE_CACHE`, so a tile used by many pair
    tasks on this worker is copied to the device once. ``block`` and ``per_thread`` choose
    the launch shape (default :data:`BLOCK`, :data:`TARGETS_PER_THREAD`).
    """
    get = DEVICE_CACHE.get
    return _run(get(target_position), get(source_position), get(source_mass),
                target_position.shape[1], source_position.shape[1],
                np.result_type(target_position), eps2, with_potential, bool(diagonal),
                block, per_thread)


def tile_pair_rate_forces(target_position: np.ndarray, target_mass: np.ndarray,
                          own: np.ndarray, source_position: np.ndarray,
                          source_mass: np.ndarray, eps2, with_potential: bool, *,
                          block: int | None = None, per_thread: int | None = None
                          ) -> np.ndarray:
    """Partial forces of a tile pair and the pairs' rates, (4 or 5, nt), on the GPU: the
    contract of :func:`nbody_dask.kernels.cpu.accel_rate_tile` (``own``: each target's index
    among the sources, -1 where it is not one), from (3, n) position arrays. The targets'
    positions and masses go to the device together (the active bodies of a tick are new
    arrays each time); the sources' copies come from :data:`DEVICE_CACHE`."""
    get = DEVICE_CACHE.get
    d_target = cuda.to_device(np.vstack([target_position, target_mass[None, :]]))
    return _run(d_target, get(source_position), get(source_mass),
                target_position.shape[1], source_position.shape[1],
                np.result_type(target_position), eps2, with_potential, False, block,
                per_thread, own=np.asarray(own, dtype=np.int64))


def short_pair_forces(target: tuple, source: tuple, source_mass: np.ndarray, eps2,
                      box: float, split: float, cutoff: float, with_potential: bool, *,
                      block: int | None = None, per_thread: int | None = None) -> np.ndarray:
    """TreePM's short-range partial forces (3 or 4, nt) of a tile pair in a periodic cube
    of side ``box``, on the GPU: every pair summed at its minimum image with the short-range
    law of scale ``split`` (``r_s``), pairs beyond ``cutoff`` (``< box / 2``) or at
    ``r = 0`` dropped, as :func:`nbody_dask.kernels.shortrange.short_p2p` on the CPU.
    ``target`` and ``source`` are ``(x, y, z)`` arrays (a tree's sorted coordinates),
    wrapped into ``[0, box)``; their device copies are kept in :data:`DEVICE_CACHE` while
    their ``x`` lives."""
    dtype = np.result_type(target[0])
    constants = walk_constants(box, split, cutoff, dtype)
    get = DEVICE_CACHE.get
    return _run(get(*target), get(*source), get(source_mass), target[0].shape[0],
                source[0].shape[0], dtype, eps2, with_potential, False, block, per_thread,
                constants)


def _uncached(xt, yt, zt, xs, ys, zs, ms, eps2, with_potential: bool, diagonal: bool,
              block: int | None = None, per_thread: int | None = None):
    target, source = np.stack([xt, yt, zt]), np.stack([xs, ys, zs])
    return _run(cuda.to_device(target), cuda.to_device(source),
                cuda.to_device(np.ascontiguousarray(ms)), target.shape[1], source.shape[1],
                np.result_type(xt), eps2, with_potential, diagonal, block, per_thread)


def accel_tile(xt, yt, zt, xs, ys, zs, ms, eps2):
    """Partial accelerations (3, nt) of targets due to sources (G = 1), on the GPU."""
    return _uncached(xt, yt, zt, xs, ys, zs, ms, eps2, False, False)


def accel_potential_tile(xt, yt, zt, xs, ys, zs, ms, eps2, diagonal):
    """Partial accelerations and potentials (4, nt), as the CPU kernel of the same name."""
    return _uncached(xt, yt, zt, xs, ys, zs, ms, eps2, True, bool(diagonal))
