"""Body sets on disk: load initial conditions from files, save generated ones.

Formats, chosen by the path:

* ``.npz`` (NumPy): arrays ``position`` (n, 3), optional ``velocity`` (n, 3) and ``mass`` (n,);
* ``.nc`` / ``.nc4`` / ``.cdf`` (netCDF, through xarray), and
* Zarr (a directory, or a name ending in ``.zarr``): a body set written by :func:`save_bodies`
  or ``xr.Dataset.to_zarr``, or an nbody_dask trajectory, of which one committed snapshot
  is taken (the last by default) with its time, so that a run continues from there;
* ``.hdf5`` / ``.h5`` / ``.hdf``: a GADGET-layout snapshot as GADGET-4, AREPO and SWIFT write
  them (:mod:`nbody_dask.gadget`; needs h5py).

A dataset with a ``time`` dimension is treated as a trajectory too. Loaded sets are validated
by :func:`nbody_dask.as_bodies` like any other input.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from ._version import __version__
from ._validate import check_new_file
from .bodies import as_bodies, is_lazy, lazy_bodies, make_bodies
from .gadget import SUFFIXES, read_gadget, write_gadget
from .location import store_location
from .storage import check_store_path, consolidate_metadata, is_trajectory_store, open_trajectory

__all__ = ["load_bodies", "save_bodies"]

_NETCDF = (".nc", ".nc4", ".cdf", ".netcdf")


def _is_local(path: str | os.PathLike) -> bool:
    """True for a local path or a ``file://`` URL; False for other URLs (``s3://``...)."""
    scheme = urllib.parse.urlsplit(os.fspath(path)).scheme
    return "://" not in os.fspath(path) or scheme.lower() == "file"


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix in _NETCDF:
        return "netcdf"
    if suffix == ".zarr" or path.is_dir():
        return "zarr"
    if suffix in SUFFIXES:
        return "gadget"
    raise ValueError(f"cannot tell the format of {str(path)!r}: use a name ending in .npz, "
                     f"{', '.join(_NETCDF)}, .zarr or {', '.join(SUFFIXES)} (GADGET HDF5)")


def load_bodies(path: str | os.PathLike, *, snapshot: int = -1,
                storage_options: Mapping[str, Any] | None = None) -> xr.Dataset:
    """Read a body set (initial conditions) from a file.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npz``, netCDF or Zarr file; see the module docstring. Or the URL of a
        trajectory in an object store (``s3://bucket/run.zarr``).
    snapshot : int, default -1
        Which snapshot of a trajectory to take (an index into its committed snapshots,
        negative from the end). Ignored for plain body sets.
    storage_options : dict, optional
        For a URL: the options of its fsspec file system (see :mod:`nbody_dask.location`).

    Returns
    -------
    xarray.Dataset
        A validated body set; a snapshot keeps its scalar ``time``, which
        :func:`nbody_dask.simulate` takes as the start time. From Zarr (a body set, a
        trajectory) it is lazy, its ids a coordinate without an index, so that a run's
        workers read it and it never passes whole through this process.

    Raises
    ------
    FileNotFoundError
        If nothing exists at ``path``.
    ValueError
        For an unknown format, missing variables, or a snapshot index out of range.
    """
    location = store_location(path, storage_options)
    # Zarr (a trajectory, a body set) is read lazily, its ids too: by a run's workers
    if not location.is_local:  # a trajectory in an object store
        return _snapshot_bodies(open_trajectory(location, index=False), snapshot,
                                location.url)
    path = location.path
    if not path.exists():
        raise FileNotFoundError(f"no body file at {str(path)!r}")
    kind = _format(path)
    if kind == "npz":
        with np.load(path) as data:
            if "position" not in data:
                raise ValueError(f"{str(path)!r} has no 'position' array; it has "
                                 f"{sorted(data.files)}")
            arrays = {k: data[k] for k in ("position", "velocity", "mass") if k in data}
        return make_bodies(**arrays)
    if kind == "gadget":
        return read_gadget(path)
    if kind == "zarr" and is_trajectory_store(path):
        ds = open_trajectory(path, index=False)
    elif kind == "zarr":
        consolidated = zarr.open_group(path, mode="r").metadata.consolidated_metadata
        ds = xr.open_zarr(path, consolidated=consolidated is not None,
                          create_default_indexes=False)
    else:
        ds = xr.open_dataset(path)
    return _snapshot_bodies(ds, snapshot, str(path))


