"""The matter power spectrum of a periodic box, estimated on the cluster.

:func:`power_spectrum` assigns the bodies' mass to a mesh (TSC by default: 27 points a body;
CIC: 8), each chunk of bodies depositing its own partial mesh as TreePM does
(:func:`nbody_dask.kernels.pm.deposit`), sums the partials plane slab by plane slab in a
fixed order, transforms the mesh with the distributed FFT (:mod:`nbody_dask.meshfft`) and
bins ``|delta_k|^2`` in shells of ``|k|``, chunk by chunk of the spectrum. Nothing is
gathered on the caller but the binned sums.

The estimator (Sefusatti et al. 2016): the density contrast's transform divided by the
assignment's window, ``prod_i sinc(k_i h / 2)^p`` (``p`` = 2 for CIC, 3 for TSC), and with
``interlacing`` averaged with a second mesh of the bodies shifted by half a cell along every
axis (its phase ``exp(i k . h/2)`` undone), which cancels the leading aliases: the result is
then within 1e-3 of the true spectrum up to about the mesh's Nyquist frequency. The shot
noise ``V sum m^2 / (sum m)^2`` (``V / N`` for equal masses) is reported, not subtracted.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import xarray as xr

from . import meshfft
from ._validate import check_int, check_real
from .kernels import pm

__all__ = ["power_spectrum", "default_mesh_size", "ASSIGNMENTS"]

ASSIGNMENTS = tuple(pm.POINTS)
#: Bodies per deposit task.
_CHUNK_BODIES = 1 << 20
#: Mesh points per slab of the summed mesh (at most; 128 planes of 512^2 float64 = 256 MiB).
_SLAB_POINTS = 1 << 25


def default_mesh_size(n: int) -> int:
    """A mesh for the power spectrum of ``n`` bodies: twice their grid (at least 16) a side,
    reaching twice the particle Nyquist frequency."""
    return max(16, 2 * round(n ** (1 / 3)))


def power_spectrum(bodies: xr.Dataset, mesh_size: int, *, box_size: float | None = None,
                   assignment: str = "tsc", interlacing: bool = True,
                   bin_width: float = 1.0) -> xr.Dataset:
    """The power spectrum ``P(k)`` of the bodies' mass in a periodic cube.

    Parameters
    ----------
    bodies : xarray.Dataset
        ``position(body, axis)`` in ``[0, box_size)`` (wrapped in otherwise) and
        ``mass(body)``: a body set or a snapshot (``traj.isel(time=-1)``), in memory or lazy
        (Dask). A trajectory with a ``time`` dimension gives one spectrum per snapshot.
    mesh_size : int
        Mesh points per side (>= 4); the spectrum reaches the mesh's Nyquist frequency
        ``pi mesh_size / box_size``.
    box_size : float, optional
        Side of the box; by default the bodies' ``box_size`` attribute (a periodic run's
        trajectory has it).
    assignment : {"tsc", "cic"}
        Mass assignment.
    interlacing : bool
        Average with a mesh shifted by half a cell (cancels the leading aliases).
    bin_width : float
        Width of the ``|k|`` shells in units of the fundamental ``2 pi / box_size``; shells
        from half the fundamental up, the last ending half a width above the Nyquist
        frequency.

    Returns
    -------
    xarray.Dataset
        ``power(k)`` (length^3, shot noise included), ``modes(k)`` (independent modes in
        the shell) and ``shot_noise``; coordinate ``k`` (the mean ``|k|`` of the shell's
        modes, in 1/length, angular). With a ``time`` dimension, ``power(time, k)``.

    Examples
    --------
    >>> pk = nbody_dask.power_spectrum(traj.isel(time=-1), 128)   # doctest: +SKIP
    >>> (pk.power - pk.shot_noise).plot(xscale="log", yscale="log")  # doctest: +SKIP
    """
    mesh_size = check_int("mesh_size", mesh_size, 4)
    if box_size is None:
        box_size = bodies.attrs.get("box_size")
        if box_size is None:
            raise ValueError("box_size is needed: the bodies have no box_size attribute")
    box_size = check_real("box_size", box_size, positive=True)
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {ASSIGNMENTS}, got {assignment!r}")
    if not isinstance(interlacing, bool):
        raise TypeError(f"interlacing must be True or False, got {interlacing!r}")
    bin_width = check_real("bin_width", bin_width, positive=True)
    if "time" in bodies.dims:
        spectra = [power_spectrum(bodies.isel(time=i), mesh_size, box_size=box_size,
                                  assignment=assignment, interlacing=interlacing,
                                  bin_width=bin_width) for i in range(bodies.sizes["time"])]
        out = xr.concat(spectra, dim="time")
        return out.assign_coords({name: ("time", np.asarray(bodies[name].values),
                                         bodies[name].attrs)
                                  for name in bodies.coords if bodies[name].dims == ("time",)})
    sums = _binned_sums(bodies, mesh_size, box_size, assignment, interlacing, bin_width)
    power_sum, k_sum, modes, mass_sum, mass2_sum = dask.compute(*sums)
    return _spectrum(power_sum, k_sum, modes, mass_sum, mass2_sum, mesh_size, box_size,
                     assignment, interlacing)


def _binned_sums(bodies: xr.Dataset, n: int, box: float, assignment: str,
                 interlacing: bool, bin_width: float) -> tuple:
    """The lazy binned sums of one snapshot: ``sum |delta_k|^2`` (unnormalised), ``sum |k|``,
    the mode counts, the total mass and the sum of squared masses."""
    position = _as_dask(bodies["position"].data, (_CHUNK_BODIES, 3))
    mass = _as_dask(bodies["mass"].data, (_CHUNK_BODIES,)).rechunk((position.chunks[0],))
    shifts = (0.0, 0.5) if interlacing else (0.0,)
    spectra = [meshfft.rfftn(_mesh(position, mass, n, box, assignment, shift))
               for shift in shifts]
    edges = np.arange(0.5, n / 2 + 0.5 + 1e-9, bin_width) * (2 * np.pi / box)
    blocks = [spectrum.to_delayed() for spectrum in spectra]
    offsets = [np.cumsum((0,) + c)[:-1] for c in spectra[0].chunks]
    parts = []
    for index in np.ndindex(*blocks[0].shape):
        where = tuple((int(offsets[a][index[a]]), int(offsets[a][index[a]])
                       + spectra[0].chunks[a][index[a]]) for a in range(3))
        parts.append(dask.delayed(_bin_block)([b[index] for b in blocks], where, n, box,
                                              assignment, edges))
    total = dask.delayed(_sum_in_order)(*parts)
    power_sum, k_sum, modes = (total[i] for i in range(3))
    return (power_sum, k_sum, modes, mass.sum(dtype=np.float64),
            (mass.astype(np.float64) ** 2).sum())


def _as_dask(array: np.ndarray | da.Array, chunks: tuple) -> da.Array:
    if isinstance(array, da.Array):
        return array
    return da.from_array(np.asarray(array), chunks=chunks)


def _mesh(position: da.Array, mass: da.Array, n: int, box: float, assignment: str,
          shift: float) -> da.Array:
    """The mass mesh (float64), chunked in slabs along its first axis: a deposit per chunk of
    bodies (shifted by ``shift`` cells along every axis), summed slab by slab in chunk
    order."""
    regions = [dask.delayed(_deposit)(p, m, n, box, assignment, shift)
               for p, m in zip(position.to_delayed()[:, 0], mass.to_delayed(), strict=True)]
    planes = max(1, min(n, _SLAB_POINTS // (n * n)))
    slabs = [da.from_delayed(dask.delayed(pm.slab_sum)(n, "float64", lo, min(lo + planes, n),
                                                        *regions),
                             shape=(min(lo + planes, n) - lo, n, n), dtype=np.float64)
             for lo in range(0, n, planes)]
    return da.concatenate(slabs, axis=0)


def _deposit(position: np.ndarray, mass: np.ndarray, n: int, box: float, assignment: str,
             shift: float) -> pm.Region:
    """One chunk's partial mesh, in float64, the bodies shifted by ``shift`` cells."""
    xyz = np.ascontiguousarray(np.asarray(position, dtype=np.float64).T)
    if shift:
        xyz += shift * box / n
    xyz = np.mod(xyz, box)
    xyz[xyz >= box] = 0.0  # mod of a tiny negative value can round up to box
    return pm.deposit(xyz, np.asarray(mass, dtype=np.float64), box, n, assignment)


