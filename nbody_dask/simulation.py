"""simulate(): validation, the driver of a run (:class:`_Driver`), snapshots, progress;
and the one-shot force evaluations.

What a run computes is its :class:`~nbody_dask.plan.Plan`; the task graphs come from
:mod:`nbody_dask.graph`; the driver submits them and commits snapshots.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import signal
import threading
import time
import uuid
import warnings
from asyncio import CancelledError
from collections import deque
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from dask.base import tokenize
from distributed import Client, Future, wait
from distributed.client import FutureCancelledError
from distributed.comm.core import CommClosedError
from distributed.scheduler import KilledWorker

from . import __version__, config
from ._validate import check_int, check_real
from .backends import check_backend, cluster_backend
from .bodies import as_bodies, check_fits_dtype, resolve_dtype, split_tiles
from .clusters import client_context, dashboard_link, total_threads
from .diagnostics import as_record
from .graph import (TreeWindow, body_order, fused_steps, initial_pieces, key, snapshot_graph,
                    steps_pieces)
from .integrators import INTEGRATOR
from .kernels.tree import FarFieldError
from .lease import StoreInUseError, WriterLease, refuse_if_in_use
from .location import LocalLocation, StoreLocation, store_location
from .plan import (TREE_CROSSOVER, Plan, check_layout, check_method, resolve_method,
                   submission_ends)
from .units import code_value
from .storage import (SnapshotCommitter, check_store_path, committed_snapshots, create_store,
                      open_trajectory)

__all__ = ["simulate", "accelerations", "potential_energy", "SimulationInterrupted",
           "EnergyErrorExceeded",
           "load_snapshot"]


def _optional_int(name: str, value: Any, minimum: int) -> int | None:
    return None if value is None else check_int(name, value, minimum)


def _plan(n, steps, dt, softening, G, snapshot_every, dtype, tile_size, split_every, backend,
          layout, method=None, theta=None, leaf_size=None, force_error_sample=None) -> Plan:
    """Validate a run's parameters (config defaults filled in) into its :class:`Plan`."""
    layout = check_layout(config.get("layout", layout))  # Plan refuses rows with cuda
    method = resolve_method(check_method(config.get("method", method)), n)
    theta = check_real("theta", config.get("theta", theta), positive=True)
    if theta > 1:
        raise ValueError(f"theta must be in (0, 1], got {theta!r}")
    if method == "tree" and backend == "cuda":
        raise ValueError("method='tree' runs on CPUs, backend='cuda' needs method='direct' "
                         f"(method='auto' chose the tree for {n} bodies)")
    return Plan(
        n=n,
        steps=check_int("steps", steps, 0),
        dt=check_real("dt", dt, positive=True),
        softening=check_real("softening", softening, nonnegative=True),
        G=check_real("G", G, positive=True),
        snapshot_every=_optional_int("snapshot_every", snapshot_every, 1),
        dtype=np.dtype(resolve_dtype(config.get("dtype", dtype))).name,
        tile_size=_optional_int("tile_size", config.get("tile-size", tile_size), 1),
        split_every=check_int("split_every", config.get("split-every", split_every), 2),
        backend=backend,
        symmetric=bool(config.get("symmetric")),
        layout=layout,
        method=method,
        theta=theta,
        leaf_size=check_int("leaf_size", config.get("leaf-size", leaf_size), 1),
        retile_every=check_int("nbody.retile-every", config.get("retile-every"), 1),
        near_far_tiles=check_int("nbody.near-far-tiles", config.get("near-far-tiles"), 1),
        force_error_sample=check_int("force_error_sample", force_error_sample or 0, 0),
    )


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
        ``time`` coordinate, if scalar, becomes the start time. Not with ``resume``.
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
    method : {"auto", "direct", "tree"}, optional
        How forces are computed; ``nbody.method`` ("auto") by default. ``"direct"``: exact
        direct summation. ``"tree"``: an octree with quadrupole moments on spatial tiles
        (:mod:`nbody_dask.kernels.tree`), O(N log N), with a relative force error set by
        ``theta`` (median ~1e-4 at the default). ``"auto"``: direct below
        :data:`~nbody_dask.plan.TREE_CROSSOVER` bodies, the tree from there on. The choice
        is printed with the progress bar and stored in the trajectory's ``method``
        attribute. Results are bit-reproducible with either.
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
        ``step``, ``body`` and ``axis``. Lazy (backed by the store) when ``store`` is given.

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
    for name, flag in (("overwrite", overwrite), ("resume", resume)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")
    if max_energy_error is not None:
        max_energy_error = check_real("max_energy_error", max_energy_error, positive=True)
    show_progress = bool(config.get("progress", progress))
    backend = check_backend(config.get("backend", backend))
    given = dict(steps=steps, dt=dt, softening=softening, G=G, snapshot_every=snapshot_every,
                 dtype=dtype, tile_size=tile_size, split_every=split_every, theta=theta,
                 leaf_size=leaf_size, force_error_sample=force_error_sample)
    if resume:
        plan, path, done = _resume_point(bodies, store, storage_options, overwrite,
                                         {**given, "method": method}, backend, layout)
        ds = t0 = None
    else:
        plan, path, ds, t0 = _fresh_start(bodies, store, storage_options, overwrite,
                                          {**given, "method": method}, backend, layout)
        done = False
    with _output_path(path) as (path, temporary), \
            _writer_lease(None if temporary else path) as lease:
        if done:
            return open_trajectory(path)  # a resume with nothing left to do
        with client_context(client) as c:
            if client is None and show_progress:
                print(f"Dask dashboard: {dashboard_link(c)}", file=sys.stderr)
            plan = _settle(plan, c)
            if show_progress:
                print(f"nbody-dask: {_describe_method(plan, method)}", file=sys.stderr)
            if not resume:
                create_store(path, ds, snapshot_steps=plan.snapshot_steps(), t0=t0,
                             dt=plan.dt, dtype=resolve_dtype(plan.dtype),
                             tile_size=plan.tile_size, attrs=_store_attrs(plan, ds),
                             units=_cf_units(ds),
                             force_errors=plan.force_error_sample > 0)
            with _progress(show_progress, plan.steps) as report, _stop_on_signals() as stop:
                energy = _EnergyBound(max_energy_error, path if resume else None)

                def on_complete(step: int, record: dict | None) -> None:
                    report(step, record)
                    energy.check(step, record)
                    if callback is not None:
                        callback(step, record)

                _Driver(c, plan, path, lease, on_complete, stop).run_with_restarts(ds)
        traj = open_trajectory(path)
        return traj.load(scheduler="synchronous") if temporary else traj


class SimulationInterrupted(RuntimeError):
    """The run stopped early on request (SIGTERM or Ctrl-C); its committed snapshots are safe.

    Attributes
    ----------
    store : StoreLocation
        The store, to pass to ``simulate(store=..., resume=True)``.
    committed : int
        Snapshots committed.
    signum : int
        The signal that asked for the stop (``signal.SIGTERM`` or ``signal.SIGINT``).
    """

    def __init__(self, store: StoreLocation, committed: int,
                 signum: int = signal.SIGTERM) -> None:
        by = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
        super().__init__(f"interrupted by {by} with {committed} snapshot(s) committed in "
                         f"{str(store)!r}; continue with simulate(store=..., resume=True) or "
                         f"`nbody-dask resume {store}`")
        self.store = store
        self.committed = committed
        self.signum = int(signum)


class EnergyErrorExceeded(ArithmeticError):
    """The energy error passed ``max_energy_error``: the run stopped (its snapshots stay)."""


class _EnergyBound:
    """``simulate(max_energy_error=...)``: checks each snapshot's energy against snapshot 0's."""

    def __init__(self, bound: float | None, resumed_store: StoreLocation | None) -> None:
        self.bound = bound
        self.e0: float | None = None
        if bound is not None and resumed_store is not None:
            self.e0 = float(open_trajectory(resumed_store).total_energy[0])

    def check(self, step: int, record: dict | None) -> None:
        if self.bound is None or record is None:
            return
        energy = float(record["total_energy"])
        if self.e0 is None:
            self.e0 = energy
        error = abs(energy / self.e0 - 1) if self.e0 else abs(energy - self.e0)
        if not error <= self.bound:
            raise EnergyErrorExceeded(
                f"energy error {error:.3e} at step {step} exceeds max_energy_error="
                f"{self.bound!r}; the run stopped, its snapshots up to this one are committed")


def _fresh_start(bodies, store, storage_options, overwrite, given, backend, layout):
    """Validate a new run: its plan, store path, body set and start time."""
    missing = [k for k, v in (("bodies", bodies), ("steps", given["steps"]),
                              ("dt", given["dt"])) if v is None]
    if missing:
        raise TypeError(f"simulate() needs {', '.join(missing)} (or resume=True with a store)")
    given = {**given, "softening": 0.0 if given["softening"] is None else given["softening"],
             "G": 1.0 if given["G"] is None else given["G"]}
    ds = as_bodies(bodies)
    given["dt"] = code_value("dt", given["dt"], ds.attrs, "time")
    given["softening"] = code_value("softening", given["softening"], ds.attrs, "length")
    plan = _plan(ds.sizes["body"], **given, backend=backend, layout=layout)
    check_fits_dtype(ds, plan.dtype, dt=plan.dt, softening=plan.softening, G=plan.G,
                     dt_half=0.5 * plan.dt, softening_squared=plan.softening**2)
    if store is None and storage_options is not None:
        raise ValueError("storage_options are for store=<an object-store URL>; no store given")
    path = None if store is None else check_store_path(store, overwrite, storage_options)
    return plan, path, ds, _start_time(bodies)


def _resume_point(bodies, store, storage_options, overwrite, given, backend, layout):
    """Validate a resume: the stored plan, the store path, and whether it is complete."""
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
    plan = _stored_plan(ds, backend)
    if layout is not None:
        given = {**given, "layout": check_layout(layout)}
    for name, value in given.items():
        if value is None or (name == "method" and value == "auto"):
            continue
        if name == "dtype":
            value = np.dtype(resolve_dtype(value)).name
        expected = getattr(plan, name)
        if value != expected:
            raise ValueError(f"resume: {name}={value!r} differs from the store's "
                             f"{name}={expected!r}")
    if ds.sizes["time"] == 0:
        raise ValueError(f"store {str(path)!r} has no committed snapshot to resume from; "
                         "start a new run with overwrite=True")
    return plan, path, ds.sizes["time"] == len(plan.snapshot_steps())


def _stored_plan(ds: xr.Dataset, backend: str) -> Plan:
    """The plan of a stored run, with the kernel backend asked for now.

    The arithmetic (tiles, reduction, symmetric kernel, layout) is the stored one, so a
    resume repeats it exactly; stores written before the plan was stored ran the
    ``"pairs"`` layout and keep their tile size and kernel in separate attributes.
    """
    stored = {"method": "direct", **json.loads(ds.attrs["config"]),
              "tile_size": int(ds.attrs["tile_size"]),
              "symmetric": bool(ds.attrs.get("symmetric", 0)), "backend": backend}
    return Plan.from_stored(stored, ds.sizes["body"])


def load_snapshot(path: StoreLocation, index: int) -> xr.Dataset:
    """Snapshot ``index`` of a store as a body set (exact: float32 survives the round trip)."""
    snap = open_trajectory(path).isel(time=index)  # a damaged chunk is reported, not read
    return as_bodies(snap[["position", "velocity", "mass"]].load(scheduler="synchronous"))


_RECOVERABLE = (FutureCancelledError, KilledWorker, CommClosedError, CancelledError)


class _Driver:
    """Runs a plan on a cluster: submits graphs ahead, completes them in order, commits.

    The driver holds only futures. Each submission is the graph of several steps (up to the
    next snapshot, at most ``nbody.tasks-per-submit`` tasks) built on the futures of the one
    before, so the scheduler always has work queued; the driver waits only for the submission
    ``nbody.lookahead`` behind the newest, to commit its snapshot and report progress.
    """

    def __init__(self, client: Client, plan: Plan, path: StoreLocation,
                 lease: WriterLease | None,
                 on_complete: Callable[[int, dict | None], None],
                 stop: threading.Event) -> None:
        self.client, self.plan, self.path, self.lease = client, plan, path, lease
        self.on_complete, self.stop = on_complete, stop
        self.snapshot_steps = plan.snapshot_steps()
        self.snapshots = {step: k for k, step in enumerate(self.snapshot_steps)}
        self.threads = config.get("kernel-threads")
        self.lookahead = max(1, int(config.get("lookahead")))
        self.pending: deque[tuple[int, int | None, Any]] = deque()
        self.committer: SnapshotCommitter | None = None
        self.token = ""
        self.window: TreeWindow | None = None
        self.walk_all: set[int] = set()  # windows whose far tasks failed: every pair walked

    def run_with_restarts(self, bodies: xr.Dataset | None) -> None:
        """Run to the end; after lost workers, restart from the last committed snapshot.

        When bodies outran a window's near/far margin (:class:`FarFieldError`), restart from
        the last committed snapshot too, walking every tile pair in that window: a resumed
        run meets the same failure at the same step and does the same, so the results stay
        bit-identical."""
        max_restarts, restart = int(config.get("max-restarts")), 0
        while True:
            try:
                return self.run(bodies)
            except FarFieldError as exc:
                start = max(r for r in self.plan.retile_steps() if r <= (exc.step or 0))
                if exc.step is None or start in self.walk_all:
                    raise
                self.walk_all.add(start)
                snapshot = max(committed_snapshots(self.path) - 1, 0)
                warnings.warn(f"{exc}; restarting from snapshot {snapshot}, walking every tile "
                              f"pair in steps {start + 1}-{self.plan.window_end(start)}",
                              RuntimeWarning, stacklevel=3)
            except _RECOVERABLE as exc:
                restart += 1
                if restart > max_restarts:
                    raise
                snapshot = max(committed_snapshots(self.path) - 1, 0)
                warnings.warn(f"run failed ({type(exc).__name__}: {exc}); restarting from "
                              f"snapshot {snapshot} (restart {restart} of {max_restarts})",
                              RuntimeWarning, stacklevel=3)

    def run(self, bodies: xr.Dataset | None) -> None:
        """The step loop from the last committed snapshot (none: from ``bodies``)."""
        self.pending.clear()
        self.committer = SnapshotCommitter(self.path, guard=self.lease and self.lease.check)
        try:
            state, step = self.start(bodies)
            max_steps = self.plan.steps_per_submission(config.get("tasks-per-submit"))
            for end in submission_ends(self.snapshot_steps, max_steps):
                if end <= step:
                    continue
                if self.stop.is_set():
                    break
                state, step = self.submit_steps(state, step, end), end
                while len(self.pending) > self.lookahead:
                    self.complete()
            while self.pending:
                self.complete()
            self.committer.flush()
        except OSError as exc:
            self.committer.flush(quietly=True)
            if isinstance(exc, _RECOVERABLE):  # CommClosedError is an OSError too
                raise
            raise OSError(exc.errno, f"writing to the store {str(self.path)!r} failed ({exc}); "
                          f"{self.committer.committed} snapshot(s) are committed and intact: "
                          "fix the cause, then resume") from exc
        except BaseException:
            self.committer.flush(quietly=True)
            raise
        if self.stop.is_set():
            raise SimulationInterrupted(self.path, self.committer.committed, self.stop.signum)

    def start(self, bodies: xr.Dataset | None) -> tuple[list[Future], int]:
        """Scatter the tiles of the last committed snapshot (none: ``bodies``, whose snapshot
        is then submitted) and compute their forces; return them and their step."""
        plan, c, index = self.plan, self.client, max(self.committer.committed - 1, 0)
        if self.committer.committed:
            bodies = load_snapshot(self.path, index)
        self.token = _run_token(bodies, plan, str(self.path), index)
        tiles = c.scatter(split_tiles(bodies, plan.tile_size, resolve_dtype(plan.dtype)),
                          hash=False)
        step = self.snapshot_steps[index]
        state, self.window = submit_pieces(c, initial_pieces(
            plan, self.token, tiles, threads=self.threads, step=step,
            walk_all=frozenset(self.walk_all)))
        if self.committer.committed:
            self.on_complete(step, None)
        else:
            self.submit_snapshot(state, step)
        return state, step

    def submit_steps(self, state: list[Future], step: int, end: int) -> list[Future]:
        """Submit steps ``step + 1 .. end`` on ``state``; return the futures of the result."""
        plan, potential = self.plan, frozenset(self.snapshot_steps)
        if plan.fused:
            dsk = {key(self.token, "fused", end, 0): (fused_steps, state[0], plan, self.token,
                                                      step + 1, end, potential, self.threads)}
            state = self.client.get(dsk, list(dsk), sync=False)
        else:
            state, self.window = submit_pieces(self.client, steps_pieces(
                plan, self.token, state, self.window, step + 1, end, potential, self.threads,
                frozenset(self.walk_all)))
        if end in self.snapshots:
            self.submit_snapshot(state, end)
        else:
            self.pending.append((end, None, state))
        return state

    def submit_snapshot(self, state: list[Future], step: int) -> None:
        index = self.snapshots[step]
        dsk, total = snapshot_graph(self.plan, self.token, state, step, self.path, index,
                                    "" if self.lease is None else self.lease.run_id)
        self.pending.append((step, index, self.client.get(dsk, total, sync=False)))

    def complete(self) -> None:
        """Wait for the oldest submission; commit its snapshot, report it."""
        step, index, futures = self.pending.popleft()
        if index is None:
            wait(futures)
            for f in futures:
                if f.status != "finished":
                    f.result()  # re-raises the task's exception here, in the driver
            record = None
        else:
            record = as_record(futures.result())
            self.committer.add(index, record)
        self.on_complete(step, record)


def submit_pieces(client: Client, pieces: Generator) -> Any:
    """Submit a graph built in pieces (:data:`nbody_dask.graph.Piece`): each piece as it
    comes, sending back the futures it wants and the values it fetches; return the
    generator's result."""
    reply = None
    while True:
        try:
            dsk, wanted, fetched = pieces.send(reply)
        except StopIteration as done:
            return done.value
        keys = [w for w in wanted if isinstance(w, str)]
        futures = dict(zip(keys, client.get(dsk, keys, sync=False), strict=True))
        refs = [futures[w] if isinstance(w, str) else w for w in wanted]
        reply = refs, client.gather(refs[:fetched])


class _StopRequest(threading.Event):
    """Set by SIGTERM or a first Ctrl-C (SIGINT); ``signum`` says which."""

    signum: int = signal.SIGTERM


@contextmanager
def _stop_on_signals() -> Iterator[_StopRequest]:
    """A stop request set by SIGTERM or Ctrl-C while the block runs (main thread only).

    Either lets the steps in flight finish and commit, then :class:`SimulationInterrupted` is
    raised. After a first Ctrl-C, a second one interrupts at once (``KeyboardInterrupt``).
    """
    stop = _StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_term(signum, frame) -> None:
        stop.signum = signum
        stop.set()

    def on_interrupt(signum, frame) -> None:
        on_term(signum, frame)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("nbody-dask: Ctrl-C: finishing the steps in flight and committing them; "
              "Ctrl-C again stops at once", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, handler)
                for sig, handler in ((signal.SIGTERM, on_term), (signal.SIGINT, on_interrupt))}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _progress(enabled: bool, steps: int):
    """A rich progress bar with steps/s, ETA, the relative energy error and, when recorded,
    the median sampled force error."""
    if not enabled:
        yield lambda step, record: None
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    columns = [TextColumn("[bold]nbody"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]} steps/s"), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[energy]}")]
    start = time.perf_counter()
    energy0: list[float] = []
    with Progress(*columns) as bar:
        task = bar.add_task("steps", total=steps, rate="-", energy="")

        def report(step: int, record: dict | None) -> None:
            fields = {"rate": f"{step / max(time.perf_counter() - start, 1e-9):.1f}"}
            if record is not None:
                if not energy0:
                    energy0.append(record["total_energy"])
                e0 = energy0[0]
                if e0 != 0:
                    fields["energy"] = f"|dE/E| {abs(record['total_energy'] / e0 - 1):.2e}"
                if "force_error" in record:
                    fields["energy"] = (f"{fields.get('energy', '')}  force error median "
                                        f"{record['force_error'][0]:.1e}")
            bar.update(task, completed=step, **fields)

        yield report


