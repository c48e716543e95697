"""Periodic boxes: TreePM's accuracy against the Ewald sum, its cost, and the Ewald crossover.

Sections (all by default):

``accuracy``
    Median, p99 and max relative force error of ``accelerations(method="treepm")`` against
    the float64 Ewald sum on ``--sample`` targets, for a uniform random box and a clustered
    one (``plummer_clumps``: 20 Plummer spheres), float32 and float64, at the defaults and
    at the accurate setting of the user guide (``cutoff=6, theta=0.3``).
``cost``
    One evaluation's parts, timed in this process on one tile (deposit, mesh sum, FFT,
    interpolation, tree build, short-range walk) against the isolated tree's walk of the
    same bodies at the same theta and leaf size; then ``accelerations()`` of TreePM and of
    the isolated tree on the default local cluster, a ``simulate()`` step, and TreePM on 2
    worker processes of 1 thread against 1 process, with ``layout="pairs"`` (4 spatial
    tiles) and ``"rows"`` (a tile a worker): one evaluation (with its re-tiling) and a
    ``simulate()`` step in steady state (differential timing).
``split``
    The trade of the split scale: for each ``--splits`` value (``r_s`` in mesh cells, on the
    default mesh and cutoff), the float32 force errors against the Ewald sum on
    ``--sample`` targets of both boxes, and the short-range walk's time over the isolated
    tree's walk of the same bodies (in this process on one tile, as ``cost``).
``crossover``
    One evaluation of the Ewald sum (``method="direct"``) and of TreePM for growing N: where
    ``method="auto"`` switches (``plan.PERIODIC_CROSSOVER``).
``tasks``
    TreePM's tasks per step for 64, 256 and 1,024 tiles (``Plan.tasks_per_step``).

    python benchmarks/periodic.py --n 262144 --json benchmarks/results/<name>.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time

import numpy as np
from distributed import Client, LocalCluster

import nbody_dask
from nbody_dask.accuracy import error_statistics, relative_errors
from nbody_dask.kernels import octree, pm
from nbody_dask.kernels.ewald import ewald_forces
from nbody_dask.kernels.shortrange import short_walk, spread_of
from nbody_dask.kernels.walk import walk
from nbody_dask.plan import Plan

SECTIONS = ("accuracy", "cost", "split", "crossover", "tasks")


@functools.lru_cache(maxsize=1)
def boxes(n: int) -> dict:
    rng = np.random.default_rng(1)
    x = rng.random((n, 3))
    uniform = nbody_dask.make_bodies(x, np.zeros_like(x), np.full(n, 1.0 / n))
    return {"uniform": uniform, "clustered": nbody_dask.plummer_clumps(n, seed=3)}


def _isolated(ds):
    """The same bodies without the ``box_size`` attribute (``plummer_clumps`` sets it), so
    that the isolated tree takes them as an isolated system."""
    ds = ds.copy()
    ds.attrs.pop("box_size", None)
    return ds


@functools.lru_cache(maxsize=2)
def ewald_reference(n: int, sample: int, kind: str) -> tuple[np.ndarray, np.ndarray, float]:
    """``sample`` targets of box ``kind``, their float64 Ewald forces and the seconds the
    sum took: computed once for the sections that read them."""
    ds = boxes(n)[kind]
    x, m = ds.position.values.T, ds.mass.values
    targets = np.sort(np.random.default_rng(0).choice(n, sample, replace=False))
    start = time.perf_counter()
    reference = ewald_forces(x[:, targets], x, m, 1.0)[:3].T
    return targets, reference, time.perf_counter() - start


def accuracy(n: int, sample: int, client: Client) -> list[dict]:
    rows = []
    for kind, ds in boxes(n).items():
        targets, reference, ewald_seconds = ewald_reference(n, sample, kind)
        for setting, kw in (("default", {}), ("accurate", dict(cutoff=6.0, theta=0.3))):
            for dtype in ("float32", "float64"):
                acc = nbody_dask.accelerations(ds, box_size=1.0, method="treepm", dtype=dtype,
                                               client=client, **kw)
                median, p99, worst = error_statistics(relative_errors(acc[targets],
                                                                      reference))
                rows.append(dict(box=kind, setting=setting, dtype=dtype, median=median,
                                 p99=p99, max=worst, ewald_seconds=ewald_seconds))
                print(f"accuracy {kind:9s} {setting:8s} {dtype}: median {median:.1e} p99 "
                      f"{p99:.1e} max {worst:.1e}", flush=True)
    return rows


def _timed(function, *args, repeats: int = 2):
    best, out = np.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        out = function(*args)
        best = min(best, time.perf_counter() - start)
    return out, best


def _step_time(ds, client: Client, **kwargs) -> float:
    """A ``simulate()`` step in steady state: runs of 2 and 6 steps differenced (the first
    evaluation, re-tiling and compilation cancel)."""
    times = []
    for steps in (2, 6):
        start = time.perf_counter()
        nbody_dask.simulate(ds, steps=steps, dt=1e-3, box_size=1.0, method="treepm",
                            dtype="float32", progress=False, client=client, **kwargs)
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / 4


def cost(n: int, client: Client) -> list[dict]:
    rows = []
    plan = Plan(n=n, steps=1, dt=0.01, method="treepm", box_size=1.0, dtype="float32")
    for kind, ds in boxes(n).items():
        x = np.ascontiguousarray(ds.position.values.T.astype(np.float32))
        m = ds.mass.values.astype(np.float32)
        mesh, split, cutoff = plan.mesh_size, plan.split_length, plan.cutoff_length
        region, deposit = _timed(pm.deposit, x, m, 1.0, mesh, "tsc")
        total, mesh_sum = _timed(pm.mesh_sum, mesh, "float32", region)
        solved, fft = _timed(pm.long_range, total, 1.0, split, False, "tsc", -1)
        _, interpolation = _timed(pm.interpolate, x, m, solved, 1.0, split, "tsc")
        tree, build = _timed(octree.build, x, m, plan.leaf_size)
        spread = spread_of(tree)
        zero = np.float32(0)
        _, short = _timed(short_walk, tree, tree, zero, plan.theta, 1.0, split, cutoff, False,
                          spread)
        _, isolated = _timed(walk, tree, tree, zero, plan.theta, False, True)
        _, evaluation = _timed(lambda ds=ds: nbody_dask.accelerations(
            ds, box_size=1.0, method="treepm", dtype="float32", client=client))
        _, tree_evaluation = _timed(lambda ds=ds: nbody_dask.accelerations(
            _isolated(ds), method="tree", dtype="float32", client=client))
        start = time.perf_counter()
        steps = 4
        nbody_dask.simulate(ds, steps=steps, dt=1e-3, box_size=1.0, method="treepm",
                            dtype="float32", progress=False, client=client)
        step = (time.perf_counter() - start) / (steps + 1)  # and the initial evaluation
        one_step = _step_time(ds, client)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
                Client(cluster) as two:
            _, two_processes = _timed(lambda ds=ds: nbody_dask.accelerations(
                ds, box_size=1.0, method="treepm", dtype="float32", client=two,
                tile_size=-(-n // 4)))
            two_step = _step_time(ds, two, tile_size=-(-n // 4))
            _, two_rows = _timed(lambda ds=ds: nbody_dask.accelerations(
                ds, box_size=1.0, method="treepm", dtype="float32", client=two,
                layout="rows"))
            two_rows_step = _step_time(ds, two, layout="rows")
        row = dict(box=kind, n=n, mesh=mesh, deposit=deposit, mesh_sum=mesh_sum, fft=fft,
                   interpolation=interpolation, tree_build=build, short_range=short,
                   isolated_tree_walk=isolated, short_over_isolated=short / isolated,
                   evaluation=evaluation, tree_evaluation=tree_evaluation,
                   evaluation_over_tree=evaluation / tree_evaluation, simulate_step=step,
                   step_over_evaluation=step / evaluation, two_processes=two_processes,
                   two_over_one=two_processes / evaluation, steady_step=one_step,
                   steady_step_two_processes=two_step, steady_two_over_one=two_step / one_step,
                   two_processes_rows=two_rows, two_rows_over_one=two_rows / evaluation,
                   steady_step_two_processes_rows=two_rows_step,
                   steady_two_rows_over_one=two_rows_step / one_step)
        rows.append(row)
        print("cost " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in row.items()), flush=True)
    return rows


def split_trade(n: int, sample: int, splits: list[float], client: Client) -> list[dict]:
    rows = []
    for kind, ds in boxes(n).items():
        targets, reference, _ = ewald_reference(n, sample, kind)
        x = np.ascontiguousarray(ds.position.values.T.astype(np.float32))
        m = ds.mass.values.astype(np.float32)
        base = Plan(n=n, steps=1, dt=0.01, method="treepm", box_size=1.0, dtype="float32")
        tree = octree.build(x, m, base.leaf_size)
        spread = spread_of(tree)
        zero = np.float32(0)
        _, isolated = _timed(walk, tree, tree, zero, base.theta, False, True, repeats=3)
        for split in splits:
            plan = Plan(n=n, steps=1, dt=0.01, method="treepm", box_size=1.0, dtype="float32",
                        split=split)
            acc = nbody_dask.accelerations(ds, box_size=1.0, method="treepm", dtype="float32",
                                           split=split, client=client)
            median, p99, worst = error_statistics(relative_errors(acc[targets], reference))
            _, short = _timed(short_walk, tree, tree, zero, plan.theta, 1.0, plan.split_length,
                              plan.cutoff_length, False, spread, repeats=3)
            rows.append(dict(box=kind, n=n, mesh=plan.mesh_size, split=split,
                             r_s_spacings=plan.split_length * n ** (1 / 3), median=median,
                             p99=p99, max=worst, short_range=short, isolated_tree_walk=isolated,
                             short_over_isolated=short / isolated))
            print(f"split {kind:9s} {split:5.2f} cells: median {median:.1e} p99 {p99:.1e} "
                  f"max {worst:.1e}; short range {short:.3f} s = {short / isolated:.2f}x the "
                  f"isolated walk", flush=True)
    return rows


def crossover(client: Client) -> list[dict]:
    rows = []
    for n in (64, 128, 256, 512, 1024, 2048, 4096):
        ds = boxes(n)["uniform"]
        out = dict(n=n)
        for method in ("direct", "treepm"):
            _, out[method] = _timed(lambda method=method, ds=ds: nbody_dask.accelerations(
                ds, box_size=1.0, method=method, client=client))
        rows.append(out)
        print(f"crossover n={n}: Ewald {out['direct']:.3f} s, TreePM {out['treepm']:.3f} s",
              flush=True)
    return rows


def task_counts() -> list[dict]:
    rows = []
    for tiles in (64, 256, 1024):
        n = tiles * 16_384
        plan = Plan(n=n, steps=10, dt=0.01, method="treepm", box_size=1.0, tile_size=16_384,
                    dtype="float32")
        rows.append(dict(tiles=tiles, n=n, mesh=plan.mesh_size, slabs=plan.mesh_slabs,
                         tasks_per_step=plan.tasks_per_step()))
        print(f"tasks: {tiles} tiles, {n} bodies, mesh {plan.mesh_size} in "
              f"{plan.mesh_slabs} slab(s): {plan.tasks_per_step()} tasks a step", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=262_144)
    parser.add_argument("--sample", type=int, default=1000)
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--splits", type=float, nargs="+", default=[2.5, 2.0, 1.75, 1.5, 1.25],
                        help="split scales (mesh cells) of the split section")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = dict(benchmark="periodic", n=args.n, cores=os.cpu_count(),
                  machine=platform.processor() or platform.machine(),
                  date=time.strftime("%Y-%m-%d"))
    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as c, \
            Client(c) as client:
        if "accuracy" in args.sections:
            result["accuracy"] = accuracy(args.n, args.sample, client)
        if "cost" in args.sections:
            result["cost"] = cost(args.n, client)
        if "split" in args.sections:
            result["split"] = split_trade(args.n, args.sample, args.splits, client)
        if "crossover" in args.sections:
            result["crossover"] = crossover(client)
    if "tasks" in args.sections:
        result["tasks"] = task_counts()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
