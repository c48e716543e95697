"""simulate(): the step loop, snapshots and progress; and the one-shot force evaluations.

The driver holds only futures. Each submission is the task graph of several steps (up to the
next snapshot, and at most ``nbody.tasks-per-submit`` tasks) built on the futures of the last
one, so the scheduler always has work queued; the driver waits only for a submission
``nbody.lookahead`` behind the newest, to commit snapshots and report progress.
"""

from __future__ import annotations

import json
import math
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
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
from .bodies import as_bodies, auto_tile_size, check_fits_dtype, resolve_dtype, split_tiles
from .clusters import client_context, dashboard_link, total_threads
from .diagnostics import as_record
from .graph import StepPlan, fused_steps, initial_graph, lazy, snapshot_graph, step_graph
from .integrators import INTEGRATOR
from .lease import StoreInUseError, WriterLease, refuse_if_in_use
from .storage import (SnapshotCommitter, check_store_path, committed_snapshots, create_store,
                      open_trajectory, store_path)

__all__ = ["simulate", "accelerations", "potential_energy", "RunConfig", "SimulationInterrupted",
           "EnergyErrorExceeded",
           "load_snapshot"]


@dataclass(frozen=True)
class RunConfig:
    """The validated parameters of a run, as stored in the trajectory's attributes."""

    steps: int
    dt: float
    softening: float
    G: float
    snapshot_every: int | None
    dtype: str
    tile_size: int | None
    split_every: int

    def snapshot_steps(self) -> list[int]:
        """Steps at which a snapshot is written: 0, every ``snapshot_every``, and the last."""
        every = self.snapshot_every or max(self.steps, 1)
        return sorted(set(range(0, self.steps + 1, every)) | {self.steps})


def _optional_int(name: str, value: Any, minimum: int) -> int | None:
    return None if value is None else check_int(name, value, minimum)


def _run_config(steps, dt, softening, G, snapshot_every, dtype, tile_size, split_every):
    return RunConfig(
        steps=check_int("steps", steps, 0),
        dt=check_real("dt", dt, positive=True),
        softening=check_real("softening", softening, nonnegative=True),
        G=check_real("G", G, positive=True),
        snapshot_every=_optional_int("snapshot_every", snapshot_every, 1),
        dtype=np.dtype(resolve_dtype(config.get("dtype", dtype))).name,
        tile_size=_optional_int("tile_size", config.get("tile-size", tile_size), 1),
        split_every=check_int("split_every", config.get("split-every", split_every), 2),
    )


def simulate(
    bodies: xr.Dataset | dict | None = None,
    steps: int | None = None,
    dt: float | None = None,
    softening: float | None = None,
    *,
    G: float | None = None,
    store: str | Path | None = None,
    snapshot_every: int | None = None,
    dtype: str | None = None,
    tile_size: int | None = None,
    split_every: int | None = None,
    backend: str | None = None,
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
    dt : float
        Step length (> 0), in the units of the bodies (Hénon N-body units for the built-in
        initial conditions).
    softening : float, default 0
        Plummer softening length eps (>= 0). With eps = 0 coincident bodies exert no force.
    G : float, default 1
        Gravitational constant.
    store : str or Path, optional
        Zarr v3 store to write the trajectory to. Without one the trajectory is written to a
        temporary directory (which the workers must be able to reach: fine for local
        clusters), loaded into memory and deleted.
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
        ``angular_momentum``) once all of a snapshot's regions are written (the commit marker
        follows within a second), None for submissions that end between snapshots.
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
        ``momentum(time, axis)``, ``angular_momentum(time, axis)``, coordinates ``time``,
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
                 dtype=dtype, tile_size=tile_size, split_every=split_every)
    if resume:
        start = _resume_point(bodies, store, overwrite, given)
    else:
        start = _fresh_start(bodies, store, overwrite, given)
    cfg = start.cfg
    with _output_path(start.path) as (path, temporary), \
            _writer_lease(None if temporary else path) as lease:
        if start.index == len(cfg.snapshot_steps()) - 1 and resume:
            return open_trajectory(path)  # nothing left to do
        with client_context(client) as c:
            if client is None and show_progress:
                print(f"Dask dashboard: {dashboard_link(c)}", file=sys.stderr)
            backend = cluster_backend(c, backend)
            tile = _tile_size(cfg, start.n, c, backend)
            if not resume:
                create_store(path, start.bodies, snapshot_steps=cfg.snapshot_steps(),
                             t0=start.t0, dt=cfg.dt, dtype=resolve_dtype(cfg.dtype),
                             tile_size=tile,
                             attrs=_store_attrs(cfg, tile, backend, start.bodies))
            with _progress(show_progress, cfg.steps) as report, _stop_on_signals() as stop:
                energy = _EnergyBound(max_energy_error, path if resume else None)

                def on_complete(step: int, record: dict | None) -> None:
                    report(step, record)
                    energy.check(step, record)
                    if callback is not None:
                        callback(step, record)

                _run_with_restarts(c, start, tile, backend, path, on_complete, stop, lease)
        traj = open_trajectory(path)
        return traj.load(scheduler="synchronous") if temporary else traj