@contextmanager
def _output_path(path: StoreLocation | None):
    """Yield (location, temporary): the store's, or a temporary one removed afterwards."""
    if path is not None:
        yield path, False
        return
    tmp = Path(tempfile.mkdtemp(prefix="nbody-dask-"))
    try:
        yield LocalLocation(tmp / "trajectory.zarr"), True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _writer_lease(store: StoreLocation | None) -> Iterator[WriterLease | None]:
    """Hold the store's writer lease for the block (None: a private temporary store).

    A new local store's directory is created here, exclusively: of two runs starting into
    one new store, one gets it (in an object store, the lease's exclusive create decides).
    If the run ends before laying the store out, the directory goes too.
    """
    if store is None:
        yield None
        return
    created = False
    if isinstance(store, LocalLocation) and not store.exists():
        try:
            store.path.mkdir(parents=True)
        except FileExistsError:
            raise StoreInUseError(f"store {str(store)!r} appeared while this run was "
                                  "starting: another run is writing it") from None
        created = True
    lease = WriterLease(store)
    try:
        lease.acquire()
        try:
            yield lease
        finally:
            lease.release()
    finally:
        if created and not store.exists("zarr.json"):
            shutil.rmtree(store.path, ignore_errors=True)  # nothing but our lease was in it


def _run_token(*inputs: Any) -> str:
    """Key token of one run: its inputs plus a nonce.

    Keys stay deterministic within a run (``nbody-<stage>-<token>-<step>-<i>``); the nonce
    keeps two identical runs on one client from sharing keys, since a key released by one
    run and resubmitted at once by the next can be cancelled in flight.
    """
    return tokenize(*inputs, uuid.uuid4().hex)


