"""One force evaluation on the cluster: :func:`accelerations`, :func:`potential_energy`,
and :func:`force_accuracy`, which measures a method against a float64 direct sum.

They plan and submit like a run of zero steps (:mod:`nbody_dask.graph`,
:mod:`nbody_dask.driver`), with no store, and gather the result. A body set held as Dask
arrays (:func:`nbody_dask.cosmological_ics`, ``xr.open_zarr``) is checked by the cluster and
read into tiles by the workers, as :func:`~nbody_dask.simulate` does.
"""

from __future__ import annotations

from typing import Any

import dask
import numpy as np
import xarray as xr
from distributed import Client

from . import config
from .accuracy import ForceErrors, force_errors
from ._validate import check_int
from .arguments import RunArguments, check_on_cluster, with_bodies_box
from .bodies import as_bodies, is_lazy, lazy_bodies, resolve_dtype, wrap_positions
from .clusters import client_context
from .driver import run_token, settle, submit_pieces, tiles_on_cluster
from .graph import body_order, initial_pieces, snapshot_graph
from .plan import Plan

__all__ = ["accelerations", "potential_energy", "force_accuracy", "evaluate_once",
           "evaluate_plan", "evaluation_plan"]


def evaluation_plan(bodies: Any, args: RunArguments) -> tuple[xr.Dataset, Plan]:
    """A body set as a Dataset (Dask-backed for a lazy one) and the plan of one force
    evaluation of it: the bodies' periodic box where ``args`` gives none, quantities in the
    bodies' code units."""
    ds = lazy_bodies(bodies) if is_lazy(bodies) else as_bodies(bodies)
    args = with_bodies_box(args, ds.attrs, cosmology=False).in_code_units(ds.attrs)
    return ds, args.plan(ds.sizes["body"])


def evaluate_once(bodies: Any, args: RunArguments, client: Client | None,
                  with_potential: bool) -> Any:
    """Evaluate forces once on the cluster: the accelerations (n, 3) in body order, or
    (``with_potential``) the diagnostics vector."""
    ds, plan = evaluation_plan(bodies, args)
    return evaluate_plan(ds, plan, client, with_potential)


def evaluate_plan(ds: xr.Dataset, plan: Plan, client: Client | None,
                  with_potential: bool) -> Any:
    """:func:`evaluate_once` of a body set and plan from :func:`evaluation_plan`."""
    lazy = is_lazy(ds)
    if not lazy:  # a lazy set is checked by its cluster, below
        ds = check_on_cluster(ds, plan)
    with client_context(client) as c:
        if lazy:
            with dask.config.set(scheduler=c):
                ds = check_on_cluster(ds, plan)
        plan = settle(plan, c)
        token = run_token(ds, plan)
        # no reference to the first tiles here: the workers let go of them once the
        # evaluation has read them (a re-tiling, a step's first tasks)
        state, _ = submit_pieces(c, initial_pieces(plan, token, tiles_on_cluster(c, ds, plan),
                                                   with_potential,
                                                   config.get("kernel-threads")))
        dsk: dict = {}
        if with_potential:
            dsk, total = snapshot_graph(plan, token, state, 0, None, 0)
            return c.get(dsk, total)
        keys = body_order(dsk, plan, token, 0, state)
        for i, tile in enumerate(keys):  # only the accelerations travel to the driver
            dsk[f"nbody-acceleration-{token}-{i}"] = (getattr, tile, "acceleration")
        parts = c.get(dsk, [f"nbody-acceleration-{token}-{i}" for i in range(len(keys))],
                      sync=False)
        del state, keys, dsk  # no reference here keeps a tile once its part is made
        # one part at a time into the result: the driver holds it and one part, not all
        # the parts, their concatenation and its transpose
        out = np.empty((plan.n, 3), dtype=resolve_dtype(plan.dtype))
        start = 0
        while parts:
            part = parts.pop(0).result()
            out[start:start + part.shape[1]] = part.T
            start += part.shape[1]
        return out