class SimulationInterrupted(RuntimeError):
    """The run stopped early on request (SIGTERM or Ctrl-C); its committed snapshots are safe.

    Attributes
    ----------
    store : Path
        The store, to pass to ``simulate(store=..., resume=True)``.
    committed : int
        Snapshots committed.
    signum : int
        The signal that asked for the stop (``signal.SIGTERM`` or ``signal.SIGINT``).
    """

    def __init__(self, store: Path, committed: int, signum: int = signal.SIGTERM) -> None:
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

    def __init__(self, bound: float | None, resumed_store: Path | None) -> None:
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


@dataclass
class _Start:
    """Where a run starts: validated configuration, store, first snapshot index, bodies."""

    cfg: RunConfig
    path: Path | None
    index: int
    bodies: xr.Dataset
    t0: float

    @property
    def n(self) -> int:
        return self.bodies.sizes["body"]


def _fresh_start(bodies, store, overwrite, given) -> _Start:
    missing = [k for k, v in (("bodies", bodies), ("steps", given["steps"]),
                              ("dt", given["dt"])) if v is None]
    if missing:
        raise TypeError(f"simulate() needs {', '.join(missing)} (or resume=True with a store)")
    given = {**given, "softening": 0.0 if given["softening"] is None else given["softening"],
             "G": 1.0 if given["G"] is None else given["G"]}
    cfg = _run_config(**given)
    ds = as_bodies(bodies)
    check_fits_dtype(ds, cfg.dtype, dt=cfg.dt, softening=cfg.softening, G=cfg.G,
                     dt_half=0.5 * cfg.dt, softening_squared=cfg.softening * cfg.softening)
    path = None if store is None else check_store_path(store, overwrite)
    return _Start(cfg, path, 0, ds, _start_time(bodies))


def _resume_point(bodies, store, overwrite, given) -> _Start:
    if store is None:
        raise ValueError("resume=True needs store=, the store of the run to continue")
    if bodies is not None:
        raise ValueError("resume=True continues from the store; do not pass bodies")
    if overwrite:
        raise ValueError("resume=True and overwrite=True conflict: choose one")
    path = store_path(store)
    if not path.exists():
        raise FileNotFoundError(f"no trajectory store at {str(path)!r} to resume")
    refuse_if_in_use(path)
    ds = open_trajectory(path)  # validates the store
    committed = ds.sizes["time"]
    stored = json.loads(ds.attrs["config"])
    for name, value in given.items():
        if value is None:
            continue
        if name == "dtype":
            value = np.dtype(resolve_dtype(value)).name
        expected = stored[name] if name != "tile_size" else ds.attrs["tile_size"]
        if value != expected:
            raise ValueError(f"resume: {name}={value!r} differs from the store's "
                             f"{name}={expected!r}")
    if committed == 0:
        raise ValueError(f"store {str(path)!r} has no committed snapshot to resume from; "
                         "start a new run with overwrite=True")
    cfg = RunConfig(**{**stored, "tile_size": ds.attrs["tile_size"]})
    index = committed - 1
    return _Start(cfg, path, index, load_snapshot(path, index), float(ds.time[index]))


def load_snapshot(path: Path, index: int) -> xr.Dataset:
    """Snapshot ``index`` of a store as a body set (exact: float32 survives the round trip)."""
    snap = open_trajectory(path).isel(time=index)  # a damaged chunk is reported, not read
    return as_bodies(snap[["position", "velocity", "mass"]].load(scheduler="synchronous"))


_RECOVERABLE = (FutureCancelledError, KilledWorker, CommClosedError, CancelledError)


def _run_with_restarts(c: Client, start: _Start, tile: int, backend: str, path: Path,
                       on_complete, stop: threading.Event,
                       lease: WriterLease | None) -> None:
    """Run to the end; after a lost worker, restart from the last committed snapshot."""
    max_restarts = int(config.get("max-restarts"))
    restarts = 0
    while True:
        try:
            _run(c, start, tile, backend, path, on_complete, stop, lease)
            return
        except _RECOVERABLE as exc:
            restarts += 1
            if restarts > max_restarts:
                raise
            committed = committed_snapshots(path)
            warnings.warn(f"run failed ({type(exc).__name__}: {exc}); restarting from "
                          f"snapshot {max(committed - 1, 0)} "
                          f"(restart {restarts} of {max_restarts})", RuntimeWarning,
                          stacklevel=2)
            if committed:
                start = _Start(start.cfg, path, committed - 1,
                               load_snapshot(path, committed - 1), start.t0)
            else:
                start = _Start(start.cfg, path, 0, start.bodies, start.t0)


