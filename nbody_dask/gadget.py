"""GADGET-style HDF5 snapshots (the layout of GADGET-4, AREPO and SWIFT), through h5py.

Layout: a ``Header`` group whose attributes say how many particles of each of six types
there are (``NumPart_ThisFile``, ``NumPart_Total``), a ``MassTable`` (a type's mass when all
its particles share it, else 0), ``Time`` and the like; and one group ``PartType<k>`` per type
with ``Coordinates`` (n, 3), ``Velocities`` (n, 3), ``ParticleIDs`` (n,) and, unless the mass
table gives it, ``Masses`` (n,).

:func:`read_gadget` reads the particles of every type present (or those asked for), in type
order, as one body set: ``body`` holds the ``ParticleIDs``, the header's ``Time`` becomes the
start time. Values are taken as stored, in the file's code units: nbody_dask's own G = 1
units need ``G=`` (or a rescaling) for files in other units, and cosmological snapshots
(comoving coordinates, velocities scaled by sqrt(a)) are not converted. :func:`write_gadget`
writes a body set as collisionless particles of type 1 (``PartType1``), with explicit
``Masses`` and a zero mass table, which every reader of the layout accepts.

Needs the optional ``h5py`` (``pip install "nbody-dask[hdf5]"``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xarray as xr

from ._validate import check_new_file
from .bodies import as_bodies, make_bodies

__all__ = ["read_gadget", "write_gadget", "SUFFIXES"]

SUFFIXES = (".hdf5", ".h5", ".hdf")
_TYPES = 6


def _h5py():
    try:
        import h5py
    except ImportError:
        raise ImportError("GADGET/SWIFT HDF5 files need h5py: pip install "
                          "'nbody-dask[hdf5]'") from None
    return h5py


def read_gadget(path: str | os.PathLike, *, types: tuple[int, ...] | None = None
                ) -> xr.Dataset:
    """Read the particles of a GADGET-layout HDF5 snapshot as a body set.

    Parameters
    ----------
    path : str or os.PathLike
        The snapshot (one file; multi-file snapshots are not read).
    types : tuple of int, optional
        Particle types to read (0-5); by default every type with particles.

    Returns
    -------
    xarray.Dataset
        A validated body set, ``body`` = ``ParticleIDs``, with the header's ``Time`` as a
        scalar ``time`` coordinate and ``attrs["gadget_types"]`` the type of each body block.

    Raises
    ------
    ValueError
        If the file has no ``Header``, is one of several files (``NumFilesPerSnapshot``, or
        a ``NumPart_Total`` larger than ``NumPart_ThisFile``), has no particles of the types
        asked for, a type lacks a dataset, or a dataset's length differs from the header's
        count (naming the file, the dataset and both numbers); ``types`` outside 0-5.
    OSError
        If the file cannot be read as HDF5, naming it.
    """
    h5py = _h5py()
    path = Path(path)
    if types is not None:
        types = tuple(types)
        if not all(isinstance(k, int | np.integer) and 0 <= k < _TYPES for k in types):
            raise ValueError(f"types must be particle types 0-{_TYPES - 1}, got {types!r}")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise OSError(f"{str(path)!r} cannot be read as an HDF5 file: {exc}") from None
    with f:
        if "Header" not in f:
            raise ValueError(f"{str(path)!r} has no Header group: not a GADGET-layout "
                             "HDF5 snapshot")
        header = dict(f["Header"].attrs)
        counts = _header_counts(header, "NumPart_ThisFile")
        total = _header_counts(header, "NumPart_Total", "NumPart_Total_HighWord")
        several = int(np.atleast_1d(header.get("NumFilesPerSnapshot", 1))[0]) > 1
        if several or ("NumPart_Total" in header and (total > counts).any()):
            raise ValueError(f"{str(path)!r} is one file of a multi-file snapshot "
                             f"({int(counts.sum())} of {int(total.sum())} particles); "
                             "combine the files first")
        table = np.zeros(_TYPES)
        given = np.asarray(header.get("MassTable", table), dtype=float)
        table[:given.size] = given
        wanted = [k for k in (types if types is not None else range(_TYPES)) if counts[k] > 0]
        if not wanted:
            raise ValueError(f"{str(path)!r} has no particles of type(s) "
                             f"{list(types) if types is not None else 'any'}")
        blocks = [_read_type(f, path, k, int(counts[k]), table[k]) for k in wanted]
    position, velocity, mass, ids = (np.concatenate(parts) for parts in zip(*blocks,
                                                                            strict=True))
    if ids.dtype.kind == "u" and (ids.size == 0 or ids.max() < 2**63):
        ids = ids.astype(np.int64)  # signed labels, as everywhere else in nbody_dask
    ds = make_bodies(position, velocity, mass, body=ids)
    ds.attrs["gadget_types"] = [int(k) for k in wanted]
    return ds.assign_coords(time=float(np.atleast_1d(header.get("Time", 0.0))[0]))


def _header_counts(header: dict, name: str, high_word: str | None = None) -> np.ndarray:
    """A header's per-type particle counts (six, int64; with the high words of totals)."""
    counts = np.zeros(_TYPES, dtype=np.int64)
    given = np.asarray(header.get(name, counts), dtype=np.int64).ravel()[:_TYPES]
    counts[:given.size] = given
    if high_word is not None and high_word in header:
        high = np.asarray(header[high_word], dtype=np.int64).ravel()[:_TYPES]
        counts[:high.size] += high << 32
    return counts


