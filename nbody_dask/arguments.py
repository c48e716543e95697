"""What a caller asked for, checked before anything starts: arguments into a :class:`Plan`.

:class:`RunArguments` holds the keywords of :func:`nbody_dask.simulate` and the one-shot
evaluations that shape a run, None where the configuration's default applies
(:mod:`nbody_dask.config`). :meth:`RunArguments.plan` fills the defaults in and builds the
:class:`~nbody_dask.plan.Plan`, which checks every value itself (so a plan read back from a
store is checked the same way). :func:`fresh_start` and :func:`resume_point` add what a new
run or a resume needs of the bodies and the store. Nothing here starts a cluster or writes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import xarray as xr

from . import config
from ._validate import check_real
from .bodies import as_bodies, check_fits_dtype, resolve_dtype, wrap_positions
from .lease import refuse_if_in_use
from .location import StoreLocation, store_location
from .plan import Plan, check_backend, check_method, resolve_method
from .schema import stored_plan
from .storage import check_store_path, open_trajectory
from .units import code_value, declares_units

__all__ = ["RunArguments", "fresh_start", "resume_point", "start_time"]


@dataclass(frozen=True)
class RunArguments:
    """The keywords that shape a run, as given (None: the configured default)."""

    steps: int | None = None
    dt: Any = None
    softening: Any = None
    G: float | None = None
    snapshot_every: int | None = None
    dtype: Any = None
    tile_size: int | None = None
    split_every: int | None = None
    backend: str | None = None
    layout: str | None = None
    method: str | None = None
    theta: float | None = None
    leaf_size: int | None = None
    force_error_sample: int | None = None
    box_size: Any = None
    mesh_size: int | None = None
    mesh_slabs: int | None = None
    split: float | None = None
    cutoff: float | None = None

    def plan(self, n: int) -> Plan:
        """The plan of a run of ``n`` bodies: defaults from the configuration, ``"auto"``
        resolved; every value checked (by :class:`~nbody_dask.plan.Plan`)."""
        config.validate()
        asked = check_method(config.get("method", self.method))
        box_size = config.get("box-size", self.box_size)
        method = resolve_method(asked, n, box_size is not None)
        for name in ("steps", "dt"):
            if getattr(self, name) is None:
                raise TypeError(f"{name} is required")
        try:
            return Plan(
                n=n, steps=self.steps, dt=self.dt,
                softening=0.0 if self.softening is None else self.softening,
                G=1.0 if self.G is None else self.G,
                snapshot_every=self.snapshot_every,
                dtype=np.dtype(resolve_dtype(config.get("dtype", self.dtype))).name,
                tile_size=self.tile_size, split_every=self.split_every,
                backend=check_backend(config.get("backend", self.backend)),
                symmetric=bool(config.get("symmetric")), layout=self.layout, method=method,
                theta=self.theta, leaf_size=self.leaf_size,
                force_error_sample=self.force_error_sample or 0,
                box_size=box_size, mesh_size=self.mesh_size, mesh_slabs=self.mesh_slabs,
                split=self.split,
                cutoff=self.cutoff,
            )
        except ValueError as exc:
            if asked == method:
                raise
            raise ValueError(f"{exc} (method={asked!r} chose {method!r} for {n} bodies)"
                             ) from None

    def in_code_units(self, attrs: dict[str, Any]) -> RunArguments:
        """These arguments with the quantities among ``dt``, ``softening`` and
        ``box_size`` converted to the code units of a body set's unit system ``attrs``
        (:func:`~nbody_dask.units.code_value`: a ValueError naming the parameter for a
        quantity of the wrong kind or bodies without units)."""
        return replace(self, dt=code_value("dt", self.dt, attrs, "time"),
                       softening=code_value("softening", self.softening, attrs, "length"),
                       box_size=code_value("box_size", self.box_size, attrs, "length"))

    def check_resume(self, plan: Plan) -> None:
        """Refuse an argument given on resume that differs from the stored ``plan``'s."""
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None or field.name == "backend" or (field.name == "method"
                                                              and value == "auto"):
                continue
            if field.name == "dtype":
                value = np.dtype(resolve_dtype(value)).name
            expected = getattr(plan, field.name)
            if value != expected:
                raise ValueError(f"resume: {field.name}={value!r} differs from the store's "
                                 f"{field.name}={expected!r}")


def fresh_start(bodies: Any, store: Any, storage_options: dict | None, overwrite: bool,
                args: RunArguments) -> tuple[Plan, StoreLocation | None, xr.Dataset, float]:
    """Check a new run: its plan, store location, body set and start time."""
    missing = [k for k, v in (("bodies", bodies), ("steps", args.steps), ("dt", args.dt))
               if v is None]
    if missing:
        raise TypeError(f"simulate() needs {', '.join(missing)} (or resume=True with a store)")
    ds = as_bodies(bodies)
    if args.G not in (None, 1) and declares_units(ds.attrs):
        raise ValueError(f"G={args.G!r}: the bodies are in physical units, whose code units "
                         "set G = 1 (nbody_dask.units); leave G out")
    args = args.in_code_units(ds.attrs)
    plan = args.plan(ds.sizes["body"])
    check_fits_dtype(ds, plan.dtype, dt=plan.dt, softening=plan.softening, G=plan.G,
                     dt_half=0.5 * plan.dt, softening_squared=plan.softening**2,
                     **({} if plan.box_size is None else {"box_size": plan.box_size}))
    ds = wrap_positions(ds, plan.box_size)
    if store is None and storage_options is not None:
        raise ValueError("storage_options are for store=<an object-store URL>; no store given")
    path = None if store is None else check_store_path(store, overwrite, storage_options)
    return plan, path, ds, start_time(bodies)


def resume_point(bodies: Any, store: Any, storage_options: dict | None, overwrite: bool,
                 args: RunArguments) -> tuple[Plan, StoreLocation, bool]:
    """Check a resume: the stored plan, the store location, and whether the run is done."""
    if store is None:
        raise ValueError("resume=True needs store=, the store of the run to continue")
    if bodies is not None:
        raise ValueError("resume=True continues from the store; do not pass bodies")
    if overwrite:
        raise ValueError("resume=True and overwrite=True conflict: choose one")
    path = store_location(store, storage_options)
    path.check_reachable()
    if not path.exists():
        raise FileNotFoundError(f"no trajectory store at {str(path)!r} to resume")
    refuse_if_in_use(path)
    ds = open_trajectory(path)  # validates the store
    plan = stored_plan(ds, check_backend(config.get("backend", args.backend)))
    args = args.in_code_units(ds.attrs)
    args.check_resume(plan)
    if ds.sizes["time"] == 0:
        raise ValueError(f"store {str(path)!r} has no committed snapshot to resume from; "
                         "start a new run with overwrite=True")
    return plan, path, ds.sizes["time"] == len(plan.snapshot_steps())


def start_time(bodies: Any) -> float:
    """The start time of a run: a body set's scalar ``time`` coordinate (a snapshot's), or 0."""
    if isinstance(bodies, xr.Dataset) and "time" in bodies.coords and bodies["time"].ndim == 0:
        return check_real("bodies.time", bodies["time"].item())
    return 0.0
