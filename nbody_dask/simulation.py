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
import time
import uuid
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

from . import __version__, config
from ._validate import check_int, check_real
from .bodies import as_bodies, auto_tile_size, resolve_dtype, split_tiles
from .clusters import client_context, total_threads
from .diagnostics import as_record
from .graph import StepPlan, fused_steps, initial_graph, lazy, snapshot_graph, step_graph
from .integrators import INTEGRATOR
from .storage import SnapshotCommitter, check_store_path, create_store, open_trajectory

__all__ = ["simulate", "accelerations", "potential_energy", "RunConfig"]


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


def _run_config(steps, dt, softening, G, snapshot_every, dtype, tile_size, split_every):
    return RunConfig(
        steps=check_int("steps", steps, 0),
        dt=check_real("dt", dt, positive=True),
        softening=check_real("softening", softening, nonnegative=True),
        G=check_real("G", G, positive=True),
        snapshot_every=None if snapshot_every is None else check_int(
            "snapshot_every", snapshot_every, 1),
        dtype=np.dtype(resolve_dtype(config.get("dtype", dtype))).name,
        tile_size=None if tile_size is None else check_int("tile_size", tile_size, 1),
        split_every=check_int("split_every", config.get("split-every", split_every), 2),
    )


def simulate(
    bodies: xr.Dataset | dict,
    steps: int,
    dt: float,
    softening: float = 0.0,
    *,
    G: float = 1.0,
    store: str | Path | None = None,
    snapshot_every: int | None = None,
    dtype: str | None = None,
    tile_size: int | None = None,
    split_every: int | None = None,
    client: Client | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    callback: Callable[[int, dict | None], None] | None = None,
) -> xr.Dataset:
    """Integrate an N-body system with leapfrog (kick-drift-kick) on a Dask cluster.

    Parameters
    ----------
    bodies : xarray.Dataset or Mapping
        Initial conditions: ``position(body, axis)``, ``velocity(body, axis)``, ``mass(body)``
        (see :func:`nbody_dask.make_bodies`). A snapshot of a trajectory works too; its
        ``time`` coordinate, if scalar, becomes the start time.
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
    client : distributed.Client, optional
        Cluster to run on. None starts a :func:`nbody_dask.clusters.local` cluster bound
        to 127.0.0.1 and closes it afterwards.
    overwrite : bool, default False
        Replace an existing store. Without it an existing store is an error.
    progress : bool, optional
        Show a progress bar; ``nbody.progress`` by default.
    callback : callable, optional
        Called in the driver as ``callback(step, record)`` each time a submission of steps
        completes, in order: ``record`` is the snapshot's diagnostics (a dict with
        ``kinetic_energy``, ``potential_energy``, ``total_energy``, ``momentum``,
        ``angular_momentum``) once all of a snapshot's regions are written (the commit marker
        follows within a second), None for submissions that end between snapshots.

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
        If ``store`` exists and ``overwrite`` is False.

    Examples
    --------
    >>> ds0 = nbody_dask.plummer(4096, seed=0)                       # doctest: +SKIP
    >>> traj = nbody_dask.simulate(ds0, steps=100, dt=1/128, softening=0.01,
    ...                            store="run.zarr", snapshot_every=10)  # doctest: +SKIP
    """
    cfg = _run_config(steps, dt, softening, G, snapshot_every, dtype, tile_size, split_every)
    ds = as_bodies(bodies)
    t0 = _start_time(bodies)
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
    show_progress = bool(config.get("progress", progress))
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")
    with _output_path(store, overwrite) as (path, temporary):
        with client_context(client) as c:
            if client is None and show_progress:
                print(f"Dask dashboard: {c.dashboard_link}", file=sys.stderr)
            ftype = resolve_dtype(cfg.dtype)
            tile = cfg.tile_size or auto_tile_size(ds.sizes["body"], total_threads(c))
            attrs = _store_attrs(cfg, tile, ds)
            create_store(path, ds, snapshot_steps=cfg.snapshot_steps(), t0=t0, dt=cfg.dt,
                         dtype=ftype, tile_size=tile, attrs=attrs)
            token = _run_token(ds, cfg, tile, str(path.resolve()), t0)
            plan = StepPlan(token, cfg.dt, cfg.softening, cfg.G, cfg.split_every)
            tiles = c.scatter(split_tiles(ds, tile, ftype), hash=False)
            _run(c, tiles, ds.sizes["body"], plan, cfg, path, show_progress, callback)
        traj = open_trajectory(path)
        return traj.load(scheduler="synchronous") if temporary else traj


