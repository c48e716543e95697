"""simulate(): a run from its arguments to its trajectory, composed of the run's parts.

The arguments become a :class:`~nbody_dask.plan.Plan` (:mod:`nbody_dask.arguments`), the
store is laid out from it (:mod:`nbody_dask.storage`, :mod:`nbody_dask.schema`), the session
holds the lease, the progress bar and the signal handlers (:mod:`nbody_dask.session`), and
the driver runs the plan's graphs on the cluster (:mod:`nbody_dask.driver`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import xarray as xr
from distributed import Client

from . import config
from ._validate import check_real
from .arguments import RunArguments, check_on_cluster, fresh_start, resume_point
from .bodies import is_lazy, resolve_dtype
from .clusters import client_context, dashboard_link
from .driver import Driver, settle
from .lease import WriterLease
from .location import StoreLocation
from .plan import Plan
from .schema import cf_units, store_attrs
from .session import (EnergyBound, describe_method, output_location, progress_bar,
                      stop_on_signals, writer_lease)
from .storage import create_store, open_trajectory

__all__ = ["simulate"]


def simulate(
    bodies: xr.Dataset | dict | None = None,
    steps: int | None = None,
    dt: float | None = None,
    softening: float | None = None,
    *,
    G: float | None = None,
    store: str | Path | None = None,
    storage_options: dict[str, Any] | None = None,
    snapshot_every: int | None = None,
    dtype: str | None = None,
    tile_size: int | None = None,
    split_every: int | None = None,
    backend: str | None = None,
    layout: str | None = None,
    method: str | None = None,
    theta: float | None = None,
    leaf_size: int | None = None,
    force_error_sample: int | None = None,
    box_size: float | None = None,
    mesh_size: int | None = None,
    mesh_slabs: int | None = None,
    split: float | None = None,
    cutoff: float | None = None,
    cosmology: Any = None,
    a_end: float | None = None,
    z_end: float | None = None,
    snapshot_redshifts: Any = None,
    timestep: str | None = None,
    step_criterion: str | None = None,
    eta: float | None = None,
    time_bins: int | None = None,
    client: Client | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
    callback: Callable[[int, dict | None], None] | None = None,
    max_energy_error: float | None = None,
) -> xr.Dataset:
    """Integrate an N-body system with leapfrog (kick-drift-kick) on a Dask cluster.

    Parameters
    ----------
    bodies : xarray.Dataset or Mapping
        Initial conditions: ``position(body, axis)``, ``velocity(body, axis)``, ``mass(body)``
        (see :func:`nbody_dask.make_bodies`). A snapshot of a trajectory works too; its
        ``time`` coordinate, if scalar, becomes the start time. Not with ``resume``. Held as
        Dask arrays (:func:`nbody_dask.cosmological_ics`, ``xr.open_zarr``) it never passes
        through this process: the cluster checks its values (errors name them before
        anything is written) and each worker builds its tiles from it.
    steps : int
        Number of steps (>= 0).
    dt : float or astropy.units.Quantity
        Step length (> 0), in the units of the bodies (Hénon N-body units for the built-in
        initial conditions), or a time quantity for bodies given in physical units
        (:mod:`nbody_dask.units`).
    softening : float or astropy.units.Quantity, default 0
        Plummer softening length eps (>= 0); a length quantity for bodies in physical units.
        With eps = 0 coincident bodies exert no force.
    G : float, default 1
        Gravitational constant.
    store : str or Path, optional
        Zarr v3 store to write the trajectory to: a path (on a file system every worker
        reaches), or an object-store URL such as ``"s3://bucket/runs/a.zarr"`` (see
        :mod:`nbody_dask.location`), which the workers write to directly. Without one the
        trajectory is written to a temporary directory (which the workers must be able to
        reach: fine for local clusters), loaded into memory and deleted.
    storage_options : dict, optional
        For an object-store URL, the options of its fsspec file system: credentials,
        ``{"client_kwargs": {"endpoint_url": ...}}`` for an S3-compatible server, and the
        like. They travel to the workers with the tasks; credentials the workers find in
        their environment (``AWS_ACCESS_KEY_ID``...) need not be given here.
    snapshot_every : int, optional
        Write a snapshot every this many steps. Snapshots of the initial and the final state
        are always written; with None only those two.
    dtype : {"float32", "float64"}, optional
        Precision of the state and the forces; ``nbody.dtype`` (float64) by default.
        Diagnostics are always accumulated in float64.
    tile_size : int, optional
        Bodies per tile; chosen from N and the cluster's threads by default.
    split_every : int, optional
        Fan-in of the reduction tree; ``nbody.split-every`` (8) by default.
    backend : {"auto", "cpu", "cuda"}, optional
        Kernel of the tile-pair tasks; ``nbody.backend`` ("auto": the CUDA kernel on workers
        with a GPU, the CPU kernel elsewhere) by default. See :mod:`nbody_dask.backends`.
    layout : {"pairs", "rows"}, optional
        How a step is cut into tasks; ``nbody.layout`` ("pairs") by default. ``"pairs"``: a
        task per tile pair, for workers with many threads. ``"rows"``: one tile per worker and
        a task per tile that runs its row of tile pairs on all the worker's cores with the
        parallel CPU kernel (``nbody.kernel-threads``), about ``2 T`` tasks a step: the HPC
        layout, for one single-threaded worker process per node (with the tree: a spatial
        tile per worker and a task per tile that walks its near tiles and its far tiles'
        summaries, about ``4 T`` tasks a step). See :mod:`nbody_dask.plan`.
    method : {"auto", "direct", "tree", "treepm"}, optional
        How forces are computed; ``nbody.method`` ("auto") by default. ``"direct"``: exact
        direct summation (Ewald sums in a periodic box). ``"tree"``: an octree with
        quadrupole moments on spatial tiles (:mod:`nbody_dask.kernels.tree`), O(N log N),
        with a relative force error set by ``theta`` (median ~1e-4 at the default).
        ``"treepm"``: periodic boxes only, a particle mesh for the long range and a tree
        walk with a cutoff for the short range (:mod:`nbody_dask.methods.treepm`).
        ``"auto"``: direct below :data:`~nbody_dask.plan.TREE_CROSSOVER` bodies, the tree
        from there on (in a periodic box: below
        :data:`~nbody_dask.plan.PERIODIC_CROSSOVER`, then treepm). The choice is printed
        with the progress bar and stored in the trajectory's ``method`` attribute. Results
        are bit-reproducible with each.
    theta : float, optional
        The tree's opening angle, in (0, 1]; ``nbody.theta`` (0.4) by default. Smaller is
        more accurate and slower (see the user guide's "accuracy and speed").
    leaf_size : int, optional
        The tree's most bodies per leaf; ``nbody.leaf-size`` (64) by default.
    force_error_sample : int, optional
        Record at every snapshot the relative force error of this many bodies (drawn once,
        the same at every snapshot) against a float64 direct sum: ``force_error(time,
        statistic)`` in the trajectory, ``statistic`` being median, p99 and max. It costs
        ``force_error_sample x N`` float64 interactions a snapshot, spread over the tiles.
        None or 0 (the default): not recorded.
    box_size : float or astropy.units.Quantity, optional
        Side ``L`` of a periodic cube (``nbody.box-size``; None: the bodies' ``box_size``
        attribute where they carry one, a periodic run's snapshot say, else an isolated
        system). The bodies move in ``[0, L)`` (positions outside are wrapped in at the
        start and after every drift), every body feels every image of every other, and the
        mean density is subtracted, as in cosmological codes. A length quantity for bodies
        in physical units. See the user guide's "Periodic boxes".
    mesh_size : int, optional
        TreePM's mesh points per side (``nbody.mesh-size``); by default twice the particle
        grid, ``2 cbrt(N)`` (at least 32), rounded up to a fast FFT size.
    mesh_slabs : int, optional
        TreePM's mesh slabs (``nbody.mesh-slabs``): 1 solves the mesh in one task with
        ``scipy.fft`` on a worker's cores; more cut it into slabs whose FFT is a Dask graph
        across the workers (:mod:`nbody_dask.meshfft`), for meshes no worker holds. By
        default one task up to 256 MiB of mesh (512^3 float32 points), slabs beyond; with
        ``timestep="individual"`` one task for a one-tile system (its blocks run in one
        task), where more is refused.
    split : float, optional
        TreePM's force split scale ``r_s`` in mesh cells (``nbody.split``, 2.5).
    cutoff : float, optional
        TreePM's short-range cutoff in units of ``r_s`` (``nbody.cutoff``, 5.0).
    cosmology : astropy FLRW, str or mapping, optional
        Integrate in comoving coordinates in a box expanding with this cosmology (an
        astropy cosmology, a name such as ``"Planck18"``, or parameters: see
        :func:`nbody_dask.cosmology.as_cosmology`); by default the bodies' ``cosmology``
        attribute when they have one (:func:`nbody_dask.cosmological_ics`). The run starts
        at the bodies' scale factor (their scalar ``time`` coordinate) and ends at ``a_end``
        or ``z_end`` (default today, a = 1) in ``steps`` steps uniform in ``ln a``, or steps
        of at most ``dt`` in ``ln a`` (give one of them). Positions are comoving, velocities
        peculiar, in the bodies' code units (:func:`nbody_dask.cosmology.unit_system`); the
        trajectory's ``time`` is the scale factor, with a ``redshift`` coordinate. Needs a
        periodic box (``box_size``, by default the bodies' attribute) and G = 1.
    a_end, z_end : float, optional
        Where a cosmological run ends (one of them; default a = 1).
    snapshot_redshifts : sequence of float, optional
        A cosmological run also writes snapshots at these redshifts, exactly: its steps are
        uniform in ``ln a`` between them (``steps`` shared in proportion to the stretches'
        spans in ``ln a``, or each at most ``dt``).
    timestep : {"global", "individual"}, optional
        ``nbody.timestep`` ("global") by default: every body takes the step ``dt``.
        ``"individual"``: hierarchical power-of-two steps, each body the longest ``dt /
        2**k`` its ``step_criterion`` allows, on an integer timeline, so that only the
        bodies whose steps end get forces (from all bodies) and kicks; ``dt`` is the longest
        step and every body is synchronised after each of the ``steps`` (snapshots and
        resumes happen there). The trajectory then has ``time_bin(time, body)`` and
        ``force_evaluations(time)``. With the direct method, the tree, or TreePM in static
        and comoving boxes (the short range in bins, the mesh on the longest step), on
        CPUs. See :mod:`nbody_dask.timebins` and the user guide's "Individual time steps".
    step_criterion : {"pairwise", "acceleration"}, optional
        ``nbody.step-criterion`` by default, which is "pairwise" (and "acceleration" with
        TreePM, whose short range sums no pairs' rates): a body's step is ``eta`` times a
        smooth maximum of the free-fall times ``sqrt(r^3 / G(m_i + m_j))`` of its pairs
        (softened). ``"acceleration"``: ``eta sqrt(softening / |a|)`` (GADGET's; needs
        softening > 0).
    eta : float, optional
        The individual steps' accuracy parameter (``nbody.eta``; by default 0.005 for
        ``"pairwise"``, 0.22 for ``"acceleration"``).
    time_bins : int, optional
        The number of individual step bins, the shortest step being ``dt / 2**(time_bins -
        1)`` (``nbody.time-bins``, 8).
    client : distributed.Client, optional
        Cluster to run on. None starts a :func:`nbody_dask.clusters.local` cluster bound
        to 127.0.0.1 and closes it afterwards.
    overwrite : bool, default False
        Replace an existing store. Without it an existing store is an error.
    resume : bool, default False
        Continue the run in ``store`` from its last committed snapshot, with the
        configuration stored there; parameters given as well must equal the stored ones.
        The result is bit-identical to an uninterrupted run.
    progress : bool, optional
        Show a progress bar; ``nbody.progress`` by default.
    callback : callable, optional
        Called in the driver as ``callback(step, record)`` each time a submission of steps
        completes, in order: ``record`` is the snapshot's diagnostics (a dict with
        ``kinetic_energy``, ``potential_energy``, ``total_energy``, ``momentum``,
        ``angular_momentum``, and ``force_error`` when recorded) once all of a snapshot's
        regions are written (the commit marker follows within a second), None for
        submissions that end between snapshots.
    max_energy_error : float, optional
        Stop the run with :class:`EnergyErrorExceeded` at the first snapshot whose relative
        energy error ``|E / E0 - 1|`` (``|E - E0|`` if ``E0`` is 0) exceeds this bound; E0 is
        the energy of snapshot 0 (also on resume). That snapshot and those before it stay
        committed. Not stored: give it again on resume. None: no bound.

    Returns
    -------
    xarray.Dataset
        The trajectory: ``position(time, body, axis)``, ``velocity(time, body, axis)``,
        ``mass(body)``, ``kinetic_energy``, ``potential_energy``, ``total_energy``,
        ``momentum(time, axis)``, ``angular_momentum(time, axis)`` (and
        ``force_error(time, statistic)`` with ``force_error_sample``), coordinates ``time``,
        ``step``, ``body`` and ``axis``. Lazy (backed by the store) when ``store`` is given;
        then the body ids are indexed (``traj.sel(body=42)``) when the bodies were given in
        memory, and a lazy coordinate without an index for lazy bodies and for a resume, so
        that a run of 2048^3 bodies never holds its ids here (``traj.set_xindex("body")``
        or :func:`nbody_dask.open_trajectory` indexes them).

    Raises
    ------
    TypeError, ValueError
        For invalid input, naming the parameter and the value, before any cluster starts
        or anything is written.
    FileExistsError
        If ``store`` exists and neither ``overwrite`` nor ``resume`` is set.
    SimulationInterrupted
        On SIGTERM (as Slurm sends before a walltime kill) or Ctrl-C: the steps in flight are
        finished, every completed snapshot is committed, and the run can be resumed.
    NonFiniteStateError
        At the first step whose state is not finite (naming the step and a body).
    EnergyErrorExceeded
        At the first snapshot beyond ``max_energy_error``.
    StoreInUseError
        If another live run holds ``store``'s writer lease.

    Notes
    -----
    If workers die, the run restarts on the remaining (or replacement) workers from the last
    committed snapshot, up to ``nbody.max-restarts`` times; the result does not change.

    Examples
    --------
    >>> ds0 = nbody_dask.plummer(4096, seed=0)                       # doctest: +SKIP
    >>> traj = nbody_dask.simulate(ds0, steps=100, dt=1/128, softening=0.01,
    ...                            store="run.zarr", snapshot_every=10)  # doctest: +SKIP
    >>> traj = nbody_dask.simulate(store="run.zarr", resume=True)     # doctest: +SKIP
    """
    _check_flags(overwrite=overwrite, resume=resume, callback=callback)
    if max_energy_error is not None:
        max_energy_error = check_real("max_energy_error", max_energy_error, positive=True)
        if cosmology is not None or "cosmology" in getattr(bodies, "attrs", {}):
            raise ValueError("max_energy_error is for isolated and static runs: the energy "
                             "of an expanding box is not conserved")
    show_progress = bool(config.get("progress", progress))
    args = RunArguments(steps=steps, dt=dt, softening=softening, G=G,
                        snapshot_every=snapshot_every, dtype=dtype, tile_size=tile_size,
                        split_every=split_every, backend=backend, layout=layout, method=method,
                        theta=theta, leaf_size=leaf_size, force_error_sample=force_error_sample,
                        box_size=box_size, mesh_size=mesh_size, mesh_slabs=mesh_slabs,
                        split=split, cutoff=cutoff, cosmology=cosmology, a_end=a_end,
                        z_end=z_end, snapshot_redshifts=snapshot_redshifts,
                        timestep=timestep, step_criterion=step_criterion, eta=eta,
                        time_bins=time_bins)
    if resume:
        plan, path, done = resume_point(bodies, store, storage_options, overwrite, args)
        ds, t0 = None, 0.0
    else:
        plan, path, ds, t0 = fresh_start(bodies, store, storage_options, overwrite, args)
        done = False
    with output_location(path) as (path, temporary), \
            writer_lease(None if temporary else path) as lease:
        if done:
            return open_trajectory(path, index=False)  # a resume with nothing left to do
        with client_context(client) as c:
            if client is None and show_progress:
                print(f"Dask dashboard: {dashboard_link(c)}", file=sys.stderr)
            plan = settle(plan, c)
            if show_progress:
                print(f"nbody-dask: {describe_method(plan, method)}", file=sys.stderr)
            if not resume:
                # a lazy body set: its values checked, its masses written by the cluster
                with dask.config.set(scheduler=c):
                    if is_lazy(ds):
                        ds = check_on_cluster(ds, plan)
                    _create_store(path, ds, plan, t0, lease)
            redshift = (lambda step: 1 / plan.scale_factor(step) - 1) if plan.comoving \
                else None
            with progress_bar(show_progress, plan.steps, redshift) as report, \
                    stop_on_signals() as stop:
                energy = EnergyBound(max_energy_error, path if resume else None)
                on_complete = _reporter(report, energy.check, callback)
                Driver(c, plan, path, lease, on_complete, stop).run_with_restarts(ds)
        # the ids indexed as the bodies were given: in memory, or (lazy bodies, a resume)
        # read by the workers that need them, never gathered here
        traj = open_trajectory(path, index=temporary or not (resume or is_lazy(ds)))
        return traj.load(scheduler="synchronous") if temporary else traj


def _check_flags(overwrite: Any, resume: Any, callback: Any) -> None:
    for name, flag in (("overwrite", overwrite), ("resume", resume)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")


def _create_store(path: StoreLocation, bodies: xr.Dataset, plan: Plan, t0: float,
                  lease: WriterLease | None) -> None:
    """Lay out a new run's store (its arrays, attributes and snapshot schedule), once this
    run is sure to hold its lease."""
    units = cf_units(bodies)
    if units is not None and plan.comoving:
        units.pop("time")  # a comoving run's time is the scale factor
    create_store(path, bodies, snapshot_steps=plan.snapshot_steps(),
                 times=plan.snapshot_times(t0), dtype=resolve_dtype(plan.dtype),
                 tile_size=plan.tile_size, attrs=store_attrs(plan, bodies), units=units,
                 force_errors=plan.force_error_sample > 0,
                 guard=None if lease is None else lease.check, scale_factor=plan.comoving,
                 time_bins=plan.individual)


def _reporter(*listeners: Callable[[int, dict | None], None] | None
              ) -> Callable[[int, dict | None], None]:
    """One callback that calls each listener given, in order."""
    present = [listener for listener in listeners if listener is not None]

    def on_complete(step: int, record: dict | None) -> None:
        for listener in present:
            listener(step, record)
    return on_complete