def _read_type(f, path: Path, k: int, count: int, table_mass: float):
    group_name = f"PartType{k}"
    if group_name not in f:
        raise ValueError(f"{str(path)!r}: the header counts {count} particles of type {k} "
                         f"but there is no {group_name} group")
    group = f[group_name]
    arrays = {}
    names = ("Coordinates", "Velocities", "ParticleIDs", *(("Masses",) if "Masses" in group
                                                           else ()))
    for name in names:  # every length checked before anything is read (or allocated)
        if name not in group:
            raise ValueError(f"{str(path)!r}: {group_name} has no {name} dataset")
        shape = group[name].shape
        if shape[:1] != (count,) or (name in ("Coordinates", "Velocities")
                                     and shape[1:] != (3,)):
            want = f"({count}, 3)" if name in ("Coordinates", "Velocities") else f"({count},)"
            raise ValueError(f"{str(path)!r}: {group_name}/{name} has shape {shape}, but the "
                             f"header's NumPart_ThisFile[{k}] = {count} needs {want}")
    for name in ("Coordinates", "Velocities", "ParticleIDs"):
        arrays[name] = group[name][...]
    if "Masses" in group:
        mass = group["Masses"][...]
    elif table_mass > 0:
        mass = np.full(count, table_mass)
    else:
        raise ValueError(f"{str(path)!r}: {group_name} has no Masses dataset and a zero "
                         "MassTable entry")
    return arrays["Coordinates"], arrays["Velocities"], mass, arrays["ParticleIDs"]


def write_gadget(bodies: xr.Dataset, path: str | os.PathLike, *,
                 overwrite: bool = False) -> Path:
    """Write a body set (or one snapshot of a trajectory) as a GADGET-layout HDF5 snapshot.

    Bodies become particles of type 1 in ``body`` order; ``ParticleIDs`` are the body labels
    when they are non-negative integers, else ``0..n-1``. Values are written in float64 (a
    float32 snapshot converts exactly); ``Time`` is the snapshot's time (0 without one).

    Raises
    ------
    FileExistsError
        If ``path`` exists and ``overwrite`` is False.
    ValueError
        If ``path`` is a directory.
    """
    h5py = _h5py()
    time = float(bodies["time"]) if "time" in bodies.coords and bodies["time"].ndim == 0 \
        else 0.0
    ds = as_bodies(bodies)
    path = Path(path)
    check_new_file(path, overwrite)
    n = ds.sizes["body"]
    labels = ds["body"].values
    integer = np.issubdtype(labels.dtype, np.integer) and (labels >= 0).all()
    ids = labels.astype(np.uint64) if integer else np.arange(n, dtype=np.uint64)
    counts = np.zeros(_TYPES, dtype=np.uint32)
    counts[1] = n
    with h5py.File(path, "w") as f:
        header = f.create_group("Header")
        header.attrs.update({
            "NumPart_ThisFile": counts, "NumPart_Total": counts,
            "NumPart_Total_HighWord": np.zeros(_TYPES, dtype=np.uint32),
            "MassTable": np.zeros(_TYPES), "Time": time, "Redshift": 0.0, "BoxSize": 0.0,
            "NumFilesPerSnapshot": 1, "Omega0": 0.0, "OmegaLambda": 0.0, "HubbleParam": 1.0,
            "Flag_Sfr": 0, "Flag_Cooling": 0, "Flag_StellarAge": 0, "Flag_Metals": 0,
            "Flag_Feedback": 0, "Flag_DoublePrecision": 1,
        })
        group = f.create_group("PartType1")
        group.create_dataset("Coordinates", data=ds.position.values)
        group.create_dataset("Velocities", data=ds.velocity.values)
        group.create_dataset("Masses", data=ds.mass.values)
        group.create_dataset("ParticleIDs", data=ids)
    return path
