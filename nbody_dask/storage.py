"""The trajectory store: Zarr v3, laid out up front, written region by region from the workers.

A store is a local directory or a prefix in an object store (:mod:`nbody_dask.location`);
everything here goes through a :class:`~nbody_dask.location.StoreLocation`, so the layout,
the commit protocol and the checks are the same for both.

Layout (xarray over Zarr v3, readable with ``xr.open_zarr(path)``)::

    dims         time, body, axis (= "x", "y", "z")
    coords       time(time)  simulation time      step(time)  step number
                 body(body)  body id              axis(axis)
    variables    position(time, body, axis)   velocity(time, body, axis)   mass(body)
                 kinetic_energy(time)  potential_energy(time)  total_energy(time)
                 momentum(time, axis)  angular_momentum(time, axis)
                 force_error(time, statistic) (= median, p99, max; only in runs that
                 record the sampled force errors)
    attributes   G, softening, dt, integrator, dtype, units, nbody_dask_version,
                 snapshot_every, tile_size, config (the full run configuration, JSON)
    group nbody  attribute "committed": number of snapshots fully written

Every array is created at its final size when the run starts, so metadata never changes while
the run goes on (and the consolidated metadata written at creation stays true). ``position``
and ``velocity`` are chunked as one snapshot by one tile: each worker task writes whole chunks
of its own, the only safe way for several processes to write one Zarr array. Diagnostics are
written by the driver, which then advances the commit marker; readers trust only committed
snapshots. The marker lives in its own child group because ``to_zarr`` replaces the root
attributes.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import dask.array as da
from dask.base import tokenize
import numpy as np
import xarray as xr
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.sync import sync as zarr_sync

from .bodies import AXES, Tile
from .diagnostics import ERROR_STATISTICS
from .lease import LeaseLostError, holds, is_lease_file, refuse_if_in_use
from .location import (LocalLocation, StoreLocation, describe_error,
                       quiet_abandoned_requests, store_faults, store_location)

__all__ = ["check_store_path", "is_trajectory_store", "create_store", "write_tile",
           "SnapshotCommitter", "committed_snapshots", "open_trajectory", "verify_trajectory",
           "DamagedStoreError"]

_MARKER_GROUP = "nbody"
_VECTORS = ("momentum", "angular_momentum")
_SCALARS = ("kinetic_energy", "potential_energy", "total_energy")
_ERRORS = "force_error"  # optional: (time, statistic), the sampled force errors
_BINS = "time_bin"  # optional: (time, body), each body's bin with individual time steps
_EVALUATIONS = "force_evaluations"  # optional: (time), with individual time steps
TIME_UNITS = "N-body time units (G = 1 unless the G attribute says otherwise)"


#: Top-level entries of a store that nbody_dask itself may have written besides its arrays.
_OWN_ENTRIES = frozenset({"zarr.json"})

Store = str | os.PathLike | StoreLocation
"""A store argument: a local path, a URL (``file://``, ``s3://``...) or a location."""


def _protected(path: Path) -> str | None:
    """Why ``path`` must never be deleted (a root, home, the working directory or above)."""
    resolved = path.resolve()
    cwd = Path.cwd().resolve()
    if resolved == Path(resolved.anchor):
        return "a file system root"
    if resolved == Path.home().resolve():
        return "the home directory"
    if resolved == cwd:
        return "the current working directory"
    if resolved in cwd.parents:
        return "a parent of the current working directory"
    return None


def _check_replaceable(store: StoreLocation) -> None:
    """Raise unless ``store`` is a store nbody_dask wrote, holding nothing else."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"store {str(store)!r} {why}; refusing to delete it even with "
                          "overwrite=True")

    if isinstance(store, LocalLocation):
        if (why := _protected(store.path)) is not None:
            raise refuse(f"is {why}")
        if not store.path.is_dir() or store.path.is_symlink():
            raise refuse("is not a directory")
    try:
        meta = store.read_json("zarr.json")
    except (OSError, ValueError):
        raise refuse("is not a Zarr store") from None
    if "nbody_dask_version" not in (meta.get("attributes") or {}):
        raise refuse("is a Zarr store that nbody_dask did not write (it has no "
                     "'nbody_dask_version' attribute)")
    members = ((meta.get("consolidated_metadata") or {}).get("metadata") or {})
    known = {name.split("/")[0] for name in members} | _OWN_ENTRIES
    foreign = sorted(n for n in set(store.names()) - known if not is_lease_file(n))
    if foreign:
        raise refuse(f"holds entries nbody_dask did not write: {', '.join(foreign[:5])}"
                     f"{', ...' if len(foreign) > 5 else ''}")


def check_store_path(store: Store, overwrite: bool,
                     storage_options: Mapping[str, Any] | None = None) -> StoreLocation:
    """Validate an output location before any work starts; return it.

    With ``overwrite``, an existing store is replaced only if nbody_dask wrote it (its
    ``nbody_dask_version`` attribute) and it holds nothing else; never a file system root,
    the home directory, the working directory or one of its parents. An object store is
    asked first whether it can be reached with the credentials given.

    Raises
    ------
    TypeError
        If ``store`` is not a path or URL.
    FileExistsError
        If something exists at ``store`` and ``overwrite`` is False.
    ValueError
        If ``store`` is empty or an unsupported URL (see
        :func:`nbody_dask.location.store_location`), or ``overwrite`` is True but what is
        there is not a store nbody_dask may delete.
    StoreUnreachableError
        If the object store cannot be reached or refuses the credentials.
    """
    location = store_location(store, storage_options)
    location.check_reachable()
    local = isinstance(location, LocalLocation)
    if local and not location.path.is_dir():
        occupied = location.path.exists() or location.path.is_symlink()
    else:
        refuse_if_in_use(location)
        # a directory or prefix holding only lease records (released, or of a run killed
        # while it started) is no store (nbody_dask.lease)
        occupied = any(not is_lease_file(n) for n in location.names())
    if occupied:
        if not overwrite:
            raise FileExistsError(
                f"store {str(location)!r} already exists; pass overwrite=True (on the command "
                "line: --overwrite) to replace it; its contents will be lost"
            )
        _check_replaceable(location)
    if isinstance(location, LocalLocation):
        _check_creatable(location.path)
    return location


def _check_creatable(path: Path) -> None:
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"store {str(path)!r} cannot be created: {str(parent)!r} is a file")
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"store {str(path)!r} cannot be created: {str(parent)!r} is "
                              "not writable")


def is_trajectory_store(store: Store) -> bool:
    """True if ``store`` looks like a trajectory store :func:`~nbody_dask.simulate` wrote."""
    return store_location(store).exists(f"{_MARKER_GROUP}/zarr.json")


def create_store(
    store: StoreLocation,
    bodies: xr.Dataset,
    *,
    snapshot_steps: list[int],
    times: list[float],
    dtype: type[np.floating],
    tile_size: int,
    attrs: dict[str, Any],
    units: dict[str, str] | None = None,
    force_errors: bool = False,
    guard: Callable[[], None] | None = None,
    scale_factor: bool = False,
    time_bins: bool = False,
) -> None:
    """Lay out an empty trajectory store for ``len(snapshot_steps)`` snapshots at ``times``.

    ``scale_factor``: the times are a comoving run's scale factors (the ``time``
    coordinate says so and a ``redshift`` coordinate comes beside it).

    ``units`` maps variable names (and ``time``) to CF ``units`` attributes, for runs in
    physical units (:meth:`nbody_dask.units.UnitSystem.cf_units`). ``force_errors`` adds
    ``force_error(time, statistic)`` for runs that record sampled force errors;
    ``time_bins`` adds ``time_bin(time, body)`` and ``force_evaluations(time)`` for runs with
    individual time steps.

    Replaces whatever is at ``store`` (callers check with :func:`check_store_path` first)
    except the writer lease (:mod:`nbody_dask.lease`) of the run that calls it; ``guard``
    (the lease's :meth:`~nbody_dask.lease.WriterLease.check`) is called first, so that
    nothing is cleared unless this run holds the store's newest lease.
    """
    if guard is not None:
        guard()
    store.clear(keep=is_lease_file)
    n = bodies.sizes["body"]
    n_snap = len(snapshot_steps)
    steps = np.asarray(snapshot_steps, dtype=np.int64)
    state_chunks = (1, min(tile_size, n), 3)
    diag_chunk = min(n_snap, 4096)

    def lazy(shape, chunks, fill_dtype):
        return da.full(shape, np.nan if np.dtype(fill_dtype).kind == "f" else 0, chunks=chunks,
                       dtype=fill_dtype)

    lazy_mass = bodies["mass"].chunks is not None
    lazy_ids = bodies["body"].chunks is not None

    optional = {}
    if force_errors:
        optional[_ERRORS] = (("time", "statistic"),
                             np.full((n_snap, len(ERROR_STATISTICS)), np.nan),
                             {"long_name": "relative force error of sampled bodies "
                                           "against a float64 direct sum"})
    if time_bins:
        optional[_BINS] = (("time", "body"), da.full((n_snap, n), -1, dtype=np.int8,
                                                     chunks=state_chunks[:2]),
                           {"long_name": "time bin: step dt / 2**time_bin"})
        optional[_EVALUATIONS] = ("time", np.full(n_snap, np.nan),
                                  {"long_name": "body force evaluations since the previous "
                                                "snapshot"})

    ds = xr.Dataset(
        {
            "position": (("time", "body", "axis"), lazy((n_snap, n, 3), state_chunks, dtype)),
            "velocity": (("time", "body", "axis"), lazy((n_snap, n, 3), state_chunks, dtype)),
            # a lazy body set's masses are written by the workers, below
            "mass": ("body", lazy((n,), state_chunks[1:2], dtype) if lazy_mass
                     else bodies["mass"].values.astype(dtype)),
            # Diagnostics are written now (NaN), so their chunk files exist before a disk can
            # fill up: committing later rewrites them in place.
            **{k: ("time", np.full(n_snap, np.nan)) for k in _SCALARS},
            **{k: (("time", "axis"), np.full((n_snap, 3), np.nan)) for k in _VECTORS},
            **optional,
        },
        coords={
            "time": ("time", np.asarray(times, dtype=np.float64),
                     {"long_name": "scale factor", "units": "1"} if scale_factor
                     else {"units": TIME_UNITS, "long_name": "time"}),
            **({"redshift": ("time", 1 / np.asarray(times, dtype=np.float64) - 1,
                             {"long_name": "redshift"})} if scale_factor else {}),
            "step": ("time", steps, {"long_name": "step number"}),
            **({} if lazy_ids else
               {"body": ("body", bodies["body"].values, {"long_name": "body id"})}),
            "axis": ("axis", np.array(AXES, dtype=object)),
            **({"statistic": ("statistic", np.array(ERROR_STATISTICS, dtype=object))}
               if force_errors else {}),
        },
        attrs=attrs,
    )
    if lazy_ids:  # as the masses, written by the workers, below; no index holds them here
        ds = ds.assign_coords(xr.Coordinates({"body": ("body", lazy((n,), state_chunks[1:2],
                                                                    np.int64),
                                                       {"long_name": "body id"})}, indexes={}))
    ds["position"].attrs["long_name"] = "position"
    ds["velocity"].attrs["long_name"] = "velocity"
    ds["total_energy"].attrs["long_name"] = "kinetic + potential energy"
    for name, unit in (units or {}).items():
        ds[name].attrs["units"] = unit
    encoding = {name: {"chunks": state_chunks} for name in ("position", "velocity")}
    for name, lazy_values in (("mass", lazy_mass), ("body", lazy_ids)):
        if lazy_values:
            encoding[name] = {"chunks": state_chunks[1:2]}
    encoding.update({name: {"chunks": (diag_chunk,)} for name in _SCALARS})
    encoding.update({name: {"chunks": (diag_chunk, 3)} for name in _VECTORS})
    if force_errors:
        encoding[_ERRORS] = {"chunks": (diag_chunk, len(ERROR_STATISTICS))}
    if time_bins:
        encoding[_BINS] = {"chunks": state_chunks[:2]}
        encoding[_EVALUATIONS] = {"chunks": (diag_chunk,)}
    for name in [*ds.data_vars, "time", "step", "body"]:  # a CRC-32C on every chunk
        encoding.setdefault(name, {})["compressors"] = (ZstdCodec(), Crc32cCodec())
    with warnings.catch_warnings():
        # the writer lease file sits beside the arrays: Zarr lists it and says it is no node
        warnings.filterwarnings("ignore", r"Object at writer\.lease", zarr.errors.ZarrUserWarning)
        # "a", not "w-": the directory already holds this run's writer lease (nothing else)
        # every chunk written, also one equal to the fill value (a single body of id 0, a
        # run of zero steps at time 0), which Zarr skips by default and the checks of
        # _check_laid_out would then take for a lost chunk
        ds.to_zarr(store.zarr_store(), mode="a", compute=False, zarr_format=3,
                   consolidated=False, encoding=encoding, write_empty_chunks=True)
        if lazy_mass or lazy_ids:  # by the default scheduler's workers (a run's cluster)
            def chunked(name, kind):
                return "body", bodies[name].data.astype(kind).rechunk(state_chunks[1:2])
            xr.Dataset({"mass": chunked("mass", dtype)} if lazy_mass else {},
                       coords=xr.Coordinates({"body": chunked("body", np.int64)} if lazy_ids
                                             else {}, indexes={})).to_zarr(
                store.zarr_store(), region={"body": slice(0, n)}, zarr_format=3,
                consolidated=False, write_empty_chunks=True)
        root = zarr.open_group(store.zarr_store(), mode="r+", use_consolidated=False)
        root.create_group(_MARKER_GROUP, attributes={"committed": 0, "snapshots": n_snap})
        consolidate_metadata(store.zarr_store())  # no metadata changes after this


def consolidate_metadata(path: Any) -> None:
    """Write consolidated metadata, so that a plain ``xr.open_zarr(path)`` reads it quietly.

    Zarr notes that consolidated metadata is not yet part of the v3 specification; xarray
    reads it and warns without it.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Consolidated metadata", zarr.errors.ZarrUserWarning)
        zarr.consolidate_metadata(path)


@functools.lru_cache(maxsize=32)
def _open_array(store: StoreLocation, name: str, run: str) -> zarr.Array:
    """An array of a store, opened once per process and run.

    Metadata never changes during a run; ``run`` (the run's token, new for every
    :func:`~nbody_dask.simulate` call) keeps a handle from outliving its run, since a store
    recreated at the same place (``overwrite=True``) may have another shape and chunking.
    """
    return zarr.open_array(store=store.zarr_store(), path=name, mode="r+")


def write_tile(store: Store, index: int, tile: Tile, run: str = "", writer: str = "") -> int:
    """Write one tile's positions and velocities into snapshot ``index`` (runs on a worker).

    The region is whole chunks owned by this tile alone. ``run`` identifies the run (see
    :func:`_open_array`); ``writer``, if given, is the run's writer lease id, which must
    still hold the store. Returns the number of bodies written.

    Raises
    ------
    LeaseLostError
        If another run took the store's writer lease over: nothing is written.
    """
    store = store_location(store)
    if writer and not holds(store, writer):
        raise LeaseLostError(f"store {str(store)!r}: this run's writer lease was taken over "
                             "by another run; it stopped writing")
    lo, hi = tile.start, tile.start + tile.size
    region = (index, slice(lo, hi), slice(None))
    _write_region(_open_array(store, "position", run), region, tile.position.T, store.deadline)
    _write_region(_open_array(store, "velocity", run), region, tile.velocity.T, store.deadline)
    if tile.time_bin is not None:
        _write_region(_open_array(store, _BINS, run), region[:2], tile.time_bin,
                      store.deadline)
    return tile.size


def _write_region(array: zarr.Array, region: Any, values: np.ndarray,
                  deadline: float | None) -> None:
    """``array[region] = values``, abandoned after ``deadline`` seconds (None: never) with a
    ``TimeoutError`` saying so: Zarr's blocking writes wait for ever on an object store that
    accepts connections and never answers."""
    if deadline is None:
        array[region] = values
        return
    try:
        zarr_sync(array.async_array.setitem(region, values), timeout=deadline)
    except TimeoutError:
        quiet_abandoned_requests()  # the write goes on in Zarr's loop, and may fail there
        raise TimeoutError(f"the store did not answer within {deadline:g} s") from None


class SnapshotCommitter:
    """The driver's side of the commit protocol: diagnostics, then the commit marker.

    Snapshots must be added in order, after all their regions are written. Records are
    buffered and flushed together (every ``interval`` seconds, and on :meth:`flush`), so the
    cost per snapshot stays small for runs with many snapshots; the marker only ever counts
    snapshots whose diagnostics are on disk too.
    """

    def __init__(self, store: StoreLocation, interval: float = 1.0,
                 guard: Callable[[], None] | None = None) -> None:
        self._guard = guard  # raises if this run may no longer write (lost writer lease)
        self._deadline = store.deadline
        self._root = zarr.open_group(store.zarr_store(), mode="r+", use_consolidated=False)
        self._arrays = {name: self._root[name] for name in _diagnostics(self._root)}
        self._marker = self._root[_MARKER_GROUP]
        self._committed = int(self._marker.attrs["committed"])
        self._buffer: list[dict[str, Any]] = []
        self._interval = interval
        self._last_flush = -float("inf")  # the first snapshot is committed at once

    @property
    def committed(self) -> int:
        """Snapshots committed so far (on disk, marker included)."""
        return self._committed

    def add(self, index: int, record: dict[str, Any]) -> None:
        """Queue snapshot ``index``'s diagnostics; flush if the interval has passed."""
        expected = self._committed + len(self._buffer)
        if index != expected:
            raise RuntimeError(f"snapshot {index} committed out of order (expected {expected})")
        self._buffer.append(record)
        if time.monotonic() - self._last_flush >= self._interval:
            self.flush()

    def flush(self, quietly: bool = False) -> None:
        """Write the queued diagnostics, then advance the commit marker past them.

        With ``quietly``, a failing write (a full disk, say) leaves the marker where it was
        instead of raising: used while another error is already being reported.
        """
        if not self._buffer:
            return
        if quietly:
            try:
                self.flush()
            except (*store_faults(), LeaseLostError):
                pass
            return
        if self._guard is not None:
            self._guard()
        lo, hi = self._committed, self._committed + len(self._buffer)
        for name, array in self._arrays.items():
            _write_region(array, slice(lo, hi), np.array([rec[name] for rec in self._buffer]),
                          self._deadline)
        self._marker.attrs["committed"] = hi
        self._committed = hi
        self._buffer.clear()
        self._last_flush = time.monotonic()


def _diagnostics(root: zarr.Group) -> tuple[str, ...]:
    """The names of a store's per-snapshot diagnostics (written by the driver)."""
    return _SCALARS + _VECTORS + tuple(name for name in (_ERRORS, _EVALUATIONS)
                                       if name in root)


def _open_root(store: StoreLocation) -> zarr.Group:
    """The store's root group, read from disk (not from the consolidated metadata)."""
    try:
        return zarr.open_group(store.zarr_store(read_only=True), mode="r",
                               use_consolidated=False)
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.BaseZarrError):
        raise ValueError(f"{str(store)!r} is not an nbody_dask trajectory store") from None