PHYSICAL_UNIT_ATTRS = ("length_unit", "mass_unit", "time_unit", "velocity_unit")
"""Body-set attributes copied to the store, to declare what one code unit is physically
(e.g. ``bodies.attrs["length_unit"] = "1 kpc"``); ``units`` is copied too."""


def _start_time(bodies: Any) -> float:
    if isinstance(bodies, xr.Dataset) and "time" in bodies.coords and bodies["time"].ndim == 0:
        return check_real("bodies.time", bodies["time"].item())
    return 0.0


def _cf_units(ds: xr.Dataset) -> dict[str, str] | None:
    """CF ``units`` of the store's variables when the bodies carry a physical unit system
    that astropy reads; None otherwise (``length_unit`` and the like written by hand as free
    text, or no astropy: the attributes are stored as they are)."""
    if not all(k in ds.attrs for k in ("length_unit", "mass_unit")):
        return None
    try:
        from .units import UnitSystem

        return UnitSystem.from_attrs(ds.attrs).cf_units()
    except (ImportError, TypeError, ValueError):
        return None


def _settle(plan: Plan, client: Client) -> Plan:
    """The plan with the tile size and kernel backend chosen for this cluster."""
    backend = cluster_backend(client, plan.backend)
    return plan.settle(total_threads(client), len(client.nthreads()), backend)


