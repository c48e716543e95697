"""Analysis of a trajectory (as opened by :func:`nbody_dask.open_trajectory`), with xarray.

Everything here is lazy where the trajectory is, and works on any Dataset with the store's
variables, so ``xr.open_zarr("run.zarr")`` can be passed as well.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

__all__ = ["lagrangian_radii", "conservation", "DEFAULT_FRACTIONS"]

DEFAULT_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)


def _enclosed_radii(position: np.ndarray, mass: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """Radii about the centre of mass enclosing ``fractions`` of the mass, per snapshot.

    ``position`` is (..., body, axis), ``mass`` (body,); returns (..., fraction).
    """
    weights = mass / mass.sum()
    centre = np.einsum("...ba,b->...a", position, weights)
    r = np.linalg.norm(position - centre[..., None, :], axis=-1)
    order = np.argsort(r, axis=-1)
    cumulative = np.cumsum(weights[order], axis=-1)
    index = np.stack([np.argmax(cumulative >= f - 1e-12, axis=-1) for f in fractions], axis=-1)
    return np.take_along_axis(np.take_along_axis(r, order, axis=-1), index, axis=-1)


def lagrangian_radii(trajectory: xr.Dataset,
                     fractions: Sequence[float] = DEFAULT_FRACTIONS) -> xr.DataArray:
    """Radii about the centre of mass that enclose given fractions of the mass, over time.

    Parameters
    ----------
    trajectory : xarray.Dataset
        With ``position(time, body, axis)`` and ``mass(body)``; a single snapshot works too.
    fractions : sequence of float
        Mass fractions in (0, 1].

    Returns
    -------
    xarray.DataArray
        ``lagrangian_radius(time, fraction)`` (lazy for a lazy trajectory); the 0.5 row is
        the half-mass radius.
    """
    fractions = np.asarray(fractions, dtype=float)
    if fractions.ndim != 1 or fractions.size == 0 or not np.all((fractions > 0) & (fractions <= 1)):
        raise ValueError(f"fractions must be a non-empty sequence in (0, 1], got {fractions!r}")
    position = trajectory["position"]
    if hasattr(position.data, "chunks"):
        position = position.chunk({"body": -1, "axis": -1})
    radii = xr.apply_ufunc(
        _enclosed_radii, position, trajectory["mass"].astype(float),
        kwargs={"fractions": fractions},
        input_core_dims=[["body", "axis"], ["body"]],
        output_core_dims=[["fraction"]],
        dask="parallelized", output_dtypes=[float],
        dask_gufunc_kwargs={"output_sizes": {"fraction": fractions.size}},
    )
    radii = radii.assign_coords(fraction=fractions).rename("lagrangian_radius")
    radii.attrs.update(long_name="Lagrangian radius", units="length (code units)")
    return radii


def conservation(trajectory: xr.Dataset) -> xr.Dataset:
    """How well energy, momentum and angular momentum are conserved, per snapshot.

    Returns
    -------
    xarray.Dataset
        ``energy_error`` = ``E / E0 - 1``, ``momentum_drift`` = ``|P - P0|`` and
        ``angular_momentum_error`` = ``|L - L0| / |L0|`` (``|L - L0|`` where ``L0 = 0``),
        each over ``time``.
    """
    energy = trajectory["total_energy"]
    e0 = energy.isel(time=0)
    p = trajectory["momentum"]
    ang = trajectory["angular_momentum"]
    l0 = ang.isel(time=0)
    l0_norm = float(np.sqrt((l0**2).sum("axis")))
    out = xr.Dataset({
        "energy_error": energy / e0 - 1 if float(e0) != 0 else energy - e0,
        "momentum_drift": np.sqrt(((p - p.isel(time=0)) ** 2).sum("axis")),
        "angular_momentum_error": np.sqrt(((ang - l0) ** 2).sum("axis"))
        / (l0_norm if l0_norm > 0 else 1.0),
    })
    out["energy_error"].attrs["long_name"] = "E/E0 - 1"
    out["momentum_drift"].attrs["long_name"] = "|P - P0|"
    out["angular_momentum_error"].attrs["long_name"] = "|L - L0| / |L0|"
    return out
