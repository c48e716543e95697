"""A model of a step's time on a cluster (issue 14), calibrated by benchmarks/scale.py.

    python benchmarks/model.py scale.json [more.json ...] [--kernel-rate 3.4e9]
                               [--json model.json]

A step costs

    t_step = t_kernel + t_sched + t_latency + t_worker + t_data

- t_kernel = N² / (nodes · cores · r · e) for direct summation (``r``: interactions per second
  of one core, the one-thread kernel rate measured by ``nbody-dask bench``; the "pairs"
  layout's symmetric kernel counts each pair once, so ``r`` is its effective rate there;
  ``e``: the parallel efficiency of a node's cores, ``--kernel-efficiency``, measured by
  ``benchmarks/rows_threads.py``);
- t_sched = s_task · tasks + s_edge · edges: the scheduler is one process, so its CPU time per
  step is serial; ``s_task`` and ``s_edge`` are fitted to the scheduler CPU measured in the
  simulated runs (edges: task dependencies of a step, counted from the graph);
- t_latency = waves · L: a step's tasks run in ``waves`` dependent rounds (drift, then forces
  and kick: 2 for "rows"; 3 plus the reduction levels for "pairs"), each paying a round trip;
- t_worker = cores_sim · (c_task · tasks + c_edge · edges) / nodes: the CPU the simulated
  runs spent per task and per dependency edge (deserialising, running, reporting, fetching
  a dependency), in parallel across nodes;
- t_data = bytes a node receives per step / bandwidth: every target tile needs every source
  tile's positions and masses (16 bytes a body in float32), so each node receives
  ``N · 16 · (1 - 1/nodes)`` bytes a step, over a 100 Gb/s link at line rate.

On the simulated runs (W one-thread worker processes and the scheduler sharing this
machine's ``cores`` CPUs, tiny tiles: t_kernel and t_data vanish) everything shares the
same cores and W processes oversubscribe them; :func:`fit` says how that is modelled and
fitted. The script prints
the fit, its error on every simulated run, and the projection for N = 2**20 and 10**7 on 16,
64 and 256 nodes of 64 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

sys.path.insert(0, str(Path(__file__).parent))
from scale import step_plan  # noqa: E402

from nbody_dask.graph import steps_graph  # noqa: E402
from nbody_dask.plan import Plan  # noqa: E402

LINK_BYTES_PER_S = 100e9 / 8
BYTES_PER_BODY = 16  # float32 position (12) and mass (4)
SEED_662_MS = 0.662  # the seed article: 1,048,576 bodies on 16 nodes (BACKGROUND.md)


def graph_shape(plan: Plan) -> dict:
    """Tasks, dependency edges and dependent rounds (waves) of one step of ``plan``."""
    state = [f"state-{i}" for i in range(plan.n_tiles)]
    dsk, _ = steps_graph(plan, "model", state, 1, 1, frozenset())
    known = set(dsk) | set(state)
    depth = dict.fromkeys(state, 0)
    edges = 0
    for name, (_, *args) in dsk.items():  # insertion order is a topological order
        deps = [a for a in args if isinstance(a, str) and a in known]
        edges += len(deps)
        depth[name] = 1 + max(depth[d] for d in deps)
    return {"tasks": len(dsk), "edges": edges, "waves": max(depth.values())}


def fit(rows: list[dict], cores: int) -> dict:
    """Non-negative least-squares constants from the simulated runs (benchmarks/scale.py).

    On this machine the scheduler and all W worker processes share ``cores`` CPUs, so a
    simulated step's wall time is modelled as

        c_task · tasks + c_edge · edges + latency · waves
        + (o_task · tasks + o_edge · edges) · W / cores

    CPU work per task and per dependency edge (scheduler, workers, and the transfer between
    them) on the shared cores, a round trip per dependent round, and the oversubscription of
    W processes on ``cores`` CPUs, which stretches every message's round trip (a term that
    vanishes on a real cluster, one worker process per node). The scheduler's own CPU time,
    ``s_task · tasks + s_edge · edges``, is fitted to its measured CPU time. Fits weigh
    relative errors.
    """
    shapes = [graph_shape(step_plan(r["tiles"], r["tile_size"], r["layout"])) for r in rows]
    over = np.array([r["workers"] / cores for r in rows])
    base = np.array([[s["tasks"], s["edges"], s["waves"]] for s in shapes], dtype=float)
    x = np.c_[base, base[:, 0] * over, base[:, 1] * over]
    wall = np.array([r["wall_s"] for r in rows])
    weights = 1 / wall
    coefficients, _ = nnls(x * weights[:, None], wall * weights)
    sched = np.array([r["scheduler_cpu_s"] for r in rows])
    (s_task, s_edge), _ = nnls(base[:, :2] * weights[:, None], sched * weights)
    names = ("c_task", "c_edge", "latency", "o_task", "o_edge")
    consts = {**dict(zip(names, coefficients, strict=True)), "s_task": s_task,
              "s_edge": s_edge, "cores": cores}
    for r, s, row in zip(rows, shapes, x @ coefficients, strict=True):
        r.update(s)
        r["model_wall_s"] = row
        r["model_error"] = row / r["wall_s"] - 1
    return consts


def project(n: int, nodes: int, cores: int, layout: str, rate: float, consts: dict,
            efficiency: float = 1.0) -> dict:
    """Predicted step time of direct summation on ``nodes`` nodes of ``cores`` cores."""
    if layout == "rows":
        plan = Plan(n=n, steps=1, dt=1.0, layout="rows").settle(nodes, nodes, "cpu")
    else:
        plan = Plan(n=n, steps=1, dt=1.0, symmetric=True).settle(nodes * cores, nodes, "cpu")
    shape = graph_shape(plan)
    interactions = n * n / 2 if plan.symmetric else n * n
    # CPU per task and per edge on the workers: what the shared cores spent here (wall x
    # cores), now spread over the nodes; one process per node, so no oversubscription
    per_task, per_edge = (consts["cores"] * consts[k] for k in ("c_task", "c_edge"))
    parts = {
        "kernel": interactions / (nodes * cores * rate * efficiency),
        "scheduler": consts["s_task"] * shape["tasks"] + consts["s_edge"] * shape["edges"],
        "latency": consts["latency"] * shape["waves"],
        "workers": (per_task * shape["tasks"] + per_edge * shape["edges"]) / nodes,
        "data": n * BYTES_PER_BODY * (1 - 1 / nodes) / LINK_BYTES_PER_S,
    }
    return {"n": n, "nodes": nodes, "layout": layout, "tiles": plan.n_tiles, **shape,
            **{f"{k}_s": v for k, v in parts.items()}, "step_s": sum(parts.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scale_json", nargs="+",
                        help="outputs of benchmarks/scale.py --json (a later file's row "
                             "replaces an earlier one of the same layout, W and T)")
    parser.add_argument("--kernel-rate", type=float, default=3.4e9,
                        help="one-core float32 kernel rate, interactions/s (nbody-dask bench)")
    parser.add_argument("--symmetric-rate", type=float, default=None,
                        help="one-core symmetric kernel rate (N² counted); default 1.4 x "
                             "--kernel-rate")
    parser.add_argument("--cores", type=int, default=2, help="cores of the simulating machine")
    parser.add_argument("--kernel-efficiency", type=float, default=1.0,
                        help="parallel efficiency of a node's kernel (rows_threads.py: speed-up "
                             "on all cores / cores)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    measured = {}
    for path in args.scale_json:
        for r in json.loads(Path(path).read_text())["rows"]:
            measured[r["layout"], r["workers"], r["tiles"]] = r
    rows = [r for r in measured.values()
            if r["tasks_per_step"] > 1 and not math.isnan(r["wall_s"])]
    consts = fit(rows, args.cores)
    print("fitted: " + ", ".join(f"{k} = {v * 1e6:.1f} µs" for k, v in consts.items()
                                  if k != "cores"))
    print("\n| layout | W | T | tasks | edges | waves | measured s/step | model s/step | error |"
          "\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['workers']} | {r['tiles']} | {r['tasks']} | {r['edges']} "
              f"| {r['waves']} | {r['wall_s']:.3f} | {r['model_wall_s']:.3f} | "
              f"{r['model_error']:+.0%} |")
    symmetric = args.symmetric_rate or 1.4 * args.kernel_rate
    print("\n| N | nodes x 64 cores | layout | tasks | kernel s | scheduler s | latency s | "
          "workers s | data s | step s |\n|---|---|---|---|---|---|---|---|---|---|")
    projections = []
    for n in (2**20, 10**7):
        for nodes in (16, 64, 256):
            for layout in ("pairs", "rows"):
                rate = symmetric if layout == "pairs" else args.kernel_rate
                p = project(n, nodes, 64, layout, rate, consts, args.kernel_efficiency)
                projections.append(p)
                print(f"| {n:,} | {nodes} | {layout} | {p['tasks']} | {p['kernel_s']:.3f} | "
                      f"{p['scheduler_s']:.3f} | {p['latency_s']:.4f} | {p['workers_s']:.4f} "
                      f"| {p['data_s']:.4f} | **{p['step_s']:.3f}** |")
    print(f"\nseed article: N = 1,048,576 on 16 nodes: {SEED_662_MS} s/step")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(
            {"constants": consts, "simulated": rows, "projections": projections}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