def _committed(root: zarr.Group, store: StoreLocation) -> int:
    try:
        marker = root[_MARKER_GROUP]
    except (KeyError, ValueError, zarr.errors.BaseZarrError):
        raise ValueError(f"{str(store)!r} is not an nbody_dask trajectory store") from None
    committed = marker.attrs.get("committed")
    total = marker.attrs.get("snapshots")
    if not (isinstance(committed, int) and isinstance(total, int) and 0 <= committed <= total):
        raise ValueError(f"store {str(store)!r} is damaged: commit marker says "
                         f"committed={committed!r} of snapshots={total!r}")
    return committed


def committed_snapshots(store: Store, storage_options: Mapping[str, Any] | None = None) -> int:
    """Number of snapshots fully written to ``store``.

    Raises
    ------
    ValueError
        If ``store`` is not an nbody_dask store, or its commit marker is damaged.
    """
    store = store_location(store, storage_options)
    return _committed(_open_root(store), store)


def open_trajectory(store: Store, storage_options: Mapping[str, Any] | None = None, *,
                    index: bool = True) -> xr.Dataset:
    """Open a trajectory store lazily, showing only committed snapshots.

    Parameters
    ----------
    store : str or os.PathLike
        A store written by :func:`nbody_dask.simulate`: a path, or an object-store URL
        (``s3://bucket/run.zarr``).
    storage_options : dict, optional
        For an object-store URL: options of its fsspec file system (credentials,
        ``client_kwargs={"endpoint_url": ...}`` and the like).
    index : bool
        Index the bodies by their ids (``traj.sel(body=42)``). The index is read into this
        process, 8 bytes a body (1 GiB at 512^3 bodies, twice that while it is built);
        ``False`` leaves the ids a lazy coordinate, read (and checked) by the workers that
        need them: for analyses of large runs (``isel`` still works, and ``time`` and
        ``axis`` are indexed either way).

    Returns
    -------
    xarray.Dataset
        Dask-backed; ``position(time, body, axis)``, ``velocity``, ``mass(body)`` and the
        diagnostics. The run configuration is in ``attrs["config"]`` (JSON).

    Raises
    ------
    FileNotFoundError
        If nothing exists at ``store``.
    ValueError
        If ``store`` is not an nbody_dask store, or it is damaged.
    StoreUnreachableError
        If the object store cannot be reached or refuses the credentials.
    """
    location = store_location(store, storage_options)
    location.check_reachable()
    if not location.exists():
        raise FileNotFoundError(f"no trajectory store at {str(location)!r}")
    root = _open_root(location)
    committed = _committed(root, location)
    for name in _LAID_OUT:  # read (or, for mass, looked at) before xarray reads them
        _check_laid_out(location, root, name, read=index or name != "body")
    try:
        ds = xr.open_zarr(location.zarr_store(read_only=True), create_default_indexes=index)
        if not index:  # the small coordinates indexed all the same (traj.sel(time=...))
            ds = ds.set_xindex("time").set_xindex("axis")
    except Exception as exc:  # zarr and xarray raise many kinds here
        raise ValueError(f"store {str(location)!r} is damaged: {type(exc).__name__}: "
                         f"{exc}") from None
    # Consolidated metadata would hide an array deleted from disk: look at the real ones.
    missing = sorted(name for name in {"position", "velocity", "mass", *_SCALARS, *_VECTORS}
                     if not location.exists(f"{name}/zarr.json"))
    if missing or "config" not in ds.attrs:
        what = f"variables {missing}" if missing else "the config attribute"
        raise ValueError(f"store {str(location)!r} is damaged: {what} missing")
    if committed > ds.sizes["time"]:
        raise ValueError(f"store {str(location)!r} is damaged: {committed} snapshots committed "
                         f"but {ds.sizes['time']} laid out")
    ds = ds.isel(time=slice(0, committed))
    for name in ("position", "velocity", "mass", *_SCALARS, *_VECTORS,
                 *[name for name in (_ERRORS, _BINS, _EVALUATIONS) if name in ds]):
        reader = _CheckedReader(location, name, committed if name != "mass" else None)
        ds[name] = ds[name].copy(deep=False, data=da.from_array(
            reader, chunks=ds[name].data.chunks, name=f"nbody-read-{name}-{tokenize(reader)}"))
    if not index:  # the ids checked where read, as the masses
        reader = _CheckedReader(location, "body", None)
        ids = ds["body"].variable.copy(deep=False, data=da.from_array(
            reader, chunks=ds["body"].data.chunks, name=f"nbody-read-body-{tokenize(reader)}"))
        ds = ds.assign_coords(xr.Coordinates({"body": ids}, indexes={}))
    return ds