def accelerations(
    bodies: xr.Dataset | dict,
    softening: float = 0.0,
    *,
    G: float = 1.0,
    dtype: str | None = None,
    tile_size: int | None = None,
    backend: str | None = None,
    layout: str | None = None,
    method: str | None = None,
    theta: float | None = None,
    leaf_size: int | None = None,
    box_size: float | None = None,
    mesh_size: int | None = None,
    mesh_slabs: int | None = None,
    split: float | None = None,
    cutoff: float | None = None,
    client: Client | None = None,
) -> np.ndarray:
    """Gravitational accelerations of all bodies: one force evaluation on the cluster.

    Parameters are those of :func:`simulate`.

    Returns
    -------
    ndarray, shape (n, 3)
        In the run's dtype.
    """
    args = RunArguments(steps=0, dt=1.0, softening=softening, G=G, dtype=dtype,
                        tile_size=tile_size, backend=backend, layout=layout, method=method,
                        theta=theta, leaf_size=leaf_size, box_size=box_size,
                        mesh_size=mesh_size, mesh_slabs=mesh_slabs, split=split,
                        cutoff=cutoff)
    return evaluate_once(bodies, args, client, with_potential=False)


def potential_energy(
    bodies: xr.Dataset | dict,
    softening: float = 0.0,
    *,
    G: float = 1.0,
    dtype: str | None = None,
    tile_size: int | None = None,
    backend: str | None = None,
    layout: str | None = None,
    method: str | None = None,
    theta: float | None = None,
    leaf_size: int | None = None,
    box_size: float | None = None,
    mesh_size: int | None = None,
    mesh_slabs: int | None = None,
    split: float | None = None,
    cutoff: float | None = None,
    client: Client | None = None,
) -> float:
    """Total potential energy ``-G sum_{i<j} m_i m_j / sqrt(r_ij^2 + eps^2)``.

    Parameters are those of :func:`simulate` (with ``method="tree"`` the potential is the
    tree's: monopole plus quadrupole for accepted cells). Accumulated in float64 across
    tiles. In a periodic box (``box_size``) it is ``sum_i m_i phi_i / 2`` with the periodic
    potential of the Ewald sum (every image, the mean density subtracted).
    """
    args = RunArguments(steps=0, dt=1.0, softening=softening, G=G, dtype=dtype,
                        tile_size=tile_size, backend=backend, layout=layout, method=method,
                        theta=theta, leaf_size=leaf_size, box_size=box_size,
                        mesh_size=mesh_size, mesh_slabs=mesh_slabs, split=split,
                        cutoff=cutoff)
    vector = evaluate_once(bodies, args, client, with_potential=True)
    return float(vector[1])


def force_accuracy(bodies: Any, softening: float = 0.0, *, G: float = 1.0,
                   method: str | None = None, theta: float | None = None,
                   leaf_size: int | None = None, dtype: str | None = None,
                   tile_size: int | None = None, box_size: float | None = None,
                   mesh_size: int | None = None, mesh_slabs: int | None = None,
                   split: float | None = None, cutoff: float | None = None,
                   sample: int = 1000, seed: int = 0,
                   client: Client | None = None) -> ForceErrors:
    """How accurate a force method is on a body set: one force evaluation on the cluster
    (:func:`nbody_dask.accelerations` with these parameters), measured against a float64
    direct sum (the Ewald sum with ``box_size``) on ``sample`` random targets
    (:func:`force_errors`).

    Examples
    --------
    >>> print(force_accuracy(nbody_dask.plummer(65536), method="tree"))  # doctest: +SKIP
    relative force error over 1000 targets: median 9.9e-05, p99 5.6e-04, max 1.4e-03
    """
    args = RunArguments(steps=0, dt=1.0, softening=softening, G=G, dtype=dtype,
                        tile_size=tile_size, method=method, theta=theta, leaf_size=leaf_size,
                        box_size=box_size, mesh_size=mesh_size, mesh_slabs=mesh_slabs,
                        split=split, cutoff=cutoff)
    sample = check_int("sample", sample, 1)  # before the evaluation, as every parameter
    seed = check_int("seed", seed, 0)
    ds, plan = evaluation_plan(bodies, args)
    acc = evaluate_plan(ds, plan, client, with_potential=False)
    # the reference sees what the evaluation saw: the plan's softening, G and box (given,
    # the bodies', the configuration's; in code units), the positions inside the box
    return force_errors(wrap_positions(as_bodies(ds), plan.box_size), acc,
                        softening=plan.softening, G=plan.G, sample=sample, seed=seed,
                        box_size=plan.box_size)
