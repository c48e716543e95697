"""Driver cost of a step (issue 14, must-show 1): building and submitting its task graph.

    python benchmarks/driver_cost.py [--tiles 16,64,256] [--tile-size 128] [--json out.json]

A scheduler and one worker run as separate processes (``benchmarks/scale.py``'s cluster), the
driver is this process. For each T (the default "pairs" layout and nbody.symmetric, as
``simulate()`` plans it), on T scattered tiles:

- build: CPU time of :func:`nbody_dask.graph.steps_graph` for one step, per task;
- submit: CPU time of ``client.get(graph, keys, sync=False)`` (tokenising and pickling the
  graph and sending it), per task; the submitted tasks are then cancelled;

best of ``--reps``. Then ``simulate()`` itself at T = 64 (8,192 bodies in tiles of 128): the
driver's CPU time per step, by differential timing (a long run minus a short one, median of
``--reps`` pairs), and the same for the scheduler process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import numpy as np

import nbody_dask
from nbody_dask.bodies import split_tiles
from nbody_dask.graph import steps_graph

sys.path.insert(0, str(Path(__file__).parent))
from scale import cluster, simulate_costs, step_plan  # noqa: E402


def graph_costs(client, tiles: int, tile_size: int, reps: int) -> dict:
    """Best-of-``reps`` CPU time per task to build and to submit one step's graph."""
    plan = step_plan(tiles, tile_size, "pairs")
    bodies = nbody_dask.plummer(plan.n, seed=0)
    state = client.scatter(split_tiles(bodies, tile_size, np.float64), hash=False)
    build, submit = [], []
    for _ in range(reps):
        t0 = time.process_time()
        dsk, keys = steps_graph(plan, uuid.uuid4().hex, state, 1, 1, frozenset())
        t1 = time.process_time()
        futures = client.get(dsk, keys, sync=False)
        t2 = time.process_time()
        client.cancel(futures)
        build.append((t1 - t0) / len(dsk))
        submit.append((t2 - t1) / len(dsk))
    return {"tiles": tiles, "tasks": len(dsk), "build_s": min(build) * len(dsk),
            "build_us_per_task": min(build) * 1e6, "submit_us_per_task": min(submit) * 1e6,
            "build_and_submit_us_per_task": (min(build) + min(submit)) * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", default="16,64,256")
    parser.add_argument("--tile-size", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", default="2,6", help="short,long simulate() runs")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    out: dict = {"graphs": []}
    with cluster(1) as (client, scheduler):
        print("| T | tasks/step | build s | build µs/task | submit µs/task | "
              "build+submit µs/task |\n|---|---|---|---|---|---|")
        for t in (int(t) for t in args.tiles.split(",")):
            r = graph_costs(client, t, args.tile_size, args.reps)
            out["graphs"].append(r)
            print(f"| {t} | {r['tasks']} | {r['build_s']:.3f} | {r['build_us_per_task']:.1f} "
                  f"| {r['submit_us_per_task']:.1f} | "
                  f"{r['build_and_submit_us_per_task']:.1f} |", flush=True)
        steps = tuple(int(s) for s in args.steps.split(","))
        costs = simulate_costs(client, scheduler, 64, args.tile_size, "pairs", steps,
                               args.reps)
        out["simulate_64_tiles"] = costs
        print(f"\nsimulate(), {64 * args.tile_size} bodies in 64 tiles of {args.tile_size}: "
              f"driver CPU {costs['driver_cpu_s']:.3f} s/step, scheduler CPU "
              f"{costs['scheduler_cpu_s']:.3f} s/step, wall {costs['wall_s']:.3f} s/step")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