#: Variables laid out whole when the store is created (coordinates and masses): every chunk
#: must be on disk from the start.
_LAID_OUT = ("time", "step", "body", "mass")


def _check_laid_out(location: StoreLocation, root: zarr.Group, name: str,
                    read: bool = True) -> None:
    """Raise :class:`DamagedStoreError` naming the store, ``name`` and where, if a chunk of
    a variable written at layout is missing, or (coordinates, with ``read`` read here
    whole: xarray reads them anyway to index them) fails its check; a missing chunk would
    read as the fill value (NaN times, steps and body ids of 0) without a word."""
    try:
        array = root[name]
    except KeyError:
        raise ValueError(f"store {str(location)!r} is damaged: variable {name!r} missing"
                         ) from None
    if array.nchunks_initialized < array.nchunks:
        size = array.chunks[0]
        missing = next(i for i in range(array.nchunks) if not location.exists(f"{name}/c/{i}"))
        raise DamagedStoreError(f"store {str(location)!r} is damaged: "
                                f"{_where(name, missing * size, (missing + 1) * size)} of "
                                f"{name!r}: a chunk is missing")
    if name == "mass" or not read:  # as large as the bodies: checked where read
        return  # (_CheckedReader)
    try:
        array[:]
    except store_faults() as exc:  # the store failed to answer: not damage
        raise OSError(f"reading the store {str(location)!r} failed ({describe_error(exc)})"
                      ) from None
    except Exception as exc:  # checksum mismatch, truncation, decompression failure
        raise DamagedStoreError(f"store {str(location)!r} is damaged: "
                                f"{_where(name, 0, array.shape[0])} of {name!r}: a chunk "
                                f"fails its check ({type(exc).__name__}: {exc})") from None


