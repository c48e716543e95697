"""GADGET-style HDF5 snapshots (the layout of GADGET-4, AREPO and SWIFT), through h5py.

Layout: a ``Header`` group whose attributes say how many particles of each of six types
there are (``NumPart_ThisFile``, ``NumPart_Total``), a ``MassTable`` (a type's mass when all
its particles share it, else 0), ``Time`` and the like; and one group ``PartType<k>`` per type
with ``Coordinates`` (n, 3), ``Velocities`` (n, 3), ``ParticleIDs`` (n,) and, unless the mass
table gives it, ``Masses`` (n,).

:func:`read_gadget` reads the particles of every type present (or those asked for), in type
order, as one body set: ``body`` holds the ``ParticleIDs``, the header's ``Time`` becomes the
start time. A file that says its units (a ``Units`` group, as SWIFT writes it, or GADGET-4's
``Parameters``: ``UnitLength_in_cm``, ``UnitMass_in_g``, ``UnitVelocity_in_cm_per_s``) is
converted to nbody_dask's code units (G = 1) with those as the physical scale (astropy
needed), so a run can take ``dt`` in Myr; a file without them is taken as stored, in the
file's code units.

A cosmological file (GADGET's header with ``Omega0``, ``HubbleParam``, ``BoxSize`` and
``Time`` = a, as N-GenIC, MUSIC, monofonIC and GADGET write them; or SWIFT's ``Cosmology``
group) is read in the code units of a cosmological box (:mod:`nbody_dask.cosmology`:
comoving Mpc/h, peculiar velocities in 100 km/s), with its cosmology (flat unless
``OmegaLambda`` says otherwise, without radiation, as GADGET integrates), box and scale
factor, so that ``simulate`` runs it comoving. GADGET's conventions are undone: lengths and
masses per h, velocities ``v / sqrt(a)`` (SWIFT's are peculiar, its units without h).
Without unit attributes, GADGET's defaults are taken (1e10 M_sun/h, km/s) with lengths in
kpc/h or Mpc/h, whichever makes the mean density ``Omega0`` times the critical one (else a
clear error). :func:`write_gadget` writes a cosmological body set the GADGET way (Mpc/h,
1e10 M_sun/h, ``v / sqrt(a)`` in km/s, GADGET-4's ``a_scaling``/``h_scaling`` and
``Parameters``), which pynbody reads in physical units and SWIFT reads with its
``cleanup_h_factors`` and ``cleanup_velocity_factors``.

:func:`write_gadget` writes a body set as collisionless particles
of type 1 (``PartType1``), with explicit ``Masses`` and a zero mass table, which every reader
of the layout accepts; a body set in physical units gets the unit attributes in both layouts,
with zero ``a_scaling`` and ``h_scaling`` on its datasets (not comoving, no h), so that
pynbody reads physical values equal to nbody_dask's.

Needs the optional ``h5py`` (``pip install "nbody-dask[hdf5]"``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xarray as xr

from ._validate import check_new_file
from .bodies import as_bodies, make_bodies
from .cosmology import as_cosmology, mass_unit_msun_h, to_json, unit_system
from .units import declares_units

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
        given = np.asarray(header.get("MassTable", table), dtype=float).ravel()[:_TYPES]
        table[:given.size] = given  # (SWIFT's headers have a seventh type, neutrinos)
        wanted = [k for k in (types if types is not None else range(_TYPES)) if counts[k] > 0]
        if not wanted:
            raise ValueError(f"{str(path)!r} has no particles of type(s) "
                             f"{list(types) if types is not None else 'any'}")
        blocks = [_read_type(f, path, k, int(counts[k]), table[k]) for k in wanted]
        f_units = _unit_attrs(f)
        cosmological = _cosmological_header(f, header)
    position, velocity, mass, ids = (np.concatenate(parts) for parts in zip(*blocks,
                                                                            strict=True))
    if ids.dtype.kind == "u" and (ids.size == 0 or ids.max() < 2**63):
        ids = ids.astype(np.int64)  # signed labels, as everywhere else in nbody_dask
    time = float(np.atleast_1d(header.get("Time", 0.0))[0])
    if cosmological is not None:
        ds = _comoving_bodies(path, cosmological, position, velocity, mass, ids, f_units)
        ds.attrs["gadget_types"] = [int(k) for k in wanted]
        return ds
    units = _read_units(f_units)
    if units is None:
        ds = make_bodies(position, velocity, mass, body=ids)
    else:  # physical quantities, converted to code units with the file's as the scale
        u = units["u"]
        length, mass_unit, speed = units["length"], units["mass"], units["velocity"]
        ds = make_bodies(position * length, velocity * speed, mass * mass_unit, body=ids,
                         length_unit=length, mass_unit=mass_unit)
        code_time = u.Quantity(ds.attrs["time_unit"])
        time = float((time * length / speed / code_time).to_value(u.dimensionless_unscaled))
    ds.attrs["gadget_types"] = [int(k) for k in wanted]
    return ds.assign_coords(time=time)


#: The unit attributes, GADGET's names (SWIFT's in the ``Units`` group beside them).
_UNIT_KEYS = {"length": ("UnitLength_in_cm", "Unit length in cgs (U_L)"),
              "mass": ("UnitMass_in_g", "Unit mass in cgs (U_M)"),
              "velocity": ("UnitVelocity_in_cm_per_s", None),
              "time": ("UnitTime_in_s", "Unit time in cgs (U_t)")}


def _unit_attrs(f) -> dict[str, float] | None:
    """A file's unit attributes in cgs (length, mass, velocity), from ``Units`` (SWIFT's or
    GADGET's names) or ``Parameters`` (GADGET-4); None if it has none."""
    for group in ("Units", "Parameters"):
        if group not in f:
            continue
        attrs = dict(f[group].attrs)
        found = {}
        for kind, names in _UNIT_KEYS.items():
            value = next((attrs[n] for n in names if n is not None and n in attrs), None)
            if value is not None:
                found[kind] = float(np.atleast_1d(value)[0])
        if "velocity" not in found and {"length", "time"} <= set(found):
            found["velocity"] = found["length"] / found["time"]
        if {"length", "mass", "velocity"} <= set(found):
            return found
    return None


