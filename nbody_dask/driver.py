"""The driver of a run: submits a plan's graphs to a cluster ahead of time, completes them in
order, commits snapshots, and restarts from the last committed snapshot when it must.

The driver holds only futures; the state stays on the workers for the whole run. What a run
computes is its :class:`~nbody_dask.plan.Plan`, and its graphs come from
:mod:`nbody_dask.graph` and the plan's force method (:mod:`nbody_dask.methods`).
"""

from __future__ import annotations

import operator
import signal
import threading
import uuid
import warnings
from asyncio import CancelledError
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import xarray as xr
from dask.base import tokenize
from distributed import Client, Future, wait
from distributed.client import FutureCancelledError
from distributed.comm.core import CommClosedError
from distributed.scheduler import KilledWorker

from . import config
from .backends import cluster_backend
from .blocksteps import block_pieces, fused_blocks, initial_block_pieces
from .bodies import is_lazy, lazy_bodies, resolve_dtype, split_tiles
from .clusters import total_threads
from .diagnostics import as_record
from .integrators import canonical
from .graph import (Piece, fused_steps, initial_pieces, key, lazy_tiles, snapshot_graph,
                    steps_pieces)
from .lease import WriterLease
from .location import StoreLocation, describe_error, quiet_abandoned_requests, store_faults
from .plan import Plan, submission_ends
from .storage import SnapshotCommitter, committed_snapshots, open_trajectory

__all__ = ["Driver", "SimulationInterrupted", "RECOVERABLE", "submit_pieces", "load_snapshot",
           "run_token", "settle", "tiles_on_cluster"]

#: Errors after which a run restarts from its last committed snapshot (lost workers).
RECOVERABLE = (FutureCancelledError, KilledWorker, CommClosedError, CancelledError)


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