def _where(name: str, lo: int, hi: int) -> str:
    """Which snapshots or bodies ``lo:hi`` of variable ``name`` are."""
    if name in ("body", "mass"):
        return f"bodies {lo}..{hi - 1}"
    return f"snapshot {lo}" if hi - lo == 1 else f"snapshots {lo}..{hi - 1}"


class DamagedStoreError(ValueError):
    """A committed chunk of a store failed its checksum, is truncated or is missing."""


class _CheckedReader:
    """Committed snapshots of one variable (or, for ``mass``, its bodies), read so that damage
    names the snapshot (or bodies) and the variable.

    Every chunk carries a CRC-32C: a flipped or truncated chunk fails to decode. A missing
    chunk would read as the fill value, NaN, which no committed snapshot holds (a run stops
    at its first non-finite state): NaN is reported as a missing chunk.
    """

    def __init__(self, path: StoreLocation, name: str, committed: int | None) -> None:
        self.path, self.name = path, name
        self._array = array = zarr.open_array(store=path.zarr_store(read_only=True),
                                              path=name, mode="r")
        self.shape = array.shape if committed is None else (committed, *array.shape[1:])
        self.dtype = array.dtype
        self.ndim = array.ndim
        self.chunks = array.chunks
        self._mtime = path.modified(f"{name}/zarr.json")

    def __dask_tokenize__(self):
        return (str(self.path), self.name, self.shape, self._mtime)

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        times = range(self.shape[0])[key[0]] if isinstance(key[0], slice) else [key[0]]
        try:
            values = self._array[key]
        except store_faults() as exc:  # the store failed to answer: not damage
            raise OSError(f"reading the store {str(self.path)!r} failed ({describe_error(exc)})"
                          ) from None
        except Exception as exc:  # checksum mismatch, truncation, decompression failure
            raise self._damaged(times, f"a chunk fails its check ({type(exc).__name__}: "
                                       f"{exc})") from None
        if values.dtype.kind == "f" and np.isnan(values).any():
            bad = np.isnan(values).reshape(len(times), -1).any(axis=1) if len(times) else []
            first = times[int(np.argmax(bad))] if len(times) > 1 else times[0]
            raise self._damaged([first], "a chunk is missing (it reads as the fill value)")
        return values

    def _damaged(self, times, what: str) -> DamagedStoreError:
        where = _where(self.name, times[0], times[-1] + 1) if len(times) else "nothing"
        return DamagedStoreError(f"store {str(self.path)!r} is damaged: {where} of "
                                 f"{self.name!r}: {what}")


def verify_trajectory(store: Store, storage_options: Mapping[str, Any] | None = None) -> int:
    """Read every committed chunk of a store, checking it; return the snapshots verified.

    Raises
    ------
    DamagedStoreError
        At the first damaged chunk, naming the snapshot and the variable.
    """
    ds = open_trajectory(store, storage_options)
    ds.load(scheduler="synchronous")
    return ds.sizes["time"]