def _read_units(found: dict[str, float] | None) -> dict | None:
    """astropy quantities of the file's units (None: no units, or no astropy)."""
    if found is None:
        return None
    try:
        from astropy import units as u
    except ImportError:  # the values are taken as stored
        return None
    return {"u": u, "length": found["length"] * u.cm, "mass": found["mass"] * u.g,
            "velocity": found["velocity"] * u.cm / u.s}


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


#: One Mpc and GADGET's cosmological mass unit (1e10 M_sun) in cgs, and 100 km/s.
_MPC_CM = 3.085677581491367e24
_GADGET_MASS_G = 1.98841e43
_CODE_SPEED_CM_S = 1e7


def _cosmological_header(f, header: dict) -> dict | None:
    """The cosmology of a cosmological snapshot or IC file (None for others): SWIFT's
    ``Cosmology`` group (peculiar velocities, units without h) or GADGET's header
    (``Omega0``, ``OmegaLambda``, ``HubbleParam``, ``BoxSize``, ``Time`` = a; velocities
    ``v / sqrt(a)``, lengths and masses per h)."""
    def first(attrs: dict, *names: str) -> float | None:
        for name in names:
            if name in attrs:
                return float(np.atleast_1d(attrs[name])[0])
        return None

    box = first(header, "BoxSize")
    if "Cosmology" in f:
        c = dict(f["Cosmology"].attrs)
        if not first(c, "Cosmological run") and "Cosmological run" in c:
            return None
        h = first(c, "h")
        a = first(c, "Scale-factor")
        if h is None or a is None or box is None:
            return None
        params = {"H0": 100 * h, "Om0": first(c, "Omega_m", "Omega_cdm"),
                  "Ode0": first(c, "Omega_lambda"), "Ob0": first(c, "Omega_b")}
        return {"params": params, "a": a, "box": box, "swift": True}
    parameters = dict(f["Parameters"].attrs) if "Parameters" in f else {}
    if "ComovingIntegrationOn" in parameters and not first(parameters,
                                                            "ComovingIntegrationOn"):
        return None
    omega, h, a = first(header, "Omega0"), first(header, "HubbleParam"), first(header, "Time")
    if not (omega and h and a and box) or omega <= 0 or box <= 0 or not 0 < a <= 1:
        return None
    params = {"H0": 100 * h, "Om0": omega, "Ode0": first(header, "OmegaLambda") or 0.0,
              "Ob0": first(header, "OmegaBaryon")}
    return {"params": params, "a": a, "box": box, "swift": False}