def _run(c: Client, tiles: list[Future], n: int, plan: StepPlan, cfg: RunConfig, path: Path,
         show_progress: bool, callback: Callable | None) -> None:
    """The step loop: submit graphs ahead, commit snapshots in order."""
    snapshot_steps = cfg.snapshot_steps()
    snapshot_index = {step: k for k, step in enumerate(snapshot_steps)}
    potential_steps = frozenset(snapshot_steps)
    n_tiles = len(tiles)
    fused = n_tiles == 1
    if fused:  # one task per submission: bound its length to ~1e9 interactions
        max_steps = max(1, int(1e9 // max(n * n, 1)))
    else:
        max_steps = max(1, config.get("tasks-per-submit") // (n_tiles**2 + 3 * n_tiles))
    lookahead = max(1, int(config.get("lookahead")))
    pending: deque[tuple[int, int | None, Any]] = deque()
    committer = SnapshotCommitter(path)

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
                if f.status == "error":
                    f.result()  # re-raises the task's exception here, in the driver
            record = None
        else:
            record = as_record(futures.result())
            committer.add(index, record)
        report(step, record)
        if callback is not None:
            callback(step, record)

    with _progress(show_progress, cfg.steps) as report:
        state = c.compute(initial_graph(tiles, plan), optimize_graph=False)
        submit_snapshot(state, 0)
        step = 0
        for end in _submission_ends(cfg.steps, snapshot_steps, max_steps):
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
def _output_path(store: Any, overwrite: bool):
    """Yield (path, temporary): the checked store path, or a temporary one removed after."""
    if store is not None:
        yield check_store_path(store, overwrite), False
        return
    tmp = Path(tempfile.mkdtemp(prefix="nbody-dask-"))
    try:
        yield tmp / "trajectory.zarr", True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_token(*inputs: Any) -> str:
    """Key token of one run: its inputs plus a nonce.

    Keys stay deterministic within a run (``nbody-<stage>-<token>-<step>-<i>``); the nonce
    keeps two identical runs on one client from sharing keys, since a key released by one
    run and resubmitted at once by the next can be cancelled in flight.
    """
    return tokenize(*inputs, uuid.uuid4().hex)


def _start_time(bodies: Any) -> float:
    if isinstance(bodies, xr.Dataset) and "time" in bodies.coords and bodies["time"].ndim == 0:
        return check_real("bodies.time", bodies["time"].item())
    return 0.0


def _store_attrs(cfg: RunConfig, tile_size: int, ds: xr.Dataset) -> dict[str, Any]:
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
        "nbody_dask_version": __version__,
        "config": json.dumps(asdict(cfg)),
    }


def _one_shot(bodies, softening, G, dtype, tile_size, client, with_potential):
    """Evaluate forces once on the cluster and gather the tiles (small outputs only)."""
    cfg = _run_config(0, 1.0, softening, G, None, dtype, tile_size, None)
    ds = as_bodies(bodies)
    with client_context(client) as c:
        tile = cfg.tile_size or auto_tile_size(ds.sizes["body"], total_threads(c))
        plan = StepPlan(_run_token(ds, cfg, tile), 1.0, cfg.softening, cfg.G,
                        cfg.split_every)
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
    client: Client | None = None,
) -> np.ndarray:
    """Gravitational accelerations of all bodies: one force evaluation on the cluster.

    Parameters are those of :func:`simulate`.

    Returns
    -------
    ndarray, shape (n, 3)
        In the run's dtype.
    """
    tiles = _one_shot(bodies, softening, G, dtype, tile_size, client, with_potential=False)
    return np.concatenate([t.acceleration for t in tiles], axis=1).T.copy()


def potential_energy(
    bodies: xr.Dataset | dict,
    softening: float = 0.0,
    *,
    G: float = 1.0,
    dtype: str | None = None,
    tile_size: int | None = None,
    client: Client | None = None,
) -> float:
    """Total potential energy ``-G sum_{i<j} m_i m_j / sqrt(r_ij^2 + eps^2)``.

    Parameters are those of :func:`simulate`. Accumulated in float64 across tiles.
    """
    vector = _one_shot(bodies, softening, G, dtype, tile_size, client, with_potential=True)
    return float(vector[1])
