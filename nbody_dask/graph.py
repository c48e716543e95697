"""One step's blocked interaction task graph: tile-pair kernel tasks and a fixed-order tree
reduction of their partial forces, then the per-tile integrator updates.

For ``T`` tiles a step is ``T`` drift tasks, ``T**2`` tile-pair tasks (``T (T + 1) / 2`` with the
symmetric kernel: one task per unordered pair gives the forces on both tiles, and one per
tile its forces on itself, each pair of bodies once), ``T`` kick tasks and, when
``T > split_every``, ``ceil(T / split_every)`` combine tasks per target tile and level of the
reduction tree.
Partials of target tile ``i`` are summed in source-index order within each combine task and the
groups are fixed by index, so the floating-point result does not depend on the number of
workers, the scheduling order or on retries: runs are bit-reproducible.

Keys are deterministic: ``nbody-<stage>-<token>-<step>-<i>[-<j>]``, where ``token`` identifies
the run. The graph is built from :func:`dask.delayed` calls on the futures that hold the
current state, so the state never leaves the workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from dask import delayed
from dask.delayed import Delayed

from .backends import tile_kernels
from .bodies import Tile
from .diagnostics import tile_diagnostics
from .integrators import check_finite, close_step, open_step
from .storage import write_tile

__all__ = ["StepPlan", "lazy", "eager", "pair_forces", "symmetric_pair_forces", "self_forces",
           "sum_in_order", "sum_sides",
           "force_graph",
           "initial_graph", "step_graph", "fused_steps", "snapshot_graph"]


@dataclass(frozen=True)
class StepPlan:
    """The fixed parameters of a run's task graphs.

    Attributes
    ----------
    token : str
        Run identifier, part of every key.
    dt : float
        Step length.
    softening : float
        Plummer softening length eps.
    G : float
        Gravitational constant.
    split_every : int
        Fan-in of the reduction tree (>= 2).
    backend : {"cpu", "cuda", "auto"}
        Kernel of the tile-pair tasks (see :mod:`nbody_dask.backends`).
    symmetric : bool
        One task per unordered tile pair with the symmetric CPU kernel (Newton's third law);
        only with ``backend == "cpu"``.
    writer : str
        The run's writer lease id (:mod:`nbody_dask.lease`), checked before snapshot writes;
        empty for runs without a lease.
    """

    token: str
    dt: float
    softening: float
    G: float = 1.0
    split_every: int = 8
    backend: str = "cpu"
    symmetric: bool = False
    writer: str = ""

    def key(self, stage: str, step: int, *index: int) -> str:
        return "-".join(["nbody", stage, self.token, str(step), *map(str, index)])


def _eps2(tile: Tile, softening: float):
    """Squared softening in the tile's dtype (no float64 enters a float32 kernel)."""
    ftype = tile.position.dtype.type
    return ftype(softening) * ftype(softening)


def pair_forces(target: Tile, source: Tile, softening: float, with_potential: bool,
                backend: str = "cpu") -> np.ndarray:
    """Partial forces (G = 1) on ``target`` due to ``source``; one kernel call.

    Returns an array of shape (3, n_target), or (4, n_target) with the potential in row 3.
    """
    kernels = tile_kernels(backend)
    eps2 = _eps2(target, softening)
    return kernels.tile_pair_forces(target.position, source.position, source.mass, eps2,
                                    with_potential, target.start == source.start)


def symmetric_pair_forces(target: Tile, source: Tile, softening: float,
                          with_potential: bool) -> tuple[np.ndarray, np.ndarray]:
    """Partial forces (G = 1) on both tiles of a pair of distinct tiles; one CPU kernel call."""
    from .kernels import cpu

    eps2 = _eps2(target, softening)
    return cpu.symmetric_pair_forces(target.position, target.mass, source.position,
                                     source.mass, eps2, with_potential)


def self_forces(tile: Tile, softening: float, with_potential: bool) -> np.ndarray:
    """Partial forces (G = 1) of a tile on itself, each pair once; one CPU kernel call."""
    from .kernels import cpu

    eps2 = _eps2(tile, softening)
    return cpu.self_tile_forces(tile.position, tile.mass, eps2, with_potential)


def sum_in_order(*parts: np.ndarray) -> np.ndarray:
    """Sum arrays left to right (a fixed order, hence a reproducible rounding)."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def sum_sides(sides: tuple, *parts) -> np.ndarray:
    """:func:`sum_in_order` of partial forces, where ``parts[k]`` is an array when
    ``sides[k]`` is None and the ``(on_target, on_source)`` result of a symmetric pair task,
    of which side ``sides[k]`` is wanted, otherwise. (The sides travel as a plain argument:
    tuples holding task results would make dask re-walk the whole graph for every task.)"""
    return sum_in_order(*(p if side is None else p[side] for p, side in zip(parts, sides,
                                                                           strict=True)))


def lazy(func, *args, key: str):
    """Build a task: a :func:`dask.delayed` call with a deterministic key."""
    return delayed(func, pure=True)(*args, dask_key_name=key)


def eager(func, *args, key: str):
    """Run a task's function at once (inside a fused task; same operations, same order)."""
    return func(*args)


def _tree(parts: list, plan: StepPlan, call, stage: str, step: int, *index: int) -> list:
    """Reduce ``parts``, a list of ``(partial, side)`` (see :func:`sum_sides`), by fixed groups
    of ``split_every`` until at most that many remain."""
    level = 0
    while len(parts) > plan.split_every:
        k = plan.split_every
        parts = [
            (_sum(parts[g:g + k], call, key=plan.key(f"{stage}{level}", step, *index, g // k)),
             None)
            for g in range(0, len(parts), k)
        ]
        level += 1
    return parts


def _sum(parts: list, call, key: str, func=sum_sides, *first):
    """A task summing ``(partial, side)`` pairs, with ``first`` arguments before them."""
    return call(func, *first, tuple(side for _, side in parts), *(p for p, _ in parts), key=key)


def force_graph(tiles: Sequence, plan: StepPlan, step: int, with_potential: bool,
                call=lazy) -> list:
    """Per target tile, at most ``split_every`` ``(partial, side)`` pairs (see :func:`sum_sides`).

    ``tiles`` hold :class:`Tile` positions at one time (futures or delayed objects when
    ``call`` is :func:`lazy`, tiles when it is :func:`eager`). The caller's per-tile task adds
    the remaining partials in order.
    """
    def pair(i: int, j: int):
        return call(pair_forces, tiles[i], tiles[j], plan.softening, with_potential,
                    plan.backend, key=plan.key("pair", step, i, j))

    if plan.symmetric:
        both = {(i, j): call(symmetric_pair_forces, tiles[i], tiles[j], plan.softening,
                             with_potential, key=plan.key("sympair", step, i, j))
                for i in range(len(tiles)) for j in range(i + 1, len(tiles))}
        own = [call(self_forces, tile, plan.softening, with_potential,
                    key=plan.key("selfpair", step, i)) for i, tile in enumerate(tiles)]
        rows = [[(own[i], None) if i == j else (both[i, j], 0) if i < j else (both[j, i], 1)
                 for j in range(len(tiles))] for i in range(len(tiles))]
    else:
        rows = [[(pair(i, j), None) for j in range(len(tiles))] for i in range(len(tiles))]
    return [_tree(row, plan, call, "combine", step, i) for i, row in enumerate(rows)]


def _close(step: int, tile: Tile, G: float, dt: float | None, sides: tuple, *parts) -> Tile:
    return check_finite(close_step(tile, sum_sides(sides, *parts), G, dt), step)


def initial_graph(tiles: Sequence, plan: StepPlan, with_potential: bool = True,
                  call=lazy) -> list:
    """Attach accelerations (and potentials) to the initial tiles: step 0, no kick."""
    partials = force_graph(tiles, plan, 0, with_potential, call)
    return [
        _sum(parts, call, plan.key("forces", 0, i), _close, 0, tile, plan.G, None)
        for i, (tile, parts) in enumerate(zip(tiles, partials, strict=True))
    ]


def step_graph(tiles: Sequence, plan: StepPlan, step: int, with_potential: bool,
               call=lazy) -> list:
    """One leapfrog step from the tiles at step ``step - 1`` to the tiles at ``step``.

    Parameters
    ----------
    tiles : sequence of Future, Delayed or Tile
        Tiles with accelerations at step ``step - 1``.
    plan : StepPlan
    step : int
        Number of the step being built (its result is the state after ``step`` steps).
    with_potential : bool
        Also compute potentials (on snapshot steps).
    call : callable
        :func:`lazy` to build tasks, :func:`eager` to run them in place.
    """
    drifted = [
        call(open_step, tile, plan.dt, key=plan.key("drift", step, i))
        for i, tile in enumerate(tiles)
    ]
    partials = force_graph(drifted, plan, step, with_potential, call)
    return [
        _sum(parts, call, plan.key("kick", step, i), _close, step, tile, plan.G, plan.dt)
        for i, (tile, parts) in enumerate(zip(drifted, partials, strict=True))
    ]


def fused_steps(tile: Tile, plan: StepPlan, first: int, last: int,
                potential_steps: frozenset) -> Tile:
    """Steps ``first..last`` of a one-tile system in one task.

    Dask's per-task round trip (~10-20 ms on a busy 2-core machine) would dominate a step of
    a few thousand bodies; running the identical operations of :func:`step_graph` eagerly in
    one task removes it and gives bit-identical results.
    """
    tiles = [tile]
    for step in range(first, last + 1):
        tiles = step_graph(tiles, plan, step, step in potential_steps, call=eager)
    return tiles[0]


def snapshot_graph(tiles: Sequence, plan: StepPlan, step: int, path: str | None,
                   index: int) -> Delayed:
    """Write snapshot ``index`` from the workers and reduce its diagnostics in fixed order.

    Each tile's task writes its own region of the store (whole chunks; skipped when ``path``
    is None) and returns the tile's float64 diagnostics; these are summed over tiles in index
    order. The result is ready only once every region is on disk.
    """
    parts = [
        lazy(_write_and_measure, path, index, tile, plan.G, plan.token, plan.writer,
             key=plan.key("snapshot", step, i))
        for i, tile in enumerate(tiles)
    ]
    parts = _tree([(p, None) for p in parts], plan, lazy, "diagcombine", step)
    return _sum(parts, lazy, plan.key("diagnostics", step))


def _write_and_measure(path: str | None, index: int, tile: Tile, G: float,
                       run: str, writer: str) -> np.ndarray:
    if path is not None:
        write_tile(path, index, tile, run, writer)
    return tile_diagnostics(tile, G)