def _comoving_bodies(path: Path, found: dict, position: np.ndarray, velocity: np.ndarray,
                     mass: np.ndarray, ids: np.ndarray, units: dict | None) -> xr.Dataset:
    """A cosmological file's particles in the code units of a cosmological box (comoving
    Mpc/h, peculiar 100 km/s, G = 1, time = a), with its cosmology (no radiation, as GADGET
    integrates) and box as attributes."""
    params = {k: v for k, v in found["params"].items() if v is not None}
    params["Tcmb0"] = 0.0
    if abs(params["Om0"] + params.get("Ode0", 0.0) - 1) < 1e-6:
        params.pop("Ode0")  # flat
    cosmology = as_cosmology(params)
    h, a = float(cosmology.h), found["a"]
    code_mass_msun_h = mass_unit_msun_h(cosmology)
    if units is None:  # GADGET's defaults: kpc/h or Mpc/h, told apart by the mean density
        length = _default_length(path, found, mass)
        mass_unit, speed = _GADGET_MASS_G, 1e5
    else:
        length, mass_unit, speed = units["length"], units["mass"], units["velocity"]
    per_h = 1.0 if not found["swift"] else h  # GADGET's units are per h; SWIFT's are not
    mpc_h = length / _MPC_CM * per_h
    msun_h = mass_unit / (_GADGET_MASS_G / 1e10) * per_h
    peculiar = velocity if found["swift"] else velocity * np.sqrt(a)  # GADGET: v / sqrt(a)
    box = found["box"] * mpc_h
    ds = make_bodies(np.mod(position * mpc_h, box), peculiar * (speed / _CODE_SPEED_CM_S),
                     mass * (msun_h / code_mass_msun_h), body=ids)
    ds.attrs.update(box_size=box, cosmology=to_json(cosmology), redshift=1 / a - 1,
                    units="comoving Mpc/h, peculiar velocity in 100 km/s, time 1/H0, G = 1",
                    **unit_system(cosmology).attrs())
    return ds.assign_coords(time=a)