def _run(c: Client, start: _Start, tile: int, backend: str, path: Path, on_complete,
         stop: threading.Event, lease: WriterLease | None) -> None:
    """The step loop from snapshot ``start.index``: submit graphs ahead, commit in order."""
    cfg = start.cfg
    snapshot_steps = cfg.snapshot_steps()
    snapshot_index = {step: k for k, step in enumerate(snapshot_steps)}
    potential_steps = frozenset(snapshot_steps)
    first_step = snapshot_steps[start.index]
    n_tiles = math.ceil(start.n / tile)
    fused = n_tiles == 1
    if fused:  # one task per submission: bound its length to ~1e9 interactions
        max_steps = max(1, int(1e9 // max(start.n**2, 1)))
    else:
        max_steps = max(1, config.get("tasks-per-submit") // (n_tiles**2 + 3 * n_tiles))
    lookahead = max(1, int(config.get("lookahead")))
    pending: deque[tuple[int, int | None, Any]] = deque()
    committer = SnapshotCommitter(path, guard=None if lease is None else lease.check)
    plan = StepPlan(_run_token(start.bodies, cfg, tile, str(path.resolve()), start.index),
                    cfg.dt, cfg.softening, cfg.G, cfg.split_every, backend, _symmetric(backend),
                    writer="" if lease is None else lease.run_id)

    def submit_snapshot(state: list[Future], step: int) -> None:
        index = snapshot_index[step]
        diag = c.compute(snapshot_graph(state, plan, step, str(path), index),
                         optimize_graph=False)
        pending.append((step, index, diag))

    def complete(item: tuple[int, int | None, Any]) -> None:
        step, index, futures = item
        if index is None:
            wait(futures)
            for f in futures:
                if f.status != "finished":
                    f.result()  # re-raises the task's exception here, in the driver
            record = None
        else:
            record = as_record(futures.result())
            committer.add(index, record)
        on_complete(step, record)

    tiles = c.scatter(split_tiles(start.bodies, tile, resolve_dtype(cfg.dtype)), hash=False)
    state = c.compute(initial_graph(tiles, plan), optimize_graph=False)
    del tiles  # the scattered copies are not needed once the forces are computed
    try:
        if committer.committed == start.index:  # a new run: snapshot 0 is not written yet
            submit_snapshot(state, first_step)
        else:
            on_complete(first_step, None)
        step = first_step
        for end in _submission_ends(cfg.steps, snapshot_steps, max_steps):
            if end <= first_step:
                continue
            if stop.is_set():
                break
            if fused:
                graph = [lazy(fused_steps, state[0], plan, step + 1, end, potential_steps,
                              key=plan.key("fused", end))]
            else:
                graph = state
                for s in range(step + 1, end + 1):
                    graph = step_graph(graph, plan, s, with_potential=s in potential_steps)
            state = c.compute(graph, optimize_graph=False)
            step = end
            if end in snapshot_index:
                submit_snapshot(state, end)
            else:
                pending.append((end, None, state))
            while len(pending) > lookahead:
                complete(pending.popleft())
        while pending:
            complete(pending.popleft())
        committer.flush()
    except _RECOVERABLE:  # (CommClosedError is an OSError too: keep this first)
        committer.flush(quietly=True)
        raise
    except OSError as exc:  # disk full, store removed or made read-only mid-run
        committer.flush(quietly=True)
        raise OSError(exc.errno, f"writing to the store {str(path)!r} failed ({exc}); "
                      f"{committer.committed} snapshot(s) are committed and intact: fix the "
                      "cause, then resume") from exc
    except BaseException:
        committer.flush(quietly=True)
        raise
    if stop.is_set():
        raise SimulationInterrupted(path, committer.committed, stop.signum)


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


def _submission_ends(steps: int, snapshot_steps: list[int], max_steps: int) -> Iterator[int]:
    """Last step of each submission: every snapshot step, and at most ``max_steps`` apart."""
    prev = 0
    for snap in snapshot_steps[1:]:
        n = math.ceil((snap - prev) / max_steps)
        for k in range(1, n + 1):
            yield prev + math.ceil(k * (snap - prev) / n)
        prev = snap


@contextmanager
def _progress(enabled: bool, steps: int):
    """A rich progress bar with steps/s, ETA and the relative energy error."""
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
            bar.update(task, completed=step, **fields)

        yield report


@contextmanager
def _output_path(path: Path | None):
    """Yield (path, temporary): the store's path, or a temporary one removed afterwards."""
    if path is not None:
        yield path, False
        return
    tmp = Path(tempfile.mkdtemp(prefix="nbody-dask-"))
    try:
        yield tmp / "trajectory.zarr", True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _writer_lease(path: Path | None) -> Iterator[WriterLease | None]:
    """Hold the store's writer lease for the block (None: a private temporary store).

    A new store's directory is created here, exclusively: of two runs starting into one new
    store, one gets it. If the run ends before laying the store out, the directory goes too.
    """
    if path is None:
        yield None
        return
    created = False
    if not path.exists():
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            raise StoreInUseError(f"store {str(path)!r} appeared while this run was starting: "
                                  "another run is writing it") from None
        created = True
    lease = WriterLease(path)
    try:
        lease.acquire()
        try:
            yield lease
        finally:
            lease.release()
    finally:
        if created and not (path / "zarr.json").exists():
            shutil.rmtree(path, ignore_errors=True)  # nothing but our lease was ever in it


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


def _tile_size(cfg: RunConfig, n: int, client: Client, backend: str) -> int:
    """The run's tile size: the one asked for, else :func:`auto_tile_size` for this cluster."""
    return cfg.tile_size or auto_tile_size(n, total_threads(client), backend)


def _symmetric(backend: str) -> bool:
    """Whether tile pairs use the symmetric kernel: ``nbody.symmetric`` and the CPU backend."""
    return bool(config.get("symmetric")) and backend == "cpu"


def _store_attrs(cfg: RunConfig, tile_size: int, backend: str,
                 ds: xr.Dataset) -> dict[str, Any]:
    return {
        "title": "nbody_dask trajectory",
        "G": cfg.G,
        "softening": cfg.softening,
        "dt": cfg.dt,
        "integrator": INTEGRATOR,
        "dtype": cfg.dtype,
        "units": ds.attrs.get("units", "N-body (Henon) units: G = M = 1, E = -1/4"),
        "snapshot_every": cfg.snapshot_every or cfg.steps,
        "tile_size": tile_size,
        "backend": backend,
        "symmetric": int(_symmetric(backend)),
        "nbody_dask_version": __version__,
        "config": json.dumps(asdict(cfg)),
        **{k: ds.attrs[k] for k in PHYSICAL_UNIT_ATTRS if k in ds.attrs},
    }


def _one_shot(bodies, softening, G, dtype, tile_size, backend, client, with_potential):
    """Evaluate forces once on the cluster and gather the tiles (small outputs only)."""
    cfg = _run_config(0, 1.0, softening, G, None, dtype, tile_size, None)
    backend = check_backend(config.get("backend", backend))
    ds = as_bodies(bodies)
    check_fits_dtype(ds, cfg.dtype, softening=cfg.softening, G=cfg.G,
                     softening_squared=cfg.softening * cfg.softening)
    with client_context(client) as c:
        backend = cluster_backend(c, backend)
        tile = _tile_size(cfg, ds.sizes["body"], c, backend)
        plan = StepPlan(_run_token(ds, cfg, tile), 1.0, cfg.softening, cfg.G,
                        cfg.split_every, backend, _symmetric(backend))
        tiles = c.scatter(split_tiles(ds, tile, resolve_dtype(cfg.dtype)), hash=False)
        forced = initial_graph(tiles, plan, with_potential)
        if with_potential:
            return c.compute(snapshot_graph(forced, plan, 0, None, 0),
                             optimize_graph=False).result()
        return c.gather(c.compute(forced, optimize_graph=False))


def accelerations(
    bodies: xr.Dataset | dict,
    softening: float = 0.0,
    *,
    G: float = 1.0,
    dtype: str | None = None,
    tile_size: int | None = None,
    backend: str | None = None,
    client: Client | None = None,
) -> np.ndarray:
    """Gravitational accelerations of all bodies: one force evaluation on the cluster.

    Parameters are those of :func:`simulate`.

    Returns
    -------
    ndarray, shape (n, 3)
        In the run's dtype.
    """
    tiles = _one_shot(bodies, softening, G, dtype, tile_size, backend, client,
                      with_potential=False)
    return np.concatenate([t.acceleration for t in tiles], axis=1).T.copy()


def potential_energy(
    bodies: xr.Dataset | dict,
    softening: float = 0.0,
    *,
    G: float = 1.0,
    dtype: str | None = None,
    tile_size: int | None = None,
    backend: str | None = None,
    client: Client | None = None,
) -> float:
    """Total potential energy ``-G sum_{i<j} m_i m_j / sqrt(r_ij^2 + eps^2)``.

    Parameters are those of :func:`simulate`. Accumulated in float64 across tiles.
    """
    vector = _one_shot(bodies, softening, G, dtype, tile_size, backend, client,
                       with_potential=True)
    return float(vector[1])