def _describe_method(plan: Plan, asked: str | None) -> str:
    """One line saying how forces are computed, and why when ``method="auto"`` chose."""
    asked = config.get("method", asked)
    if plan.method == "direct":
        what = "forces by direct summation (exact)"
    else:
        tiles = f"{plan.n_tiles} spatial tiles" if plan.n_tiles > 1 else "one tile"
        if plan.near_far:
            tiles += " (far tile pairs from tree summaries)"
        what = f"forces by the tree, theta={plan.theta}, leaf_size={plan.leaf_size}, {tiles}"
    if asked == "auto":
        side = ">=" if plan.method == "tree" else "<"
        what += f" (method='auto': {plan.n} bodies {side} {TREE_CROSSOVER})"
    return what


def _store_attrs(plan: Plan, ds: xr.Dataset) -> dict[str, Any]:
    return {
        "title": "nbody_dask trajectory",
        "G": plan.G,
        "softening": plan.softening,
        "dt": plan.dt,
        "integrator": INTEGRATOR,
        "dtype": plan.dtype,
        "units": ds.attrs.get("units", "N-body (Henon) units: G = M = 1, E = -1/4"),
        "snapshot_every": plan.snapshot_every or plan.steps,
        "tile_size": plan.tile_size,
        "backend": plan.backend,
        "symmetric": int(plan.symmetric),
        "layout": plan.layout,
        "method": plan.method,
        **({"theta": plan.theta, "leaf_size": plan.leaf_size} if plan.method == "tree" else {}),
        **({"force_error_sample": plan.force_error_sample} if plan.force_error_sample else {}),
        "nbody_dask_version": __version__,
        "config": json.dumps(plan.stored()),
        **{k: ds.attrs[k] for k in PHYSICAL_UNIT_ATTRS if k in ds.attrs},
    }


