"""Direct summation: every tile pair by a kernel call, exact to round-off.

``"pairs"`` layout: a task per tile pair (per unordered pair with the symmetric CPU kernel,
:attr:`~nbody_dask.plan.Plan.symmetric`), then per target tile the combine tasks of the
plan's reduction tree and the closing kick (:func:`nbody_dask.graph.close_targets`). The
partials of a target are its source tiles' in source order.

In a periodic box (:attr:`~nbody_dask.plan.Plan.box_size`) the forces are Ewald sums
(:mod:`nbody_dask.kernels.ewald`), exact to round-off: a task per tile pair for the
real-space sum over the source's images, a task per tile for its structure factors, which
the fixed-order reduction adds, and a task per target tile for the reciprocal sum; a target's
partials are its source tiles' in source order, then its reciprocal part. ``"pairs"`` layout
and CPUs only.

``"rows"`` layout: ``about sqrt(T)`` tasks gather blocks of drifted tiles, then one task per
target tile computes its whole row with the parallel kernel and sums it with the same groups
(:func:`nbody_dask.tasks.close_row`): bit-identical to ``"pairs"`` without the symmetric
kernel, with ``2 T + sqrt(T)`` tasks a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import tasks
from ..graph import Evaluation, Graph, close_targets, reduce_in_order
from ..plan import Plan, direct_tile_size, reduction_groups
from . import ForceMethod, register

__all__ = ["Direct", "DIRECT"]


class Direct(ForceMethod):
    """Exact direct summation (:mod:`nbody_dask.methods.direct`)."""

    name = "direct"
    individual_steps = True

    def check(self, plan: Plan) -> None:
        if plan.periodic and plan.layout == "rows":
            raise ValueError("Ewald sums in a periodic box (box_size) run the 'pairs' layout, "
                             "got layout='rows'")
        if plan.periodic and plan.backend == "cuda":
            raise ValueError("Ewald sums in a periodic box (box_size) run on CPUs, got "
                             "backend='cuda'")

    def tile_size(self, n: int, threads: int, workers: int, layout: str, backend: str) -> int:
        return direct_tile_size(n, threads, backend, layout, workers)

    def settle(self, plan: Plan, threads: int, workers: int, backend: str) -> Plan:
        if plan.layout == "rows" or plan.periodic:
            backend = "cpu"
        if plan.individual and plan.tile_size is None and workers == 1:
            # one tile: its blocks run in one task, the parallel kernel on every core, with
            # no round trip per tick (measured: docs/user-guide.md, "Individual time steps")
            plan = replace(plan, tile_size=max(plan.n, 1))
        settled = super().settle(plan, threads, workers, backend)
        return replace(settled, symmetric=(plan.symmetric and backend == "cpu"
                                           and plan.layout == "pairs" and not plan.periodic
                                           and not plan.individual))

    def tasks_per_step(self, plan: Plan) -> int:
        t = plan.n_tiles
        if plan.fused:
            return 1
        if plan.layout == "rows":  # drift, blocks, row (forces and kick)
            return 2 * t + len(plan.source_blocks())
        if plan.periodic:  # and per tile its factors and reciprocal part, their reduction
            factors = sum(len(level) for level in plan.groups())
            return 4 * t + t * t + factors + t * sum(
                len(level) for level in reduction_groups(t + 1, plan.split_every))
        combines = sum(len(level) for level in plan.groups()) * t
        return 2 * t + len(plan.pair_tasks()) + combines

    def describe(self, plan: Plan) -> str:
        if plan.periodic:
            return f"forces by Ewald sums in a periodic box of side {plan.box_size} (exact)"
        return "forces by direct summation (exact)"

    def tick_forces(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                    sources: list[tuple[Any, float]], drifted: dict[int, Any], tick: Any,
                    forces: Any, block: list) -> dict[int, list[str]]:
        """A kernel call per (active tile, source tile): the source drifted inside the task
        (:func:`~nbody_dask.tasks.active_pair_forces`)."""
        parts = {}
        for i, target in drifted.items():
            parts[i] = [name("bpair", i, j) for j in range(len(sources))]
            for j, (source, drift) in enumerate(sources):
                dsk[parts[i][j]] = (tasks.active_pair_forces, target, source, drift, tick,
                                    forces, plan.backend)
        return parts

    def evaluate(self, ev: Evaluation, dsk: Graph, tiles: list, state: None):
        yield from ()  # the graph never depends on data
        plan = ev.plan
        if plan.layout == "rows":
            return dsk, self.rows(ev, dsk, tiles), None
        if plan.periodic:
            return dsk, self.ewald(ev, dsk, tiles), None
        for i, j in plan.pair_tasks():
            if not plan.symmetric:
                task = (tasks.pair_forces, tiles[i], tiles[j], ev.forces, plan.backend)
            elif i == j:
                task = (tasks.self_forces, tiles[i], ev.forces)
            else:
                task = (tasks.symmetric_pair_forces, tiles[i], tiles[j], ev.forces)
            dsk[ev.key("pair", i, j)] = task
        parts = [[(ev.key("pair", *pair), side) for pair, side in plan.parts(i)]
                 for i in range(len(tiles))]
        return dsk, close_targets(ev, dsk, tiles, parts, lambda count: plan.groups()), None

    @staticmethod
    def ewald(ev: Evaluation, dsk: Graph, tiles: list) -> list[str]:
        """The periodic box's tasks: real-space pairs, structure factors, their reduction,
        reciprocal parts, and the closing tasks."""
        plan, t, box = ev.plan, len(tiles), ev.plan.box_size
        factors = [ev.key("factors", i) for i in range(t)]
        for name, tile in zip(factors, tiles, strict=True):
            dsk[name] = (tasks.ewald_factors, tile, box)
        total = reduce_in_order(dsk, factors, plan.groups(),
                                lambda level, g: ev.key(f"factorsum{level}", g),
                                tasks.sum_in_order)
        parts = []
        for i in range(t):
            for j in range(t):
                dsk[ev.key("pair", i, j)] = (tasks.ewald_pair_forces, tiles[i], tiles[j],
                                             ev.forces, box)
            dsk[ev.key("long", i)] = (tasks.ewald_long_forces, tiles[i], ev.forces, box,
                                      *total)
            parts.append([(ev.key("pair", i, j), None) for j in range(t)]
                         + [(ev.key("long", i), None)])
        return close_targets(ev, dsk, tiles, parts,
                             lambda count: reduction_groups(count, plan.split_every))

    @staticmethod
    def rows(ev: Evaluation, dsk: Graph, tiles: list) -> list[str]:
        """The ``"rows"`` layout's tasks: blocks of sources, a row task per target tile."""
        plan, blocks = ev.plan, []
        for b, (lo, hi) in enumerate(plan.source_blocks()):
            blocks.append(ev.key("sources", b))
            dsk[blocks[-1]] = (tasks.gather_sources, *tiles[lo:hi])
        out = [ev.key("row", i) for i in range(len(tiles))]
        for i, name in enumerate(out):
            dsk[name] = (tasks.close_row, ev.closing, i, ev.forces, plan.groups(), ev.threads,
                         tiles[i], *blocks)
        return out


DIRECT = register(Direct())
