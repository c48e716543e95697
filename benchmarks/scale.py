"""Simulated scale (issue 14): orchestration cost per step against W worker processes.

    python benchmarks/scale.py [--workers 1,2,4,8,16,32] [--layouts pairs,rows]
                               [--tiles-per-worker 2] [--tile-size 16] [--method tree]
                               [--json out.json]

A scheduler and W single-threaded worker processes are started as separate processes
(``dask scheduler`` and ``dask worker``), the driver is this process, as on a real cluster.
Tiles are tiny (``--tile-size`` bodies), so compute is negligible and what is measured is
orchestration. For each W and layout (``pairs``: T = ``--tiles-per-worker`` x W tiles;
``rows``, the HPC layout: T = W):

- ``simulate()``: tasks per step (from the plan), wall time, driver CPU and scheduler CPU
  per step, by differential timing (a long run minus a short one, the same snapshots in
  both);
- a bare Dask graph: the same step graphs with every task replaced by a no-op (the same
  tasks and dependencies), submitted at once and run on the same cluster: Dask's own floor.

Then the same at fixed W for growing T (``--tiles``). Each row is the median of ``--reps``
short/long pairs (NaN where the difference is lost in the noise). Prints Markdown tables;
``--json`` writes every row.

``--method tree`` measures the tree method instead, its tile pairs classified near or far at
every T (``nbody.near-far-tiles`` = 2): ``pairs`` has a walk task per near tile pair, ``rows``
one task per target tile. Its step graphs are built in pieces (the driver fetches the
classification at each re-tiling), so there is no bare-graph floor, and tasks/step is what
the run's graphs held, counted as they were submitted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import dask
import psutil
from distributed import Client

import nbody_dask
from nbody_dask import graph
from nbody_dask.plan import Plan


@contextmanager
def cluster(workers: int):
    """A scheduler and ``workers`` one-thread worker processes, each its own process."""
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "scheduler.json"
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        scheduler = subprocess.Popen(
            ["dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(file)], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        worker = subprocess.Popen(
            ["dask", "worker", "--scheduler-file", str(file), "--nworkers", str(workers),
             "--nthreads", "1", "--no-dashboard", "--memory-limit", "0"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not file.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the scheduler did not start")
                time.sleep(0.1)
            with Client(scheduler_file=str(file)) as client:
                client.wait_for_workers(workers, timeout=300)
                yield client, psutil.Process(scheduler.pid)
        finally:
            for proc in (worker, scheduler):
                proc.terminate()
            for proc in (worker, scheduler):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def step_plan(tiles: int, tile_size: int, layout: str, method: str = "direct") -> Plan:
    """The plan simulate() makes for ``tiles`` tiles on the CPU backend."""
    plan = Plan(n=tiles * tile_size, steps=1, dt=1 / 256, softening=0.05,
                tile_size=tile_size, symmetric=bool(nbody_dask.config.get("symmetric")),
                layout=layout, method=method)
    return plan.settle(1, 1, "cpu")


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _median_difference(run, steps: tuple[int, int], reps: int) -> list[float]:
    """Per-step (long - short) / (steps difference) of each measured quantity, median of
    ``reps`` pairs; NaN where the difference drowns in the noise (not positive)."""
    run(steps[0])  # compile, warm caches
    pairs = [(run(steps[0]), run(steps[1])) for _ in range(reps)]
    medians = []
    for k in range(len(pairs[0][0])):
        per = statistics.median((long[k] - short[k]) / (steps[1] - steps[0])
                                for short, long in pairs)
        medians.append(per if per > 0 else math.nan)
    return medians


def simulate_costs(client: Client, scheduler: psutil.Process, tiles: int, tile_size: int,
                   layout: str, steps: tuple[int, int], reps: int, method: str = "direct"
                   ) -> dict:
    """Per-step wall, driver CPU, scheduler CPU and submitted tasks of simulate(),
    differential."""
    bodies = nbody_dask.plummer(tiles * tile_size, seed=0)
    me = psutil.Process()
    kw = dict(dt=1 / 256, softening=0.05, tile_size=tile_size, dtype="float64",
              backend="cpu", layout=layout, client=client, progress=False, method=method)
    submitted = []
    get = client.get

    def counted(dsk, *args, **kwargs):
        submitted.append(len(dsk))
        return get(dsk, *args, **kwargs)

    def run(k: int) -> tuple[float, float, float, float]:
        submitted.clear()
        wall, cpu, sched = time.perf_counter(), _cpu(me), _cpu(scheduler)
        # each worker process stands for a node of one core here: one kernel thread each;
        # the tree classifies its tile pairs near or far at any number of tiles
        with dask.config.set({"nbody.kernel-threads": 1, "nbody.near-far-tiles": 2}):
            nbody_dask.simulate(bodies, steps=k, snapshot_every=k, **kw)
        return (time.perf_counter() - wall, _cpu(me) - cpu, _cpu(scheduler) - sched,
                float(sum(submitted)))

    client.get = counted
    try:
        wall, driver, sched, tasks = _median_difference(run, steps, reps)
    finally:
        client.get = get
    return {"wall_s": wall, "driver_cpu_s": driver, "scheduler_cpu_s": sched,
            "submitted_tasks_per_step": tasks}


def _noop(*args):
    return None


def bare_costs(client: Client, plan: Plan, steps: tuple[int, int], reps: int) -> float:
    """Wall time per step of the same step graphs with every task a no-op: Dask's floor."""
    def run(k: int) -> tuple[float]:
        token = uuid.uuid4().hex
        dsk, keys = graph.steps_graph(plan, token, [None] * plan.n_tiles, 1, k, frozenset())
        dsk = {name: (_noop, *args) for name, (_, *args) in dsk.items()}
        start = time.perf_counter()
        client.get(dsk, keys)
        return (time.perf_counter() - start,)

    return _median_difference(run, steps, reps)[0]