def _one_shot(bodies, softening, G, dtype, tile_size, backend, layout, method, theta,
              leaf_size, client, with_potential):
    """Evaluate forces once on the cluster and gather the tiles in body order (small outputs
    only)."""
    backend = check_backend(config.get("backend", backend))
    ds = as_bodies(bodies)
    plan = _plan(ds.sizes["body"], 0, 1.0, softening, G, None, dtype, tile_size, None,
                 backend, layout, method, theta, leaf_size)
    check_fits_dtype(ds, plan.dtype, softening=plan.softening, G=plan.G,
                     softening_squared=plan.softening**2)
    with client_context(client) as c:
        plan = _settle(plan, c)
        token = _run_token(ds, plan)
        threads = config.get("kernel-threads")
        tiles = c.scatter(split_tiles(ds, plan.tile_size, resolve_dtype(plan.dtype)),
                          hash=False)
        state, _ = submit_pieces(c, initial_pieces(plan, token, tiles, with_potential,
                                                   threads))
        dsk: dict = {}
        if with_potential:
            dsk, total = snapshot_graph(plan, token, state, 0, None, 0)
            return c.get(dsk, total)
        keys = body_order(dsk, plan, token, 0, state)
        return c.get(dsk, keys) if dsk else c.gather(keys)


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
    client: Client | None = None,
) -> np.ndarray:
    """Gravitational accelerations of all bodies: one force evaluation on the cluster.

    Parameters are those of :func:`simulate`.

    Returns
    -------
    ndarray, shape (n, 3)
        In the run's dtype.
    """
    tiles = _one_shot(bodies, softening, G, dtype, tile_size, backend, layout, method, theta,
                      leaf_size, client, with_potential=False)
    return np.concatenate([t.acceleration for t in tiles], axis=1).T.copy()


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
    client: Client | None = None,
) -> float:
    """Total potential energy ``-G sum_{i<j} m_i m_j / sqrt(r_ij^2 + eps^2)``.

    Parameters are those of :func:`simulate` (with ``method="tree"`` the potential is the
    tree's: monopole plus quadrupole for accepted cells). Accumulated in float64 across
    tiles.
    """
    vector = _one_shot(bodies, softening, G, dtype, tile_size, backend, layout, method,
                       theta, leaf_size, client, with_potential=True)
    return float(vector[1])
