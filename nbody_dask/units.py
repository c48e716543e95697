"""Physical units: body sets given as astropy quantities, trajectories returned in them.

nbody_dask integrates in code units where G = 1. A :class:`UnitSystem` says what one code
unit is physically: a length unit ``L`` and a mass unit ``M`` are chosen, and the time and
velocity units follow from G = 1::

    T = sqrt(L**3 / (G M)),    V = L / T,    E = M V**2.

Bodies given as quantities (:func:`nbody_dask.make_bodies` with astropy ``Quantity``
arguments, or :func:`to_code_units`) are scaled with ``L`` = one of the positions' unit
(1 kpc for positions in kpc) and ``M`` = the total mass, unless ``length_unit=`` or
``mass_unit=`` say otherwise, so that total mass is 1 and positions keep their numbers.
The unit system travels in the body set's attributes (``length_unit``, ``mass_unit``,
``time_unit``, ``velocity_unit``, astropy-readable strings such as ``"1.0 kpc"``) into the
trajectory store, whose variables then carry CF-style ``units`` attributes in SI
(``"3.0856775814913674e+19 m"``) that UDUNITS, xarray and cf-xarray read.
:func:`physical` returns a trajectory in the units of your choice.

Needs the optional astropy (``pip install "nbody-dask[units]"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["UnitSystem", "is_quantity", "declares_units", "to_code_units", "code_value",
           "physical"]

ATTRS = ("length_unit", "mass_unit", "time_unit", "velocity_unit")


def _u():
    try:
        import astropy.units as u
    except ImportError:
        raise ImportError("physical units need astropy: pip install 'nbody-dask[units]'") \
            from None
    return u


def is_quantity(value: Any) -> bool:
    """Whether ``value`` is an astropy ``Quantity`` (without importing astropy)."""
    return type(value).__module__.startswith("astropy") and hasattr(value, "unit")


@dataclass(frozen=True)
class UnitSystem:
    """Code units with G = 1, from a length unit and a mass unit (astropy quantities)."""

    length: Any
    mass: Any

    def __post_init__(self) -> None:
        u = _u()
        for name, value, kind in (("length_unit", self.length, u.m),
                                  ("mass_unit", self.mass, u.kg)):
            if not is_quantity(value) or not value.unit.is_equivalent(kind):
                raise ValueError(f"{name} must be a positive {kind.physical_type} quantity, "
                                 f"got {value!r}")
            if not (np.isscalar(value.value) and value.value > 0):
                raise ValueError(f"{name} must be a positive scalar quantity, got {value!r}")

    @property
    def time(self):
        from astropy.constants import G

        return np.sqrt(self.length**3 / (G * self.mass)).to(_u().yr)

    @property
    def velocity(self):
        return (self.length / self.time).to(_u().km / _u().s)

    def attrs(self) -> dict[str, str]:
        """The four ``*_unit`` attributes, as astropy-readable strings."""
        return {name: f"{float(q.value)!r} {q.unit.to_string()}" for name, q in
                zip(ATTRS, (self.length, self.mass, self.time, self.velocity), strict=True)}

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> UnitSystem | None:
        """The unit system recorded in a body set's or a store's attributes, if any."""
        if not declares_units(attrs):
            return None
        u = _u()
        return cls(u.Quantity(attrs["length_unit"]), u.Quantity(attrs["mass_unit"]))

    def cf_units(self) -> dict[str, str]:
        """CF ``units`` attributes (SI, UDUNITS syntax) of the trajectory's variables."""
        u = _u()
        length = float(self.length.to_value(u.m))
        mass = float(self.mass.to_value(u.kg))
        time = float(self.time.to_value(u.s))
        speed = length / time
        energy = f"{mass * speed * speed!r} kg m2 s-2"
        return {
            "position": f"{length!r} m", "velocity": f"{speed!r} m s-1",
            "mass": f"{mass!r} kg", "time": f"{time!r} s",
            "kinetic_energy": energy, "potential_energy": energy, "total_energy": energy,
            "momentum": f"{mass * speed!r} kg m s-1",
            "angular_momentum": f"{mass * speed * length!r} kg m2 s-1",
        }


def declares_units(attrs: dict[str, Any]) -> bool:
    """True if attributes (a body set's, a store's) declare a physical unit system: a
    ``length_unit`` and a ``mass_unit``. Needs no astropy."""
    return "length_unit" in attrs and "mass_unit" in attrs