class Driver:
    """Runs a plan on a cluster: submits graphs ahead, completes them in order, commits.

    Each submission is the graph of several steps (up to the next snapshot, at most
    ``nbody.tasks-per-submit`` tasks) built on the futures of the one before, so the
    scheduler always has work queued; the driver waits only for the submission
    ``nbody.lookahead`` behind the newest, to commit its snapshot and report progress.
    ``stop`` (set by a signal) ends the run after the submissions in flight, with
    :class:`SimulationInterrupted`; ``on_complete(step, record)`` is called for each
    completed submission, in order.
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
        self.state: Any = None  # what the force method carries from step to step
        self.fallback: set[int] = set()  # stretches (by first step) run with the fallback
        self.evaluations = 0  # individual time steps: body force evaluations since the last
        self.snapshot_evaluations: dict[int, int] = {}  # snapshot, by index

    def run_with_restarts(self, bodies: xr.Dataset | None) -> None:
        """Run to the end; after lost workers, restart from the last committed snapshot.

        When a task fails in a way the force method has a fallback for (the tree's bodies
        outrunning a window's near/far margin), restart from the last committed snapshot too,
        with the fallback in that stretch: a resumed run meets the same failure at the same
        step and does the same, so the results stay bit-identical."""
        method = self.plan.force_method
        max_restarts, restart = int(config.get("max-restarts")), 0
        while True:
            try:
                return self.run(bodies)
            except method.fallback_errors as exc:
                fallback = method.fallback_start(self.plan, exc)
                if fallback is None or fallback[0] in self.fallback:
                    raise
                self.fallback.add(fallback[0])
                warnings.warn(f"{exc}; restarting from snapshot {self.last_snapshot()}, "
                              f"{fallback[1]}", RuntimeWarning, stacklevel=3)
            except RECOVERABLE as exc:
                restart += 1
                if restart > max_restarts:
                    raise
                warnings.warn(f"run failed ({type(exc).__name__}: {exc}); restarting from "
                              f"snapshot {self.last_snapshot()} (restart {restart} of "
                              f"{max_restarts})", RuntimeWarning, stacklevel=3)

    def last_snapshot(self) -> int:
        """The index of the last committed snapshot (0 if none)."""
        return max(committed_snapshots(self.path) - 1, 0)

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
        except store_faults() as exc:  # a full disk, a lost mount or object-store endpoint
            quiet_abandoned_requests()  # the client's own requests may fail after this one
            if not isinstance(exc, TimeoutError):  # a store that did not answer in time
                self.committer.flush(quietly=True)  # would only keep the run a deadline more
            if isinstance(exc, RECOVERABLE):  # CommClosedError is an OSError too
                raise
            raise OSError(f"writing to the store {str(self.path)!r} failed "
                          f"({describe_error(exc)}); "
                          f"{self.committer.committed} snapshot(s) are committed and intact: "
                          f"fix the cause, then resume (`nbody-dask resume {self.path}`)"
                          ) from None
        except BaseException:
            self.committer.flush(quietly=True)
            raise
        if self.stop.is_set():
            raise SimulationInterrupted(self.path, self.committer.committed,
                                        getattr(self.stop, "signum", signal.SIGTERM))

    def start(self, bodies: xr.Dataset | None) -> tuple[list[Future], int]:
        """Scatter the tiles of the last committed snapshot (none: ``bodies``, whose snapshot
        is then submitted) and compute their forces; return them and their step."""
        plan, c, index = self.plan, self.client, max(self.committer.committed - 1, 0)
        if self.committer.committed:
            bodies = load_snapshot(self.path, index)
        self.token = run_token(bodies, plan, str(self.path), index)
        step = self.snapshot_steps[index]
        # a comoving run's state carries momenta, its snapshots peculiar velocities
        scale = plan.scale_factor(step) if plan.comoving else None
        tiles = tiles_on_cluster(c, bodies, plan, scale)
        self.evaluations = 0
        if plan.individual:  # self.state: the tiles' bin counts
            state, self.state = submit_pieces(c, initial_block_pieces(
                plan, self.token, tiles, step=step, threads=self.threads))
        else:
            state, self.state = submit_pieces(c, initial_pieces(
                plan, self.token, tiles, threads=self.threads, step=step,
                fallback=frozenset(self.fallback)))
        if self.committer.committed:
            self.on_complete(step, None)
        else:
            self.submit_snapshot(state, step)
        return state, step

    def submit_steps(self, state: list[Future], step: int, end: int) -> list[Future]:
        """Submit steps ``step + 1 .. end`` on ``state``; return the futures of the result."""
        plan, potential = self.plan, frozenset(self.snapshot_steps)
        if plan.individual and plan.n_tiles == 1:  # the blocks in one task, no round trips
            fused = key(self.token, "fusedblocks", end, 0)
            dsk = {fused: (fused_blocks, state[0], self.state, plan, self.token, step + 1,
                           end, potential),
                   key(self.token, "fusedtile", end, 0): (operator.getitem, fused, 0),
                   key(self.token, "fusedbins", end, 0): (operator.getitem, fused, 1)}
            tile, bins = self.client.get(dsk, list(dsk)[1:], sync=False)
            state = [tile]
            self.state, evaluations = bins.result()
            self.evaluations += evaluations
        elif plan.individual:
            state, self.state, evaluations = submit_pieces(self.client, block_pieces(
                plan, self.token, state, self.state, step + 1, end, potential, self.threads))
            self.evaluations += evaluations
        elif plan.fused:
            dsk = {key(self.token, "fused", end, 0): (fused_steps, state[0], plan, self.token,
                                                      step + 1, end, potential, self.threads)}
            state = self.client.get(dsk, list(dsk), sync=False)
        else:
            state, self.state = submit_pieces(self.client, steps_pieces(
                plan, self.token, state, self.state, step + 1, end, potential, self.threads,
                frozenset(self.fallback)))
        if end in self.snapshots:
            self.submit_snapshot(state, end)
        else:
            self.pending.append((end, None, state))
        return state

    def submit_snapshot(self, state: list[Future], step: int) -> None:
        """Submit the writing of snapshot ``step`` and the reduction of its diagnostics."""
        index = self.snapshots[step]
        if self.plan.individual:
            self.snapshot_evaluations[index], self.evaluations = self.evaluations, 0
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
            if self.plan.individual:
                record["force_evaluations"] = self.snapshot_evaluations.pop(index)
            self.committer.add(index, record)
        self.on_complete(step, record)


def submit_pieces(client: Client, pieces: Generator[Piece, Any, Any]) -> Any:
    """Submit a graph built in pieces (:class:`nbody_dask.graph.Piece`): each piece as it
    comes, sending back the futures of what it keeps and the value it fetches; return the
    generator's result."""
    reply = None
    while True:
        try:
            piece = pieces.send(reply)
        except StopIteration as done:
            return done.value
        wanted = [k for group in piece.keep.values() for k in group if isinstance(k, str)]
        if piece.fetch is not None:
            wanted.append(piece.fetch)
        futures = dict(zip(wanted, client.get(piece.graph, wanted, sync=False), strict=True))
        refs = {name: [futures[k] if isinstance(k, str) else k for k in group]
                for name, group in piece.keep.items()}
        value = None if piece.fetch is None else client.gather(futures[piece.fetch])
        reply = refs, value


def tiles_on_cluster(client: Client, bodies: xr.Dataset, plan: Plan,
                     scale: float | None = None) -> list[Future]:
    """The tiles of a checked body set on the cluster, in body order: built by the workers
    from a lazy set's Dask arrays (:func:`~nbody_dask.graph.lazy_tiles`), or cut here and
    scattered; for a comoving run, with the momenta at scale factor ``scale``."""
    if is_lazy(bodies):  # each worker builds its tiles from the bodies' Dask arrays
        return _computed(client, lazy_tiles(bodies, plan.tile_size,
                                            resolve_dtype(plan.dtype), scale))
    tiles = split_tiles(bodies, plan.tile_size, resolve_dtype(plan.dtype))
    if scale is not None:
        tiles = [canonical(tile, scale) for tile in tiles]
    return client.scatter(tiles, hash=False)


def _computed(client: Client, delayed_values: list) -> list[Future]:
    """Futures of ``delayed_values``, computed: an error (a damaged chunk of a snapshot read
    on a worker) is raised once the futures are let go, so that no reference to them
    outlives the failed run."""
    futures = client.compute(delayed_values)
    wait(futures)
    error = next((f.exception() for f in futures if f.status == "error"), None)
    if error is not None:
        del futures
        raise error
    return futures


def load_snapshot(path: StoreLocation, index: int) -> xr.Dataset:
    """Snapshot ``index`` of a store as a lazy body set (exact: float32 survives the round
    trip), which the workers read into their tiles (:func:`~nbody_dask.graph.lazy_tiles`);
    a damaged chunk is reported, not read."""
    snap = open_trajectory(path, index=False).isel(time=index)
    return lazy_bodies(snap[["position", "velocity", "mass"]])


def run_token(*inputs: Any) -> str:
    """Key token of one run: its inputs plus a nonce.

    Keys stay deterministic within a run (``nbody-<stage>-<token>-<step>-<i>``); the nonce
    keeps two identical runs on one client from sharing keys, since a key released by one
    run and resubmitted at once by the next can be cancelled in flight.
    """
    return tokenize(*inputs, uuid.uuid4().hex)


def settle(plan: Plan, client: Client) -> Plan:
    """The plan with the tile size and kernel backend chosen for this cluster."""
    backend = cluster_backend(client, plan.backend)
    return plan.settle(total_threads(client), len(client.nthreads()), backend)
