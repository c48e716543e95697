"""What a trajectory store's attributes hold, both ways: written from a plan, read back.

The plan is stored whole as JSON (``config``), so that a resume repeats the run's arithmetic
exactly; the attributes beside it (``G``, ``dt``, ``method`` and the method's parameters, the
unit system...) are for people and for xarray. :mod:`nbody_dask.storage` lays the arrays out.
"""

from __future__ import annotations

import json
from typing import Any

import xarray as xr

from ._version import __version__
from .integrators import INTEGRATOR
from .plan import Plan
from .units import ATTRS as UNIT_ATTRS
from .units import UnitSystem, declares_units

__all__ = ["store_attrs", "cf_units", "stored_plan"]


def store_attrs(plan: Plan, bodies: xr.Dataset) -> dict[str, Any]:
    """The attributes of a new store for ``plan`` (settled) and its initial ``bodies``."""
    return {
        "title": "nbody_dask trajectory",
        "G": plan.G,
        "softening": plan.softening,
        "dt": plan.dt,
        "integrator": INTEGRATOR,
        "dtype": plan.dtype,
        "units": bodies.attrs.get("units", "N-body (Henon) units: G = M = 1, E = -1/4"),
        "snapshot_every": plan.snapshot_every or plan.steps,
        "tile_size": plan.tile_size,
        "backend": plan.backend,
        "symmetric": int(plan.symmetric),
        "layout": plan.layout,
        "method": plan.method,
        **{name: getattr(plan, name) for name in plan.force_method.parameters},
        **({"force_error_sample": plan.force_error_sample} if plan.force_error_sample else {}),
        **({"box_size": plan.box_size} if plan.periodic else {}),
        **({"timestep": plan.timestep, "step_criterion": plan.step_criterion,
            "eta": plan.eta, "time_bins": plan.time_bins} if plan.individual else {}),
        **({"cosmology": plan.cosmology, "a_start": plan.a_start, "a_end": plan.a_end,
            "dt": plan.dt, "time_variable": "scale factor a (steps uniform in ln a, dt)",
            "velocity_convention": "peculiar velocity a dx/dt"} if plan.comoving else {}),
        "nbody_dask_version": __version__,
        "config": json.dumps(plan.stored()),
        # the unit system (e.g. bodies.attrs["length_unit"] = "1 kpc"): what one code unit is
        **{k: bodies.attrs[k] for k in UNIT_ATTRS if k in bodies.attrs},
    }


def cf_units(bodies: xr.Dataset) -> dict[str, str] | None:
    """CF ``units`` of the store's variables when the bodies carry a physical unit system
    that astropy reads; None otherwise (``length_unit`` and the like written by hand as free
    text, or no astropy: the attributes are stored as they are)."""
    if not declares_units(bodies.attrs):
        return None
    try:
        return UnitSystem.from_attrs(bodies.attrs).cf_units()
    except (ImportError, TypeError, ValueError):
        return None


def stored_plan(trajectory: xr.Dataset, backend: str) -> Plan:
    """The plan of a stored run, with the kernel backend asked for now; checked as any plan.

    The arithmetic (tiles, reduction, symmetric kernel, layout, method) is the stored one, so
    a resume repeats it exactly; stores written before the plan was stored ran the
    ``"pairs"`` layout and keep their tile size and kernel in separate attributes.
    """
    attrs = trajectory.attrs
    stored = {"method": "direct", **json.loads(attrs["config"]),
              "tile_size": int(attrs["tile_size"]),
              "symmetric": bool(attrs.get("symmetric", 0)), "backend": backend}
    return Plan.from_stored(stored, trajectory.sizes["body"])