def to_code_units(position: Any, velocity: Any, mass: Any, *, length_unit: Any = None,
                  mass_unit: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                  UnitSystem]:
    """Plain arrays in code units (G = 1) from quantities, and the unit system used.

    Parameters
    ----------
    position, velocity, mass : astropy.units.Quantity
        Any length, velocity and mass units (``velocity`` may be None: at rest).
    length_unit, mass_unit : astropy.units.Quantity, optional
        The code units; by default one of the positions' unit and the total mass.

    Raises
    ------
    TypeError
        If one of them is not a quantity.
    ValueError
        If a quantity has the wrong physical type (naming the parameter and its unit).
    """
    u = _u()
    for name, value, kind in (("position", position, u.m), ("velocity", velocity, u.m / u.s),
                              ("mass", mass, u.kg)):
        if value is None and name == "velocity":
            continue
        if not is_quantity(value):
            raise TypeError(f"{name} must be an astropy Quantity when another argument is "
                            f"one (all or none), got {type(value).__name__}")
        if not value.unit.is_equivalent(kind):
            raise ValueError(f"{name} must be a {kind.physical_type} quantity, got unit "
                             f"{value.unit.to_string()!r}")
    system = UnitSystem(1.0 * position.unit if length_unit is None else length_unit,
                        mass.sum() if mass_unit is None else mass_unit)
    pos = (position / system.length).to_value(u.dimensionless_unscaled)
    m = (mass / system.mass).to_value(u.dimensionless_unscaled)
    vel = (np.zeros(np.shape(pos)) if velocity is None else
           (velocity / system.velocity).to_value(u.dimensionless_unscaled))
    return pos, vel, m, system


def code_value(name: str, value: Any, attrs: dict[str, Any], kind: str) -> Any:
    """``value`` in code units if it is a quantity (``kind``: "length" or "time"), converted
    with the unit system in ``attrs`` (a body set's); other values pass through.

    Raises
    ------
    ValueError
        For a quantity when the bodies have no unit system, or one of another physical type
        than ``kind`` (naming the parameter and the value).
    """
    if not is_quantity(value):
        return value
    system = UnitSystem.from_attrs(attrs)
    if system is None:
        raise ValueError(f"{name}={value!r} is a quantity but the bodies are in code units; "
                         "give the bodies as quantities too, or a plain number")
    unit = system.length if kind == "length" else system.time
    if not value.unit.is_equivalent(unit.unit):
        raise ValueError(f"{name}={value!r} must be a {kind}, got unit "
                         f"{value.unit.to_string()!r}")
    return float((value / unit).to_value(_u().dimensionless_unscaled))


def physical(trajectory: xr.Dataset, *, length: str | None = None,
             velocity: str | None = None, mass: str | None = None, time: str | None = None,
             energy: str | None = None) -> xr.Dataset:
    """The trajectory (or body set) in physical units, each variable with a ``units`` attribute.

    Parameters
    ----------
    trajectory : xarray.Dataset
        From a run whose bodies carried a unit system (see the module docstring).
    length, velocity, mass, time, energy : str, optional
        Target units (astropy names: ``"kpc"``, ``"km/s"``, ``"solMass"``, ``"Myr"``,
        ``"erg"``); by default the units of the unit system's attributes, and ``energy`` in
        ``mass * velocity**2``.

    Raises
    ------
    ValueError
        If the trajectory has no unit system.
    """
    u = _u()
    system = UnitSystem.from_attrs(trajectory.attrs)
    if system is None:
        raise ValueError("the trajectory has no physical unit system (its bodies were given "
                         "in code units); see nbody_dask.units")
    target = {
        "length": u.Unit(length) if length else system.length.unit,
        "velocity": u.Unit(velocity) if velocity else system.velocity.unit,
        "mass": u.Unit(mass) if mass else system.mass.unit,
        "time": u.Unit(time) if time else system.time.unit,
    }
    target["energy"] = u.Unit(energy) if energy else target["mass"] * target["velocity"]**2
    unit = {"length": system.length, "velocity": system.velocity, "mass": system.mass,
            "time": system.time, "energy": system.mass * system.velocity**2}
    kinds = {"position": "length", "velocity": "velocity", "mass": "mass", "time": "time",
             "kinetic_energy": "energy", "potential_energy": "energy",
             "total_energy": "energy", "momentum": ("mass", "velocity"),
             "angular_momentum": ("mass", "velocity", "length")}
    out = trajectory.copy()
    for name, kind in kinds.items():
        if name not in out.variables:
            continue
        parts = kind if isinstance(kind, tuple) else (kind,)
        scale = math.prod((unit[p] for p in parts[1:]), start=unit[parts[0]])
        goal = math.prod((target[p] for p in parts[1:]), start=target[parts[0]])
        factor = float(scale.to_value(goal))
        out[name] = out[name] * factor
        out[name].attrs = {**trajectory[name].attrs, "units": goal.to_string()}
    return out
