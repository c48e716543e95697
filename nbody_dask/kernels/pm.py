"""The particle mesh of TreePM: deposit, Poisson by FFT, interpolation (no Dask).

The long-range part of gravity in a periodic cube of side ``L`` (the potential
``erf(r / 2 r_s) / r`` of every body and all its images, the mean density subtracted) is
smooth on scales of ``r_s``, so a mesh of ``n`` cells per side (``h = L / n``, ``r_s`` a few
``h``) carries it:

1. each tile deposits its mass with triangular-shaped-cloud (TSC, 27 points) or
   cloud-in-cell (CIC, 8 points) weights on the mesh points ``i h`` around each body
   (:func:`deposit`: a region of the mesh that covers the tile's bodies, the tile's
   *partial mesh*); partial meshes are added in a fixed order (:func:`mesh_sum`);
2. :func:`long_range` solves Poisson's equation by FFT (``scipy.fft``): the potential's
   transform ``4 pi exp(-k^2 r_s^2) / k^2`` times the density's, divided by the
   assignment's window twice (once for the deposit, once for the interpolation), and the
   accelerations by spectral differentiation ``i k`` (the Nyquist plane's derivative set to
   zero, so the gradient is real and odd);
3. each tile interpolates the accelerations (and the potential) back with the same
   weights (:func:`interpolate`).

TreePM uses TSC: at the same mesh its deconvolved long-range force is about 8 times more
accurate than CIC's (median 4.8e-4 against 3.7e-3 of the total force, 8,000 random bodies,
r_s = 1.25 cells; tests/test_periodic.py checks 3x), for a deposit and an interpolation
that cost little beside the short range. The same weights out and in and an odd gradient
make the mesh force between two bodies equal and opposite: the total momentum is conserved
to round-off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.fft
import numba
from numba import njit, prange

__all__ = ["Region", "LongRange", "POINTS", "cell_span", "deposit", "mesh_sum", "wave_numbers",
           "green_function", "gradient", "long_range", "interpolate", "interpolate_planes",
           "span_pieces", "potential_offset", "slab_sum", "overlaps"]


@dataclass(frozen=True)
class Region:
    """A tile's partial mesh: ``values`` on the mesh points ``start + index`` (modulo the
    mesh size) along each axis."""

    start: tuple[int, int, int]
    values: np.ndarray


@dataclass(frozen=True)
class LongRange:
    """The solved mesh: accelerations (and the potential) on every mesh point, shape (3 or 4,
    n, n, n), and the total mass (for the potential's background term)."""

    fields: np.ndarray
    total_mass: float


def cell_span(coordinate: np.ndarray, inv_h: float, n: int, points: int) -> tuple[int, int]:
    """The first mesh point and the number of points that the weights (``points`` per
    axis) of these coordinates touch along one axis (the whole axis, from 0, when they
    would wrap onto themselves)."""
    if coordinate.size == 0:
        return 0, 1
    u = coordinate.astype(np.float64) * inv_h
    first = np.floor(u) if points == 2 else np.floor(u + 0.5) - 1
    lo, hi = int(first.min()), int(first.max()) + points - 1
    if hi - lo + 1 >= n:
        return 0, n
    return lo, hi - lo + 1


#: Mesh points per axis that a body's weights touch, by assignment.
POINTS = {"cic": 2, "tsc": 3}


@njit(cache=True)
def _weights(u, points, index, weight, offset):
    """The mesh points (from the first, unwrapped) and weights of coordinate ``u`` (in cells)
    for CIC (``points == 2``) or TSC (3), into ``index[offset:]`` and ``weight[offset:]``."""
    if points == 2:
        cell = math.floor(u)
        f = u - cell
        index[offset], index[offset + 1] = cell, cell + 1
        weight[offset], weight[offset + 1] = 1.0 - f, f
    else:
        cell = math.floor(u + 0.5)
        f = u - cell
        index[offset], index[offset + 1], index[offset + 2] = cell - 1, cell, cell + 1
        weight[offset] = 0.5 * (0.5 - f) ** 2
        weight[offset + 1] = 0.75 - f * f
        weight[offset + 2] = 0.5 * (0.5 + f) ** 2


@njit(cache=True)
def _body_weights(x, y, z, i, inv_h, points, index, weight):
    """Body ``i``'s mesh points (unwrapped) and weights along the three axes into ``index``
    and ``weight`` (``points`` per axis, axis after axis)."""
    for a in range(3):
        v = float(x[i]) if a == 0 else (float(y[i]) if a == 1 else float(z[i]))
        _weights(v * inv_h, points, index, weight, a * points)


#: The most bytes of float64 sums a chunk of a deposit's planes holds before it rounds them
#: into the region in the run's dtype: the region in float64 would double a float32
#: deposit's memory (a half-mesh region at 512^3 is 537 MiB in float64).
DEPOSIT_SCRATCH_BYTES = 128 * 2**20


@njit(cache=True, parallel=True)
def _deposit(x, y, z, m, inv_h, n, start, shape, points, out, chunks):
    """Assign the weights of the bodies to ``out`` (``shape``, in the run's dtype), whose
    point ``(a, b, c)`` is mesh point ``start + (a, b, c)``; an axis as long as the mesh
    takes the mesh point modulo ``n``.

    ``chunks`` of the planes of the first axis run on Numba's threads: each adds every
    body's weights on its planes, in body order, in float64, then rounds them into ``out``,
    so every point sums its terms in the same order for any number of chunks and threads."""
    planes = shape[0]
    chunks = min(planes, chunks)
    for chunk in prange(chunks):
        lo, hi = chunk * planes // chunks, (chunk + 1) * planes // chunks
        sums = np.zeros((hi - lo, shape[1], shape[2]))
        index = np.empty(3 * points, dtype=np.int64)
        weight = np.empty(3 * points)
        for i in range(x.shape[0]):
            _weights(float(x[i]) * inv_h, points, index, weight, 0)
            mine = False
            for s in range(points):
                point = index[s] - start[0]
                index[s] = point % n if planes == n else point
                mine |= (index[s] >= lo) & (index[s] < hi)
            if not mine:
                continue
            for a in range(1, 3):
                v = float(y[i]) if a == 1 else float(z[i])
                _weights(v * inv_h, points, index, weight, a * points)
                for s in range(points):
                    point = index[a * points + s] - start[a]
                    index[a * points + s] = point % n if shape[a] == n else point
            mi = float(m[i])
            for s in range(points):
                if index[s] < lo or index[s] >= hi:
                    continue
                for t in range(points):
                    w = mi * weight[s] * weight[points + t]
                    for u in range(points):
                        sums[index[s] - lo, index[points + t], index[2 * points + u]] += (
                            w * weight[2 * points + u])
        out[lo:hi] = sums


def deposit(position: np.ndarray, mass: np.ndarray, box: float, n: int,
            assignment: str = "cic") -> Region:
    """A tile's partial mesh: the mass of its bodies (in the positions' dtype) assigned with
    ``assignment`` weights (``"cic"`` or ``"tsc"``) on the region of an ``n``-cube mesh of
    side ``box`` that they touch."""
    points = POINTS[assignment]
    inv_h = n / box
    spans = [cell_span(position[a], inv_h, n, points) for a in range(3)]
    start = tuple(lo for lo, _ in spans)
    shape = tuple(size for _, size in spans)
    out = np.empty(shape, dtype=position.dtype)
    # chunks of planes for the threads, and more where a chunk's float64 sums would be big
    chunks = max(2 * numba.get_num_threads(),
                 -(-shape[0] * shape[1] * shape[2] * 8 // DEPOSIT_SCRATCH_BYTES))
    _deposit(position[0], position[1], position[2], mass, inv_h, n,
             np.array(start, dtype=np.int64), np.array(shape, dtype=np.int64), points, out,
             chunks)
    return Region(start, out)


def mesh_sum(n: int, dtype: str, *parts: Region | np.ndarray) -> np.ndarray:
    """The sum of partial meshes (:class:`Region` s or whole meshes) in the order given, on
    the whole ``n``-cube mesh in ``dtype``: :func:`slab_sum` of every plane."""
    return slab_sum(n, dtype, 0, n, *parts)


def wave_numbers(n: int, box: float, dtype: type, where: tuple) -> tuple[np.ndarray, ...]:
    """The angular wave numbers ``(kx, ky, kz)`` of the points ``where`` (a ``(lo, hi)``
    range an axis) of the real FFT's spectrum of an ``n``-cube of side ``box`` (``rfftfreq``
    along the last axis), in ``dtype``, shaped to broadcast against each other."""
    h = box / n
    full = (scipy.fft.fftfreq(n, h), scipy.fft.fftfreq(n, h), scipy.fft.rfftfreq(n, h))
    return tuple((freq * 2 * np.pi)[lo:hi].astype(dtype).reshape(
        [-1 if a == axis else 1 for a in range(3)])
        for axis, (freq, (lo, hi)) in enumerate(zip(full, where, strict=True)))


def green_function(k: tuple[np.ndarray, ...], n: int, box: float, split: float,
                   assignment: str) -> np.ndarray:
    """The long-range Green's function on the wave numbers ``k`` (:func:`wave_numbers`):
    ``4 pi exp(-k^2 r_s^2) / k^2`` per mesh cell volume, divided by the assignment's window
    twice (once for the deposit, once for the interpolation); zero at ``k = 0`` (the mean
    density is subtracted)."""
    kx, ky, kz = k
    ftype = kx.dtype.type
    h = box / n
    k2 = kx * kx + ky * ky + kz * kz
    origin = k2 == 0
    k2 = np.where(origin, ftype(1), k2)

    def window(q: np.ndarray) -> np.ndarray:  # the assignment's window along an axis
        return np.sinc(q * ftype(h / (2 * np.pi))) ** POINTS[assignment]

    deconvolve = (window(kx) * window(ky) * window(kz)) ** 2
    green = ftype(4 * np.pi / h**3) * np.exp(-k2 * ftype(split * split)) / (k2 * deconvolve)
    return np.where(origin, ftype(0), green)


def gradient(k: tuple[np.ndarray, ...], axis: int, where: tuple, n: int) -> np.ndarray:
    """The spectral derivative ``i k`` along ``axis`` on the points ``where`` of the
    spectrum, the Nyquist plane's set to zero (its derivative is not real)."""
    factor = 1j * k[axis]
    if n % 2:
        return factor
    lo, hi = where[axis]
    index = np.arange(lo, hi).reshape([-1 if a == axis else 1 for a in range(3)])
    return np.where(index == n // 2, 0, factor)


def long_range(mesh: np.ndarray, box: float, split: float, with_potential: bool,
               assignment: str = "cic", workers: int = 1) -> LongRange:
    """Accelerations (G = 1) of the long-range force on every mesh point, and the potential
    (``with_potential``), from the mass ``mesh`` (an ``n``-cube, assigned with
    ``assignment``) of a periodic cube of side ``box``; ``split`` is ``r_s`` in length
    units. FFTs by ``scipy.fft`` on ``workers`` threads, in the mesh's dtype."""
    n = mesh.shape[0]
    where = ((0, n), (0, n), (0, n // 2 + 1))
    k = wave_numbers(n, box, mesh.dtype.type, where)
    psi = scipy.fft.rfftn(mesh, workers=workers) * green_function(k, n, box, split, assignment)
    fields = [scipy.fft.irfftn(psi * gradient(k, axis, where, n), s=mesh.shape,
                               workers=workers) for axis in range(3)]
    if with_potential:
        fields.append(-scipy.fft.irfftn(psi, s=mesh.shape, workers=workers))
    return LongRange(np.stack(fields).astype(mesh.dtype, copy=False),
                     float(mesh.sum(dtype=np.float64)))


#: Bodies a chunk of the interpolation takes (chunks run on Numba's threads; each body's
#: sum is the same in any chunk, so the result does not depend on the chunking).
_CHUNK = 4096


@njit(cache=True, parallel=True)
def _interpolate(x, y, z, fields, n, first, inv_h, points, order, out):
    """Interpolation of ``fields`` (rows, k, n, n: the mesh planes ``first .. first + k - 1``
    along the first axis, modulo ``n``) at the bodies into ``out`` with the weights of
    :func:`_deposit`, in chunks of bodies on Numba's threads, the bodies taken in ``order``
    (:func:`_plane_order`: each body's sum is the same in any order)."""
    count = x.shape[0]
    for chunk in prange((count + _CHUNK - 1) // _CHUNK):
        index = np.empty(3 * points, dtype=np.int64)
        weight = np.empty(3 * points)
        for j in range(chunk * _CHUNK, min(count, (chunk + 1) * _CHUNK)):
            i = order[j]
            _body_weights(x, y, z, i, inv_h, points, index, weight)
            for s in range(3 * points):  # modulo n by adding or taking n: no division
                v = index[s] - first if s < points else index[s]
                while v < 0:
                    v += n
                while v >= n:
                    v -= n
                index[s] = v
            for r in range(out.shape[0]):
                total = 0.0
                for s in range(points):
                    for t in range(points):
                        w = weight[s] * weight[points + t]
                        for u in range(points):
                            total += w * weight[2 * points + u] * float(
                                fields[r, index[s], index[points + t],
                                       index[2 * points + u]])
                out[r, i] = total


def _plane_order(x: np.ndarray, inv_h: float, n: int) -> np.ndarray:
    """The order of bodies at first coordinates ``x`` by their mesh plane along the first
    axis (a mesh of ``n`` points per side, ``inv_h`` of them a unit length; stable, by
    NumPy's radix sort): bodies taken in it read the same few planes one after another, from
    the cache, where in their own order each would read three planes anywhere in a mesh
    larger than the cache. The order changes no body's interpolated value."""
    planes = np.floor(np.asarray(x, dtype=np.float64) * inv_h) % n
    return np.argsort(planes.astype(np.uint16 if n <= 2**16 else np.int64), kind="stable")


def potential_offset(mass: np.ndarray, total_mass: float, box: float, split: float
                     ) -> np.ndarray:
    """What the long-range potential of bodies of ``mass`` lacks to be the periodic
    potential of the Ewald sum (:mod:`~nbody_dask.kernels.ewald`): their own smooth part
    removed (``+ m / (r_s sqrt(pi))``) and the background's (``+ 4 pi r_s^2 M / L^3``)."""
    return (mass.astype(np.float64) / (split * math.sqrt(math.pi))
            + 4 * math.pi * split * split * total_mass / box**3)


def interpolate(position: np.ndarray, mass: np.ndarray, solved: LongRange, box: float,
                split: float, assignment: str = "cic") -> np.ndarray:
    """Long-range accelerations (and potentials, when ``solved`` has them) of bodies at
    ``position``, interpolated with ``assignment`` weights: shape (3 or 4, n), in the
    positions' dtype. The potential includes :func:`potential_offset`."""
    return interpolate_planes(position, mass, list(solved.fields), 0, solved.total_mass, box,
                              split, assignment)


def interpolate_planes(position: np.ndarray, mass: np.ndarray, planes: Sequence[np.ndarray],
                       first: int, total_mass: float, box: float, split: float,
                       assignment: str = "cic") -> np.ndarray:
    """:func:`interpolate` from some of the mesh's planes: ``planes[r]`` is, for each solved
    field ``r`` (3 or 4 of them), an array (k, n, n) of its planes ``first .. first + k -
    1`` (modulo ``n``) along the first axis, holding every point the bodies' weights touch
    (:func:`cell_span`). Each field is taken from ``planes`` once, in order, and let go
    before the next (a sequence that makes them when asked holds one at a time)."""
    rows = len(planes)
    out = np.empty((rows, position.shape[1]))
    order = None
    for row in range(rows):
        field = planes[row]
        n = field.shape[1]
        if order is None:
            order = _plane_order(position[0], n / box, n)
        _interpolate(position[0], position[1], position[2], field[np.newaxis], n, first,
                     n / box, POINTS[assignment], order, out[row:row + 1])
        del field
    if rows == 4:
        out[3] += potential_offset(mass, total_mass, box, split)
    return out.astype(position.dtype)


def span_pieces(bounds: Sequence[tuple[int, int]], first: int, count: int
                ) -> list[tuple[int, int, int]]:
    """Where planes ``first .. first + count - 1`` (modulo the mesh, ``count`` at most its
    size) lie in the slabs of ``bounds`` (``(lo, hi)`` planes each, covering the mesh in
    order): ``(slab, start, stop)`` ranges of planes within a slab, in the planes' order."""
    n = bounds[-1][1]
    pieces, plane, left = [], first % n, min(count, n)
    while left > 0:
        slab = next(j for j, (lo, hi) in enumerate(bounds) if lo <= plane < hi)
        lo, hi = bounds[slab]
        take = min(hi - plane, left)
        pieces.append((slab, plane - lo, plane - lo + take))
        left -= take
        plane = (plane + take) % n
    return pieces


def slab_sum(n: int, dtype: str, lo: int, hi: int, *parts: Region | np.ndarray) -> np.ndarray:
    """Planes ``lo .. hi - 1`` of the sum of partial meshes, in the order given: a
    :class:`Region` adds the planes it has there (modulo ``n``), an array (a slab of the same
    planes, from an earlier sum) adds whole."""
    total = np.zeros((hi - lo, n, n), dtype=dtype)
    for part in parts:
        if not isinstance(part, Region):
            total += part
            continue
        size = part.values.shape
        rows = (part.start[0] + np.arange(size[0])) % n
        inside = (rows >= lo) & (rows < hi)
        if not inside.any():
            continue
        index = np.ix_(rows[inside] - lo,
                       *[(start + np.arange(count)) % n
                         for start, count in zip(part.start[1:], size[1:], strict=True)])
        total[index] += part.values[inside]
    return total


def overlaps(span: tuple[int, int], lo: int, hi: int, n: int) -> bool:
    """Whether the planes ``span = (first, count)`` (modulo ``n``) meet planes ``lo..hi-1``."""
    first, count = span
    rows = (first + np.arange(count)) % n
    return bool(((rows >= lo) & (rows < hi)).any())