def _snapshot_bodies(ds: xr.Dataset, snapshot: int, where: str) -> xr.Dataset:
    """Snapshot ``snapshot`` of ``ds`` (or ``ds`` itself without a time axis) as bodies: lazy
    where ``ds`` is (a Zarr store: a run's workers read it into their tiles), else loaded and
    the file closed."""
    if "time" in ds.dims:
        count = ds.sizes["time"]
        if not -count <= snapshot < count:
            ds.close()
            raise ValueError(f"snapshot must be in [{-count}, {count - 1}] for "
                             f"{where!r} ({count} snapshots), got {snapshot!r}")
        ds = ds.isel(time=snapshot)
        ds = ds.drop_vars([v for v in ds.data_vars if "body" not in ds[v].dims])
    if is_lazy(ds):
        return lazy_bodies(ds)
    with ds:
        bodies = as_bodies(ds.load())
        if "time" in ds.coords and ds["time"].ndim == 0:
            bodies = bodies.assign_coords(time=ds["time"].item())
        return bodies


def _lazy_bodies(bodies: xr.Dataset) -> xr.Dataset:
    """A lazy body set checked as far as it can be without computing it
    (:func:`~nbody_dask.bodies.lazy_bodies`); its values are checked chunk by chunk as they
    are computed."""
    ds = lazy_bodies(bodies)
    ds = ds.assign({name: ds[name].copy(deep=False, data=ds[name].data.map_blocks(
        _finite, name, dtype=np.float64)) for name in ("position", "velocity", "mass")})
    return ds.assign_coords(axis=np.array(["x", "y", "z"], dtype=object))


def _finite(block: np.ndarray, name: str) -> np.ndarray:
    if not np.isfinite(block).all():
        raise ValueError(f"bodies.{name} has non-finite values")
    if name == "mass" and (block < 0).any():
        raise ValueError("bodies.mass has negative values")
    return block


def save_bodies(bodies: xr.Dataset, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a body set to ``.npz``, netCDF, Zarr or GADGET HDF5 (chosen by ``path``), for
    ``run --ic FILE`` or for other codes (a trajectory snapshot keeps its ``time``). A lazy
    body set (Dask arrays, as :func:`nbody_dask.cosmological_ics` returns) goes to Zarr
    chunk by chunk, computed and written by the cluster's workers, never gathered here; its
    values are checked as each chunk is computed.

    Raises
    ------
    FileExistsError
        If ``path`` exists and ``overwrite`` is False.
    ValueError
        For an unknown format, an object-store URL (body files are local; trajectories go to
        object stores through ``simulate(store=...)``), or ``overwrite`` of a directory that
        is not a Zarr store or of a trajectory store (a body set never replaces one).
    """
    location = store_location(path) if _is_local(path) else None
    if location is None:
        raise ValueError(f"path={os.fspath(path)!r}: body files are written to local paths; "
                         "an object store holds trajectories (simulate(store=...), run "
                         "--store); write the body file locally")
    path = location.path
    kind = "zarr" if path.suffix.lower() == ".zarr" else _format(path)
    if kind == "zarr" and is_trajectory_store(path):
        raise ValueError(f"path={str(path)!r} is a trajectory store: a body set never replaces "
                         "one, even with overwrite=True; remove it yourself if you mean to")
    if kind == "gadget":
        return write_gadget(bodies, path, overwrite=overwrite)
    if kind == "zarr" and is_lazy(bodies):
        # a lazy body set (cosmological_ics) is written chunk by chunk where its arrays are
        # computed, on the cluster's workers: it never passes whole through this process
        check_store_path(path, overwrite)
        ds = _lazy_bodies(bodies)
        ds.attrs["nbody_dask_version"] = __version__
        ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False)
        consolidate_metadata(path)
        return path
    ds = as_bodies(bodies)
    if isinstance(bodies, xr.Dataset) and "time" in bodies.coords and bodies["time"].ndim == 0:
        ds = ds.assign_coords(time=bodies["time"].item())  # a snapshot's time, an IC's a
    if kind == "zarr":
        check_store_path(path, overwrite)  # refuses to replace anything that is not Zarr
        # object strings: Zarr v3's specified variable-length string type
        ds = ds.assign_coords(axis=np.array(ds.axis.values, dtype=object))
        ds.attrs["nbody_dask_version"] = __version__  # what overwrite=True may replace
        ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False)
        consolidate_metadata(path)
        return path
    check_new_file(path, overwrite)
    if kind == "npz":
        with open(path, "wb") as f:
            np.savez(f, position=ds.position.values, velocity=ds.velocity.values,
                     mass=ds.mass.values)
    else:
        ds.attrs = {k: (str(v) if isinstance(v, list) else v) for k, v in ds.attrs.items()}
        ds.to_netcdf(path)
    return path