def measure(workers: int, tiles: int, tile_size: int, layout: str, steps: tuple[int, int],
            reps: int, client: Client, scheduler: psutil.Process, method: str = "direct"
            ) -> dict:
    plan = step_plan(tiles, tile_size, layout, method)
    row = {"workers": workers, "tiles": tiles, "tile_size": tile_size, "layout": layout,
           "method": method, "tasks_per_step": plan.tasks_per_step()}
    row.update(simulate_costs(client, scheduler, tiles, tile_size, layout, steps, reps,
                              method))
    if method == "tree":
        row["tasks_per_step"] = round(row["submitted_tasks_per_step"])
    row["bare_wall_s"] = (bare_costs(client, plan, steps, reps) if not plan.spatial
                          else math.nan)
    row["simulate_over_bare"] = row["wall_s"] / row["bare_wall_s"]
    row["driver_us_per_task"] = row["driver_cpu_s"] / row["tasks_per_step"] * 1e6
    return row


HEADER = ("| layout | W | T | tasks/step | wall s/step | driver CPU s/step | driver µs/task | "
          "scheduler CPU s/step | bare graph s/step | simulate / bare |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def line(r: dict) -> str:
    return (f"| {r['layout']} | {r['workers']} | {r['tiles']} | {r['tasks_per_step']} | "
            f"{r['wall_s']:.3f} | "
            f"{r['driver_cpu_s']:.3f} | {r['driver_us_per_task']:.0f} | "
            f"{r['scheduler_cpu_s']:.3f} | {r['bare_wall_s']:.3f} | "
            f"{r['simulate_over_bare']:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8,16,32")
    parser.add_argument("--layouts", default="pairs,rows")
    parser.add_argument("--tiles-per-worker", type=int, default=2,
                        help="T / W of the pairs layout (rows: one tile per worker)")
    parser.add_argument("--tile-size", type=int, default=16)
    parser.add_argument("--tiles", default="4,8,16,32",
                        help="T values at fixed W (the last of --workers), pairs layout")
    parser.add_argument("--steps", default="4,12", help="short,long runs (differential)")
    parser.add_argument("--reps", type=int, default=3,
                        help="short/long pairs per row; the median is reported")
    parser.add_argument("--method", choices=["direct", "tree"], default="direct")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    steps = tuple(int(s) for s in args.steps.split(","))
    layouts = args.layouts.split(",")
    rows = []
    print(f"Scaling W (pairs: T = {args.tiles_per_worker} W; rows: T = W):\n\n{HEADER}",
          flush=True)
    ws = [int(w) for w in args.workers.split(",")]
    for w in ws:
        with cluster(w) as (client, scheduler):
            for layout in layouts:
                tiles = w if layout == "rows" else args.tiles_per_worker * w
                rows.append(measure(w, tiles, args.tile_size, layout, steps, args.reps,
                                    client, scheduler, args.method))
                print(line(rows[-1]), flush=True)
    if args.tiles:
        print(f"\nGrowing T at W = {ws[-1]}, pairs layout:\n\n{HEADER}", flush=True)
        with cluster(ws[-1]) as (client, scheduler):
            for t in (int(t) for t in args.tiles.split(",")):
                rows.append(measure(ws[-1], t, args.tile_size, "pairs", steps, args.reps,
                                    client, scheduler, args.method))
                print(line(rows[-1]), flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"python": sys.version, "rows": rows},
                                                   indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
