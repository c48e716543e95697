"""The body set: construction, validation at the public boundary, and tiling.

A body set is an :class:`xarray.Dataset` with ``position(body, axis)``,
``velocity(body, axis)`` and ``mass(body)``; ``axis`` is ``["x", "y", "z"]``. Plain NumPy
arrays are accepted through :func:`make_bodies` or a mapping with those three keys.

Inside the task graph the bodies travel as :class:`Tile` objects: contiguous runs of bodies in
structure-of-arrays layout. Tiles have equal length except the last, which holds the
remainder: no body is ever dropped and no padding is needed, because every kernel accepts any
tile length.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import xarray as xr
from dask import is_dask_collection

from .plan import tile_bounds

__all__ = ["make_bodies", "as_bodies", "Tile", "split_tiles", "resolve_dtype",
           "check_fits_dtype", "wrap", "wrap_positions", "is_lazy", "lazy_bodies",
           "check_values", "make_tile", "BodySummary", "summarize"]

AXES = ("x", "y", "z")
_DTYPES = {"float32": np.float32, "float64": np.float64}


def resolve_dtype(dtype: Any) -> type[np.floating]:
    """Return ``np.float32`` or ``np.float64`` for a dtype-like, or raise.

    Raises
    ------
    ValueError
        For anything but float32 or float64, naming what was received.
    """
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in _DTYPES:
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    return _DTYPES[name]


def make_bodies(
    position: Any,
    velocity: Any | None = None,
    mass: Any | None = None,
    *,
    body: Any | None = None,
    length_unit: Any | None = None,
    mass_unit: Any | None = None,
) -> xr.Dataset:
    """Build a validated body set from plain arrays, or from astropy quantities.

    Parameters
    ----------
    position : array_like, shape (n, 3)
        Positions.
    velocity : array_like, shape (n, 3), optional
        Velocities; zero when omitted.
    mass : array_like, shape (n,) or scalar, optional
        Masses; ``1 / n`` each (total mass 1) when omitted. A scalar is given to every body.
    body : array_like of int, shape (n,), optional
        Body identifiers; ``0 .. n-1`` when omitted.
    length_unit, mass_unit : astropy.units.Quantity, optional
        With quantities: the code units (see :mod:`nbody_dask.units`); by default one of the
        positions' unit and the total mass.

    Returns
    -------
    xarray.Dataset
        ``position(body, axis)``, ``velocity(body, axis)``, ``mass(body)``, float64. Given
        quantities (positions in kpc, velocities in km/s, masses in solar masses, any
        consistent set), the values are in code units with G = 1 and the attributes
        ``length_unit``, ``mass_unit``, ``time_unit``, ``velocity_unit`` say what one code
        unit is; give ``dt`` and the softening of :func:`nbody_dask.simulate` in those units.
    """
    from .units import is_quantity, to_code_units

    system = None
    if any(is_quantity(v) for v in (position, velocity, mass)):
        position, velocity, mass, system = to_code_units(
            position, velocity, mass, length_unit=length_unit, mass_unit=mass_unit)
    elif length_unit is not None or mass_unit is not None:
        raise ValueError("length_unit and mass_unit go with positions, velocities and masses "
                         "given as astropy quantities")
    pos = _as_float_array("position", position)
    n = pos.shape[0] if pos.ndim == 2 else 0
    vel = np.zeros_like(pos) if velocity is None else _as_float_array("velocity", velocity)
    if mass is None:
        m = np.full(n, 1.0 / max(n, 1))
    else:
        m = _as_float_array("mass", mass)
        if m.ndim == 0:
            m = np.full(n, float(m))
    _check_shapes(pos, vel, m)
    ids = np.arange(n) if body is None else _check_ids(body, n)
    ds = xr.Dataset(
        {
            "position": (("body", "axis"), pos),
            "velocity": (("body", "axis"), vel),
            "mass": ("body", m),
        },
        coords={"body": ids, "axis": list(AXES)},
    )
    ds = as_bodies(ds)
    if system is not None:
        ds.attrs.update(system.attrs())
    return ds


def as_bodies(bodies: Any) -> xr.Dataset:
    """Validate a body set and return it as a float64 Dataset in memory.

    Parameters
    ----------
    bodies : xarray.Dataset or Mapping
        A Dataset with ``position(body, axis)``, ``velocity(body, axis)`` and ``mass(body)``,
        or a mapping with keys ``"position"``, ``"velocity"`` and ``"mass"`` holding arrays.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    TypeError
        If ``bodies`` is neither a Dataset nor a mapping, or a variable is not numeric.
    ValueError
        For a missing variable, mismatched shapes, non-finite values, negative masses or a
        total mass that is not positive.
    """
    if isinstance(bodies, xr.Dataset):
        _check_variables(bodies)
        pos = _as_float_array("position", bodies["position"])
        vel = _as_float_array("velocity", bodies["velocity"])
        m = _as_float_array("mass", bodies["mass"].values)
        ids = bodies["body"].values if "body" in bodies.coords else None
        attrs = dict(bodies.attrs)
    elif isinstance(bodies, Mapping):
        missing = [k for k in ("position", "velocity", "mass") if k not in bodies]
        if missing:
            raise ValueError(f"bodies mapping is missing key(s) {missing}")
        pos = _as_float_array("position", bodies["position"])
        vel = _as_float_array("velocity", bodies["velocity"])
        m = _as_float_array("mass", bodies["mass"])
        ids = None
        attrs = {}
    else:
        raise TypeError(
            "bodies must be an xarray.Dataset with position, velocity and mass, or a mapping "
            f"of those names to arrays; got {type(bodies).__name__}"
        )
    _check_shapes(pos, vel, m)
    _check_values(pos, vel, m)
    ids = np.arange(pos.shape[0]) if ids is None else _check_ids(ids, pos.shape[0])
    ds = xr.Dataset(
        {
            "position": (("body", "axis"), pos),
            "velocity": (("body", "axis"), vel),
            "mass": ("body", m),
        },
        coords={"body": np.asarray(ids), "axis": list(AXES)},
        attrs=attrs,
    )
    return ds


def is_lazy(bodies: Any) -> bool:
    """Whether ``bodies`` is a Dataset whose positions or velocities are Dask arrays
    (:func:`nbody_dask.cosmological_ics`, ``xr.open_zarr`` of a body set or a snapshot):
    :func:`lazy_bodies` checks it without loading it, the workers build their tiles from it
    (:func:`make_tile`)."""
    return isinstance(bodies, xr.Dataset) and all(
        name in bodies for name in ("position", "velocity", "mass")) and any(
        bodies[name].chunks is not None for name in ("position", "velocity"))


def lazy_bodies(bodies: xr.Dataset) -> xr.Dataset:
    """Check a body set held as Dask arrays (:func:`is_lazy`) as :func:`as_bodies` does,
    without computing it: variables, dims, dtypes and shapes here; the values (finite,
    masses, and that lazy ids are unique) by :func:`check_values` once a cluster computes a
    few numbers of them. Returns the float64 Dataset of Dask arrays, with its attributes,
    scalar ``time`` and ids: ids in memory checked here, lazy ones (``0 .. n-1`` made so
    where there are none) kept lazy, without an index."""
    import dask.array as da

    _check_variables(bodies)
    for name in ("position", "velocity", "mass"):
        dtype = bodies[name].dtype
        if dtype.kind not in "iuf":
            raise TypeError(f"{name} must hold real numbers, got dtype {dtype}")
    if "axis" in bodies.coords and [str(a).lower() for a in bodies["axis"].values] != list(AXES):
        raise ValueError(f"bodies' axis labels must be {list(AXES)} in this order for a lazy "
                         f"body set, got {list(bodies['axis'].values)}")
    data = {name: da.asarray(bodies[name].data).astype(np.float64)
            for name in ("position", "velocity", "mass")}
    _check_shapes(data["position"], data["velocity"], data["mass"])
    n = data["position"].shape[0]
    coords: dict[str, Any] = {"axis": list(AXES)}
    if "time" in bodies.coords and bodies["time"].ndim == 0:
        coords["time"] = bodies["time"].item()
    ds = xr.Dataset(
        {"position": (("body", "axis"), data["position"]),
         "velocity": (("body", "axis"), data["velocity"]),
         "mass": ("body", data["mass"])},
        coords=coords, attrs=dict(bodies.attrs))
    ids = bodies["body"].variable if "body" in bodies.coords else xr.Variable(
        "body", da.arange(n, dtype=np.int64, chunks=data["position"].chunks[0]))
    if ids.chunks is not None:  # lazy ids (cosmological_ics, a store opened with index=False)
        _check_id_kind(ids, n)
        # kept lazy and unindexed: the workers write them, check_values checks them
        return ds.assign_coords(xr.Coordinates({"body": ids}, indexes={}))
    _check_ids(ids.values, n)
    # the ids' own variable: a new coordinate from their values would copy them (8 bytes a
    # body, in the driver)
    return ds.assign_coords(body=ids)


def check_values(ds: xr.Dataset, summary: BodySummary | None = None) -> None:
    """Refuse non-finite values, negative masses and a total mass that is not positive, as
    :func:`as_bodies` does; for a lazy body set, from a few numbers its cluster computes
    (the default scheduler's: a run's client), or from its ``summary`` if given."""
    _check_values(ds["position"].data, ds["velocity"].data, ds["mass"].data, summary)
    ids = ds["body"].data if "body" in ds.coords else None
    if ids is not None and is_dask_collection(ids):
        ascending = _ascending(_block_orders(ids).compute()) if summary is None \
            else summary.ids_ascending
        if not ascending:  # unique only if no two are equal: gathered here to find out
            _check_ids(ids.compute(), ids.shape[0])


@dataclass(frozen=True)
class BodySummary:
    """The few numbers of a body set that the checks of its values read
    (:func:`check_values`, :func:`check_fits_dtype`), computed in one pass by
    :func:`summarize`: non-finite values of position, velocity and mass, negative masses,
    the total mass, the largest ``|value|`` of each variable, the positions' per-axis
    maximum and minimum, and for lazy body ids whether they ascend strictly (then they are
    unique without being gathered; None for ids in memory, checked when the set was made)."""

    non_finite: tuple[int, int, int]
    negative_masses: int
    total_mass: float
    largest: dict[str, float]
    high: np.ndarray
    low: np.ndarray
    ids_ascending: bool | None = None


def summarize(ds: xr.Dataset) -> BodySummary:
    """:class:`BodySummary` of ``ds``, NumPy or Dask (computed by the default scheduler: a
    run's client, reading a lazy set once)."""
    import dask

    names = ("position", "velocity", "mass")
    data = [ds[name].data for name in names]
    n = ds.sizes["body"]
    empty = np.zeros(3)
    ids = ds["body"].data if "body" in ds.coords else None
    lazy_ids = ids is not None and is_dask_collection(ids)
    values = dask.compute(*[(~np.isfinite(a)).sum() for a in data], (data[2] < 0).sum(),
                          data[2].sum(), *[abs(a).max() if n else 0.0 for a in data],
                          data[0].max(axis=0) if n else empty,
                          data[0].min(axis=0) if n else empty,
                          _block_orders(ids) if lazy_ids else empty)
    return BodySummary(tuple(int(v) for v in values[:3]), int(values[3]), float(values[4]),
                       {name: float(v) for name, v in zip(names, values[5:8], strict=True)},
                       np.asarray(values[8]), np.asarray(values[9]),
                       _ascending(values[10]) if lazy_ids else None)


def _block_orders(ids: Any) -> Any:
    """The Dask array of :func:`_order_of_block` of each chunk of lazy ``ids``, three
    numbers a chunk."""
    return ids.map_blocks(_order_of_block, dtype=np.int64, chunks=((3,) * ids.numblocks[0],))


def _order_of_block(ids: np.ndarray) -> np.ndarray:
    """(first, last, whether strictly ascending) of one chunk of body ids; (0, -1, 1) for
    an empty chunk."""
    if ids.size == 0:
        return np.array([0, -1, 1], dtype=np.int64)
    ascending = ids.size < 2 or bool((ids[1:] > ids[:-1]).all())
    return np.array([ids[0], ids[-1], ascending], dtype=np.int64)


def _ascending(orders: np.ndarray) -> bool:
    """Whether chunks of ids whose :func:`_order_of_block` are ``orders`` ascend strictly
    as a whole."""
    first, last, ascending = np.asarray(orders).reshape(-1, 3).T
    filled = last >= first  # empty chunks say nothing
    return bool(ascending.all() and (first[filled][1:] > last[filled][:-1]).all())


def _check_variables(bodies: xr.Dataset) -> None:
    """Refuse a Dataset without position, velocity and mass of the body set's dims."""
    missing = [k for k in ("position", "velocity", "mass") if k not in bodies]
    if missing:
        raise ValueError(
            f"bodies is missing variable(s) {missing}; it needs position(body, axis), "
            f"velocity(body, axis) and mass(body), has {sorted(map(str, bodies.data_vars))}"
        )
    for name, dims in (("position", ("body", "axis")), ("velocity", ("body", "axis")),
                       ("mass", ("body",))):
        if bodies[name].dims != dims:
            raise ValueError(f"bodies.{name} must have dims {dims}, got {bodies[name].dims}")


def _axis_labels(value: Any) -> list | None:
    """The labels of the last axis of a DataFrame or DataArray, None for plain arrays."""
    if isinstance(value, xr.DataArray):
        return list(value["axis"].values) if "axis" in value.coords else None
    columns = getattr(value, "columns", None)  # a pandas DataFrame
    if columns is None:
        return None
    labels = list(columns)
    return None if labels == list(range(len(labels))) else labels


def _in_xyz_order(name: str, value: Any, arr: np.ndarray) -> np.ndarray:
    """Reorder columns labelled x, y, z (any order, any case) to x, y, z; refuse other labels."""
    labels = _axis_labels(value)
    if labels is None or arr.ndim != 2:
        return arr
    keys = [str(label).lower() for label in labels]
    if sorted(keys) != sorted(AXES):
        raise ValueError(f"{name} axis labels must be {list(AXES)} (in any order), "
                         f"got {labels}")
    return arr[:, [keys.index(axis) for axis in AXES]]


def _check_id_kind(ids: Any, n: int) -> None:
    """Refuse ids (NumPy or Dask) of another shape than ``(n,)`` or not integers."""
    if ids.shape != (n,):
        raise ValueError(f"body ids must have shape ({n},), got {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"body ids must be integers, got dtype {ids.dtype}")


def _check_ids(ids: Any, n: int) -> np.ndarray:
    ids = np.asarray(ids)
    _check_id_kind(ids, n)
    if n < 2 or (ids[1:] > ids[:-1]).all():  # ascending (as generated ICs are): no sort,
        return ids                             # which would hold 4 copies of the ids
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        repeated = unique[counts > 1][:5].tolist()
        raise ValueError(f"body ids must be unique; repeated: {repeated}")
    return ids


def _as_float_array(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be array-like of numbers: {exc}") from None
    arr = _in_xyz_order(name, value, arr)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.number)):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return np.array(arr, dtype=np.float64)


def _check_shapes(pos: np.ndarray, vel: np.ndarray, m: np.ndarray) -> None:
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise ValueError(f"position must have shape (n, 3), got {pos.shape}")
    n = pos.shape[0]
    if n < 1:
        raise ValueError("position must hold at least one body, got shape (0, 3)")
    if vel.shape != pos.shape:
        raise ValueError(f"velocity has shape {vel.shape} but position has shape {pos.shape}")
    if m.shape != (n,):
        raise ValueError(f"mass must have shape ({n},) to match position, got {m.shape}")


def wrap(position: np.ndarray, box: float) -> np.ndarray:
    """Positions moved by whole box sides into ``[0, box)``, in their dtype (a value that
    rounds up to ``box`` becomes 0)."""
    side = position.dtype.type(box)
    with np.errstate(over="ignore", invalid="ignore"):
        out = position - side * np.floor(position / side)
    return np.where(out >= side, out - side, out)


def wrap_positions(ds: xr.Dataset, box: float | None) -> xr.Dataset:
    """The body set with positions moved by whole box sides into ``[0, box)`` (:func:`wrap`
    in float64), for a periodic cube of side ``box``; ``ds`` itself when ``box`` is None or
    every body is inside already."""
    if box is None:
        return ds
    if ds["position"].chunks is not None:  # lazy: wrapped where the blocks are computed
        return ds.assign(position=ds["position"].copy(
            deep=False,  # a deep copy would copy the body ids, 8 bytes a body
            data=ds["position"].data.map_blocks(wrap, box, dtype=ds["position"].dtype)))
    position = ds["position"].values.astype(np.float64)
    wrapped = wrap(position, box)
    if np.array_equal(wrapped, position):
        return ds
    return ds.assign(position=ds["position"].copy(deep=False,
                                                  data=wrapped.astype(ds["position"].dtype)))


def check_fits_dtype(ds: xr.Dataset, dtype: Any, summary: BodySummary | None = None,
                     **scalars: float) -> None:
    """Refuse bodies and parameters that the run's dtype cannot hold, before any work starts.

    Positions must stay below ``sqrt(max) / 4`` of the dtype, so that squared separations
    cannot overflow; and the bodies' mean spacing (their extent over ``cbrt(n)``, softened
    by ``softening`` if given) must be zero (coincident bodies pull each other with nothing)
    or above ``4 max^(-1/3)`` (5.7e-13 in float32), so that a kernel's ``1 / r^3`` of
    typical pairs does not overflow; velocities and masses, and each named scalar
    (``dt=...``), must be finite and nonzero where they were nonzero once cast. The bodies'
    numbers come from ``summary`` (:func:`summarize`), computed here if not given.

    Raises
    ------
    ValueError
        Naming the quantity, its value and the dtype.
    """
    ftype = resolve_dtype(dtype)
    info = np.finfo(ftype)
    name = np.dtype(ftype).name
    reach = float(np.sqrt(info.max)) / 4
    n = ds.sizes["body"]
    summary = summarize(ds) if summary is None else summary
    largest = summary.largest
    for var, limit in (("position", reach), ("velocity", float(info.max)),
                       ("mass", float(info.max))):
        if float(largest[var]) > limit:
            raise ValueError(f"{var} reaches {float(largest[var])!r}, beyond what {name} "
                             f"holds (|{var}| <= {limit:.3g}); use dtype='float64' or "
                             f"rescale the units")
    if n > 1:
        extent = float((summary.high - summary.low).max())
        spacing = extent / n ** (1 / 3)
        closest = 4 * float(info.max) ** (-1 / 3)
        if 0 < np.hypot(spacing, float(scalars.get("softening", 0.0))) < closest:
            raise ValueError(f"position spans only {extent!r} (mean spacing {spacing:.3g}): "
                             f"the forces of bodies this close overflow {name} (spacing, "
                             f"softened, >= {closest:.3g}); use dtype='float64' or rescale "
                             "the units")
    for key, value in scalars.items():
        with np.errstate(over="ignore", under="ignore"):
            cast = ftype(value)
        if not np.isfinite(cast) or (value != 0 and cast == 0):
            raise ValueError(f"{key}={value!r} is not representable in {name} "
                             f"(it becomes {float(cast)!r})")


def _check_values(pos: Any, vel: Any, m: Any, summary: BodySummary | None = None) -> None:
    """The checks of :func:`check_values` on the arrays, NumPy or Dask (then a few numbers
    computed in one pass, or read from ``summary``, and the first bad body's index and
    value if there is one)."""
    import dask

    names = ("position", "velocity", "mass")
    arrays = dict(zip(names, (pos, vel, m), strict=True))
    bad = {name: ~np.isfinite(arrays[name]) for name in names}
    counts = (dask.compute(*[bad[name].sum() for name in names], (m < 0).sum(), m.sum())
              if summary is None else
              (*summary.non_finite, summary.negative_masses, summary.total_mass))
    for name, count in zip(names, counts, strict=False):
        if count:
            flat = int(dask.compute(bad[name].ravel().argmax())[0])
            where = np.unravel_index(flat, bad[name].shape)
            value = float(dask.compute(arrays[name][where])[0])
            raise ValueError(f"{name} has {int(count)} non-finite value(s); first at index "
                             f"{tuple(int(i) for i in where)}: {value!r}")
    if counts[3]:
        i = int(dask.compute((m < 0).argmax())[0])
        raise ValueError(f"mass must be >= 0; body {i} has mass {float(dask.compute(m[i])[0])!r}")
    if not float(counts[4]) > 0:
        raise ValueError(f"total mass must be > 0, got {float(counts[4])!r}")


@dataclass(frozen=True)
class Tile:
    """A contiguous run of bodies, structure of arrays, as held by a Dask worker.

    Attributes
    ----------
    start : int
        Index of the tile's first body in the body set.
    position, velocity : ndarray, shape (3, n)
        Rows x, y, z; C-contiguous, in the run's dtype.
    mass : ndarray, shape (n,)
    acceleration : ndarray, shape (3, n), optional
        G already applied; None where not yet known (between drift and force).
    potential : ndarray, shape (n,), optional
        Gravitational potential per unit mass (G applied), on snapshot steps only.
    ids : ndarray of int64, shape (n,), optional
        Each body's index in the body set, for a tile of bodies gathered from anywhere (a
        spatial tile of the tree method, :mod:`nbody_dask.spatial`); None for a contiguous
        run, whose bodies are ``start, start + 1, ...``.
    time_bin : ndarray of int8, shape (n,), optional
        Each body's time bin in a run with individual time steps (:mod:`nbody_dask.
        timebins`); None otherwise.
    long_acceleration : ndarray, shape (3, n), optional
        With individual time steps in a periodic box (TreePM): the long-range (mesh)
        acceleration of the block's start, which kicks every body by half a block at each
        end of the block (:attr:`acceleration` is then the short-range part, kicked bin by
        bin); None otherwise.
    """

    start: int
    position: np.ndarray
    velocity: np.ndarray
    mass: np.ndarray
    acceleration: np.ndarray | None = None
    potential: np.ndarray | None = None
    ids: np.ndarray | None = None
    time_bin: np.ndarray | None = None
    long_acceleration: np.ndarray | None = None

    @property
    def size(self) -> int:
        return self.mass.shape[0]

    @property
    def body_ids(self) -> np.ndarray:
        """Each body's index in the body set (int64)."""
        if self.ids is not None:
            return self.ids
        return np.arange(self.start, self.start + self.size, dtype=np.int64)

    def take(self, index: np.ndarray) -> Tile:
        """The bodies ``index`` of this tile (in that order), with their ids."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.ascontiguousarray(a[..., index])

        return Tile(-1, pick(self.position), pick(self.velocity), pick(self.mass),
                    pick(self.acceleration), pick(self.potential), self.body_ids[index],
                    pick(self.time_bin), pick(self.long_acceleration))

    def evolve(self, **changes: Any) -> Tile:
        """A copy with some fields replaced (tiles are immutable once on a worker)."""
        return replace(self, **changes)


def split_tiles(bodies: xr.Dataset, tile_size: int, dtype: type[np.floating]) -> list[Tile]:
    """Cut a validated body set into tiles of the run's dtype."""
    pos, vel, mass = (bodies[name].values for name in ("position", "velocity", "mass"))
    return [make_tile(lo, pos[lo:hi], vel[lo:hi], mass[lo:hi], dtype)
            for lo, hi in tile_bounds(pos.shape[0], tile_size)]


def make_tile(start: int, position: np.ndarray, velocity: np.ndarray, mass: np.ndarray,
              dtype: type[np.floating]) -> Tile:
    """The tile of bodies ``start ..`` from their rows of a body set (``position`` and
    ``velocity`` (n, 3), ``mass`` (n,)), in the run's dtype: what a worker builds of a lazy
    body set, and :func:`split_tiles` of one in memory (the same bits)."""
    return Tile(start, np.array(np.asarray(position).T, dtype=dtype, order="C"),
                np.array(np.asarray(velocity).T, dtype=dtype, order="C"),
                np.array(mass, dtype=dtype, order="C"))