def _default_length(path: Path, found: dict, mass: np.ndarray) -> float:
    """GADGET's length unit of a cosmological file without unit attributes (cm per h): kpc
    or Mpc, whichever makes the particles' mean density the header's ``Omega0`` times the
    critical density (1e10 M_sun/h units)."""
    omega = found["params"]["Om0"]
    for length in (_MPC_CM / 1e3, _MPC_CM):  # kpc/h, then Mpc/h
        critical = 27.7536627 * (length / _MPC_CM) ** 3  # 1e10 M_sun/h per length^3
        density = float(mass.sum(dtype=np.float64)) / found["box"] ** 3
        if abs(density / (omega * critical) - 1) < 0.05:
            return length
    raise ValueError(f"{str(path)!r} is cosmological but has no unit attributes, and its "
                     f"mean density fits neither kpc/h nor Mpc/h lengths with 1e10 M_sun/h "
                     f"masses (GADGET's defaults) for Omega0 = {omega}: add a Units group "
                     "(UnitLength_in_cm, UnitMass_in_g, UnitVelocity_in_cm_per_s)")


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
    position, velocity, mass = ds.position.values, ds.velocity.values, ds.mass.values
    header_extra = {"BoxSize": 0.0, "Omega0": 0.0, "OmegaLambda": 0.0, "HubbleParam": 1.0,
                    "Redshift": 0.0}
    cosmology = None
    if "cosmology" in ds.attrs and "box_size" in ds.attrs:  # a comoving run's bodies
        cosmology = as_cosmology(ds.attrs["cosmology"])
        if not 0 < time <= 1:
            raise ValueError(f"a cosmological body set's time is its scale factor, in (0, 1]; "
                             f"got {time!r}")
        code_mass_msun_h = mass_unit_msun_h(cosmology)
        # GADGET's conventions: Mpc/h, 1e10 M_sun/h, km/s with velocities v / sqrt(a)
        velocity = velocity * (_CODE_SPEED_CM_S / 1e5) / np.sqrt(time)
        mass = mass * (code_mass_msun_h / 1e10)
        header_extra = {"BoxSize": float(ds.attrs["box_size"]),
                        "Omega0": float(cosmology.Om0),
                        "OmegaLambda": float(cosmology.Ode0),
                        "HubbleParam": float(cosmology.h), "Redshift": 1 / time - 1}
        if cosmology.Ob0 is not None:
            header_extra["OmegaBaryon"] = float(cosmology.Ob0)
    with h5py.File(path, "w") as f:
        header = f.create_group("Header")
        header.attrs.update({
            "NumPart_ThisFile": counts, "NumPart_Total": counts,
            "NumPart_Total_HighWord": np.zeros(_TYPES, dtype=np.uint32),
            "MassTable": np.zeros(_TYPES), "Time": time,
            "NumFilesPerSnapshot": 1, **header_extra,
            "Flag_Sfr": 0, "Flag_Cooling": 0, "Flag_StellarAge": 0, "Flag_Metals": 0,
            "Flag_Feedback": 0, "Flag_DoublePrecision": 1, "Flag_Entropy_ICs": 0,
        })
        group = f.create_group("PartType1")
        group.create_dataset("Coordinates", data=position)
        group.create_dataset("Velocities", data=velocity)
        group.create_dataset("Masses", data=mass)
        group.create_dataset("ParticleIDs", data=ids)
        if cosmology is not None:
            _write_units(f, group, {"length": _MPC_CM, "mass": _GADGET_MASS_G,
                                    "velocity": 1e5, "time": _MPC_CM / 1e5}, comoving=True)
            f["Parameters"].attrs.update({k: v for k, v in header_extra.items()
                                          if k != "Redshift"})
        else:
            units = _code_units_cgs(ds.attrs)
            if units is not None:
                _write_units(f, group, units)
    return path


def _code_units_cgs(attrs: dict) -> dict[str, float] | None:
    """The cgs values of a body set's code units (None: N-body units, or no astropy)."""
    if not declares_units(attrs):
        return None
    try:
        from astropy import units as u

        from .units import UnitSystem
    except ImportError:
        return None
    system = UnitSystem.from_attrs(attrs)
    return {"length": float(system.length.to_value(u.cm)),
            "mass": float(system.mass.to_value(u.g)),
            "velocity": float(system.velocity.to_value(u.cm / u.s)),
            "time": float(system.time.to_value(u.s))}


def _write_units(f, group, units: dict[str, float], comoving: bool = False) -> None:
    """The unit attributes in a ``Units`` group (GADGET's and SWIFT's names) and in
    GADGET-4's ``Parameters``; the datasets' a- and h-scaling: zero, or ``comoving``
    GADGET's (positions ``a / h``, velocities ``sqrt(a)``, masses ``1 / h``)."""
    named = f.create_group("Units")
    parameters = f.create_group("Parameters")
    for kind, (gadget, swift) in _UNIT_KEYS.items():
        named.attrs[gadget] = parameters.attrs[gadget] = units[kind]
        if swift is not None:
            named.attrs[swift] = units[kind]
    named.attrs["Unit current in cgs (U_I)"] = named.attrs["Unit temperature in cgs (U_T)"] = 1.0
    parameters.attrs["ComovingIntegrationOn"] = int(comoving)
    scaling = {"Coordinates": (1.0, -1.0), "Velocities": (0.5, 0.0), "Masses": (0.0, -1.0)}
    for name in ("Coordinates", "Velocities", "Masses"):
        a_scaling, h_scaling = scaling[name] if comoving else (0.0, 0.0)
        group[name].attrs["a_scaling"], group[name].attrs["h_scaling"] = a_scaling, h_scaling