def _bin_block(blocks: list[np.ndarray], where: tuple, n: int, box: float, assignment: str,
               edges: np.ndarray) -> np.ndarray:
    """Binned sums (rows: ``|F|^2``, ``|k|``, modes) of one chunk of the spectrum at the
    points ``where``: the window deconvolved, the interlaced mesh's phase undone."""
    kx, ky, kz = pm.wave_numbers(n, box, np.float64, where)
    h = box / n

    def window(q: np.ndarray) -> np.ndarray:
        return np.sinc(q * (h / (2 * np.pi))) ** pm.POINTS[assignment]

    field = blocks[0]
    if len(blocks) == 2:
        field = 0.5 * (field + blocks[1] * np.exp(0.5j * h * (kx + ky + kz)))
    field = field / (window(kx) * window(ky) * window(kz))
    k = np.sqrt(kx * kx + ky * ky + kz * kz)
    # the real FFT holds half the spectrum: planes other than kz = 0 and Nyquist count twice
    plane = np.arange(*where[2])
    weight = np.where((plane == 0) | (2 * plane == n), 1.0, 2.0).reshape(1, 1, -1)
    weight = np.broadcast_to(weight, k.shape)
    power = (field.real**2 + field.imag**2)
    shell = np.digitize(k, edges) - 1  # -1: below the first edge (k = 0 among them)
    inside = (shell >= 0) & (shell < len(edges) - 1)
    bins = len(edges) - 1
    out = np.zeros((3, bins))
    for row, values in enumerate((power * weight, k * weight, weight)):
        out[row] = np.bincount(shell[inside], weights=values[inside], minlength=bins)
    return out


def _sum_in_order(*parts: np.ndarray) -> np.ndarray:
    total = np.zeros_like(parts[0])
    for part in parts:
        total += part
    return total


def _spectrum(power_sum: np.ndarray, k_sum: np.ndarray, modes: np.ndarray, mass: float,
              mass2: float, n: int, box: float, assignment: str, interlacing: bool
              ) -> xr.Dataset:
    """The normalised spectrum of the binned sums, empty shells dropped."""
    filled = modes > 0
    mean_cell = mass / n**3
    # P = V |delta_k|^2 / n^6 with delta_k = F[mesh] / mean_cell (k != 0)
    power = power_sum[filled] / modes[filled] * box**3 / (n**6 * mean_cell**2)
    return xr.Dataset(
        {"power": ("k", power, {"long_name": "power spectrum (shot noise included)"}),
         "modes": ("k", modes[filled] / 2, {"long_name": "independent modes in the shell"}),
         "shot_noise": ((), box**3 * mass2 / mass**2, {"long_name": "shot noise"})},
        coords={"k": ("k", k_sum[filled] / modes[filled],
                      {"long_name": "mean |k| of the shell (angular)"})},
        attrs={"box_size": box, "mesh_size": n, "assignment": assignment,
               "interlacing": int(interlacing)})
