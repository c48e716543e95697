"""Direct summation: every tile pair by a kernel call, exact to round-off.

``"pairs"`` layout: a task per tile pair (per unordered pair with the symmetric CPU kernel,
:attr:`~nbody_dask.plan.Plan.symmetric`), then per target tile the combine tasks of the
plan's reduction tree and the closing kick (:func:`nbody_dask.graph.close_targets`). The
partials of a target are its source tiles' in source order.

``"rows"`` layout: ``about sqrt(T)`` tasks gather blocks of drifted tiles, then one task per
target tile computes its whole row with the parallel kernel and sums it with the same groups
(:func:`nbody_dask.tasks.close_row`): bit-identical to ``"pairs"`` without the symmetric
kernel, with ``2 T + sqrt(T)`` tasks a step.
"""

from __future__ import annotations

from dataclasses import replace

from .. import tasks
from ..graph import Evaluation, Graph, close_targets
from ..plan import Plan, direct_tile_size
from . import ForceMethod, register

__all__ = ["Direct", "DIRECT"]


class Direct(ForceMethod):
    """Exact direct summation (:mod:`nbody_dask.methods.direct`)."""

    name = "direct"

    def tile_size(self, n: int, threads: int, workers: int, layout: str, backend: str) -> int:
        return direct_tile_size(n, threads, backend, layout, workers)

    def settle(self, plan: Plan, threads: int, workers: int, backend: str) -> Plan:
        if plan.layout == "rows":
            backend = "cpu"
        settled = super().settle(plan, threads, workers, backend)
        return replace(settled, symmetric=(plan.symmetric and backend == "cpu"
                                           and plan.layout == "pairs"))

    def tasks_per_step(self, plan: Plan) -> int:
        t = plan.n_tiles
        if plan.fused:
            return 1
        if plan.layout == "rows":  # drift, blocks, row (forces and kick)
            return 2 * t + len(plan.source_blocks())
        combines = sum(len(level) for level in plan.groups()) * t
        return 2 * t + len(plan.pair_tasks()) + combines

    def describe(self, plan: Plan) -> str:
        return "forces by direct summation (exact)"

    def evaluate(self, ev: Evaluation, dsk: Graph, tiles: list, state: None):
        yield from ()  # the graph never depends on data
        plan = ev.plan
        if plan.layout == "rows":
            return dsk, self.rows(ev, dsk, tiles), None
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
