"""What a caller asked for, checked before anything starts: arguments into a :class:`Plan`.

:class:`RunArguments` holds the keywords of :func:`nbody_dask.simulate` and the one-shot
evaluations that shape a run, None where the configuration's default applies
(:mod:`nbody_dask.config`). :meth:`RunArguments.plan` fills the defaults in and builds the
:class:`~nbody_dask.plan.Plan`, which checks every value itself (so a plan read back from a
store is checked the same way). :func:`fresh_start` and :func:`resume_point` add what a new
run or a resume needs of the bodies and the store. Nothing here starts a cluster or writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import xarray as xr

from . import config
from ._validate import check_real
from .bodies import (as_bodies, check_fits_dtype, check_values, is_lazy, lazy_bodies,
                     resolve_dtype, summarize, wrap_positions)
from .cosmology import as_cosmology, to_json
from .lease import refuse_if_in_use
from .location import StoreLocation, store_location
from .plan import Plan, check_backend, check_method, comoving_steps, resolve_method
from .schema import stored_plan
from .storage import check_store_path, open_trajectory
from .units import code_value, declares_units

__all__ = ["RunArguments", "fresh_start", "resume_point", "start_time", "check_on_cluster",
           "with_bodies_box"]


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
    cosmology: Any = None
    a_end: float | None = None
    z_end: float | None = None
    snapshot_redshifts: Any = None
    timestep: str | None = None
    step_criterion: str | None = None
    eta: float | None = None
    time_bins: int | None = None
    #: whether ``box_size`` came from the bodies' attribute (:func:`with_bodies_box`)
    box_from_bodies: bool = False

    def plan(self, n: int, a_start: float | None = None) -> Plan:
        """The plan of a run of ``n`` bodies: defaults from the configuration, ``"auto"``
        resolved; every value checked (by :class:`~nbody_dask.plan.Plan`). A cosmological
        run starts at scale factor ``a_start``."""
        config.validate()
        asked = check_method(config.get("method", self.method))
        box_size = config.get("box-size", self.box_size)
        method = resolve_method(asked, n, box_size is not None)
        steps, dt, comoving = self.steps, self.dt, self.comoving_fields(a_start)
        if comoving:
            steps, dt, comoving["output_steps"] = self._comoving_steps(comoving["a_outputs"])
        for name, value in (("steps", steps), ("dt", dt)):
            if value is None:
                raise TypeError(f"{name} is required")
        try:
            return Plan(
                n=n, steps=steps, dt=dt, **comoving,
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
                timestep=self.timestep, step_criterion=self.step_criterion, eta=self.eta,
                time_bins=self.time_bins,
            )
        except ValueError as exc:
            notes = [] if asked == method else [f"method={asked!r} chose {method!r} for {n} "
                                                "bodies"]
            if self.box_from_bodies and box_size is not None:
                notes.append(f"box_size={box_size!r} is the bodies' attribute: a periodic "
                             "box; del bodies.attrs['box_size'] for an isolated system")
            if not notes:
                raise
            raise ValueError(f"{exc} ({'; '.join(notes)})") from None

    def comoving_fields(self, a_start: float | None) -> dict[str, Any]:
        """A cosmological run's plan fields (``cosmology`` as JSON, ``a_start``, ``a_end``
        from ``a_end`` or ``z_end``, default 1, and ``a_outputs``: with the scale factors of
        ``snapshot_redshifts`` between them); empty without a cosmology."""
        if self.cosmology is None:
            for name in ("a_end", "z_end", "snapshot_redshifts"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is for cosmological runs: give cosmology=")
            return {}
        if self.a_end is not None and self.z_end is not None:
            raise ValueError(f"give a_end or z_end, not both (got a_end={self.a_end!r}, "
                             f"z_end={self.z_end!r})")
        if a_start is None:
            raise ValueError("a cosmological run starts at the bodies' scale factor: give "
                             "bodies with a scalar time coordinate, the scale factor "
                             "(cosmological_ics sets it)")
        a_start = check_real("the bodies' scale factor (time)", a_start, positive=True)
        if self.z_end is not None:
            z_end = check_real("z_end", self.z_end)
            if z_end <= -1:
                raise ValueError(f"z_end must be > -1, got {self.z_end!r}")
            a_end = 1 / (1 + z_end)
        else:
            a_end = 1.0 if self.a_end is None else check_real("a_end", self.a_end,
                                                                positive=True)
        if a_end <= a_start:
            raise ValueError(f"the run must end after it starts: a_end={a_end!r} <= the "
                             f"bodies' scale factor {a_start!r}")
        outputs = [a_start, a_end]
        if self.snapshot_redshifts is not None:
            try:
                redshifts = [float(z) for z in np.atleast_1d(self.snapshot_redshifts)]
            except (TypeError, ValueError):
                raise TypeError(f"snapshot_redshifts must be numbers, got "
                                f"{self.snapshot_redshifts!r}") from None
            inside = sorted({1 / (1 + z) for z in redshifts if z > -1})
            if len(inside) != len(set(redshifts)) or not all(
                    a_start < a <= a_end for a in inside):
                raise ValueError(f"snapshot_redshifts must lie after the start (z = "
                                 f"{1 / a_start - 1:.6g}) and not after the end (z = "
                                 f"{1 / a_end - 1:.6g}), got {self.snapshot_redshifts!r}")
            outputs = [a_start, *[a for a in inside if a < a_end], a_end]
        return {"cosmology": to_json(as_cosmology(self.cosmology)), "a_start": a_start,
                "a_end": a_end, "a_outputs": tuple(outputs)}

    def _comoving_steps(self, outputs: tuple[float, ...]) -> tuple[int, float, tuple]:
        """A cosmological run's steps (given, or from ``dt``, the largest step in ``ln a``),
        its largest step in ``ln a`` and the steps its ``outputs`` fall on."""
        if self.steps is not None and self.dt is not None:
            raise ValueError(f"a cosmological run takes steps or dt (its step in ln a), not "
                             f"both (got steps={self.steps!r}, dt={self.dt!r})")
        if self.steps is None:
            if self.dt is None:
                raise TypeError("a cosmological run needs steps= or dt= (the step in ln a)")
            counts = comoving_steps(list(outputs), dt=check_real("dt", self.dt,
                                                                 positive=True))
        else:
            steps = self.steps
            if not isinstance(steps, int) or isinstance(steps, bool):
                return steps, 1.0, (0, 1)  # Plan names the bad value
            if steps < 1:
                raise ValueError(f"steps must be >= 1 in a cosmological run, got {steps!r}")
            counts = comoving_steps(list(outputs), steps=steps)
        at = tuple(int(k) for k in np.cumsum([0, *counts]))
        dt = max(math.log(b / a) / n for a, b, n in zip(outputs[:-1], outputs[1:], counts,
                                                         strict=True))
        return at[-1], dt, at

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
            if value is None or field.name in ("backend", "box_from_bodies") or (
                    field.name == "method" and value == "auto"):
                continue
            if plan.comoving and field.name == "snapshot_redshifts":
                given = sorted(1 / (1 + float(z)) for z in np.atleast_1d(value))
                if not set(given) <= set(plan.a_outputs):
                    raise ValueError("resume: snapshot_redshifts differ from the store's")
                continue
            if plan.comoving and field.name in ("cosmology", "z_end", "dt"):
                if field.name == "cosmology" and to_json(as_cosmology(value)) \
                        != plan.cosmology:
                    raise ValueError("resume: cosmology differs from the store's")
                if field.name == "z_end" and 1 / (1 + value) != plan.a_end:
                    raise ValueError(f"resume: z_end={value!r} differs from the store's "
                                     f"a_end={plan.a_end!r}")
                continue  # dt: the store's is the step in ln a that it took
            if field.name == "dtype":
                value = np.dtype(resolve_dtype(value)).name
            expected = getattr(plan, field.name)
            if value != expected:
                raise ValueError(f"resume: {field.name}={value!r} differs from the store's "
                                 f"{field.name}={expected!r}")


def fresh_start(bodies: Any, store: Any, storage_options: dict | None, overwrite: bool,
                args: RunArguments) -> tuple[Plan, StoreLocation | None, xr.Dataset, float]:
    """Check a new run: its plan, store location, body set and start time."""
    comoving = args.cosmology is not None or "cosmology" in getattr(bodies, "attrs", {})
    required = [("bodies", bodies)] if comoving else [("bodies", bodies), ("steps", args.steps),
                                                      ("dt", args.dt)]
    missing = [k for k, v in required if v is None]
    if missing:
        raise TypeError(f"simulate() needs {', '.join(missing)} (or resume=True with a store)")
    lazy = is_lazy(bodies)
    ds = lazy_bodies(bodies) if lazy else as_bodies(bodies)
    if args.G not in (None, 1) and declares_units(ds.attrs):
        raise ValueError(f"G={args.G!r}: the bodies are in physical units, whose code units "
                         "set G = 1 (nbody_dask.units); leave G out")
    args = with_bodies_box(args, ds.attrs).in_code_units(ds.attrs)
    t0 = start_time(bodies)
    plan = args.plan(ds.sizes["body"], a_start=t0 if args.cosmology is not None else None)
    t0 = 0.0 if t0 is None else t0
    if not lazy:  # a lazy body set's values are checked on the cluster (check_on_cluster)
        ds = check_on_cluster(ds, plan)
    if store is None and storage_options is not None:
        raise ValueError("storage_options are for store=<an object-store URL>; no store given")
    path = None if store is None else check_store_path(store, overwrite, storage_options)
    return plan, path, ds, t0


def check_on_cluster(ds: xr.Dataset, plan: Plan) -> xr.Dataset:
    """The checks of a body set's values that a lazy one (:func:`~nbody_dask.bodies.
    is_lazy`) gets once its cluster is up, before anything is written (a few numbers of the
    bodies, computed by the cluster): finite values and masses (a set in memory had them in
    :func:`~nbody_dask.bodies.as_bodies`), what the run's dtype holds; then the positions
    wrapped into a periodic box (lazily for a lazy set)."""
    summary = summarize(ds)  # one pass over the bodies
    if is_lazy(ds):
        check_values(ds, summary)
    check_fits_dtype(ds, plan.dtype, summary, dt=plan.dt, softening=plan.softening, G=plan.G,
                     dt_half=0.5 * plan.dt, softening_squared=plan.softening**2,
                     **({} if plan.box_size is None else {"box_size": plan.box_size}))
    return wrap_positions(ds, plan.box_size)


def with_bodies_box(args: RunArguments, attrs: dict[str, Any],
                    cosmology: bool = True) -> RunArguments:
    """``args`` with the periodic box of bodies that carry one (a periodic run's snapshot,
    cosmological initial conditions: :func:`nbody_dask.cosmological_ics`) and, with
    ``cosmology``, their cosmology, where not given."""
    if cosmology and args.cosmology is None and "cosmology" in attrs:
        args = replace(args, cosmology=attrs["cosmology"])
    if args.box_size is None and attrs.get("box_size") is not None:
        args = replace(args, box_size=float(attrs["box_size"]), box_from_bodies=True)
    return args


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
    ds = open_trajectory(path, index=False)  # validates the store
    plan = stored_plan(ds, check_backend(config.get("backend", args.backend)))
    args = args.in_code_units(ds.attrs)
    args.check_resume(plan)
    if ds.sizes["time"] == 0:
        raise ValueError(f"store {str(path)!r} has no committed snapshot to resume from; "
                         "start a new run with overwrite=True")
    return plan, path, ds.sizes["time"] == len(plan.snapshot_steps())


def start_time(bodies: Any) -> float | None:
    """The start time of a run: a body set's scalar ``time`` coordinate (a snapshot's), or
    None."""
    if isinstance(bodies, xr.Dataset) and "time" in bodies.coords and bodies["time"].ndim == 0:
        return check_real("bodies.time", bodies["time"].item())
    return None
