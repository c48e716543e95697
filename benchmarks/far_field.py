"""Near and far tile pairs of the tree method: how many pairs remain walks as tiles multiply,
and what the far tasks cost through the graph.

    python benchmarks/far_field.py [--n 1048576] [--tiles 16,64,256,1024] [--theta 0.4,0.7]
                                   [--graph-n 262144] [--graph-tiles 64] [--workers 2]
                                   [--json out.json]

1. **Classification** (this process, no cluster): a Plummer sphere of ``--n`` bodies (float32)
   cut into ``T`` runs of the Morton curve, as the re-tiling cuts it; each tile's tree and
   summary (:func:`nbody_dask.kernels.tree.summarize`), the forest, and
   :func:`~nbody_dask.kernels.tree.near_sources` for the bodies at rest. Reported per T and
   theta: the share of tile pairs that are near (walked), near sources per tile, the forest's
   cells and bytes, the classification's time, and the tasks of one step's graph with near
   and far pairs against walking every pair (counted from
   :func:`nbody_dask.graph.steps_pieces` fed these classifications), with the ``"rows"``
   layout (a task per target tile), and the tasks of one re-tiling (T parts of each old tile
   taken one by one, against :meth:`~nbody_dask.plan.Plan.shuffle_blocks`).
2. **Through the graph** (``--graph-n`` bodies in ``--graph-tiles`` spatial tiles on a local
   cluster of ``--workers`` one-thread worker processes): one ``accelerations()`` (re-tiling,
   classification, trees, walks, far tasks, routing back) and the time per simulate() step
   (10 steps, one re-tiling, differential: 20 steps minus 10), with near/far and with every
   pair walked (``nbody.near-far-tiles`` above T), and the force errors of both against a
   float64 direct sum on 1,000 targets.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def curve_trees(position, mass, n_tiles):
    """The trees of ``n_tiles`` runs of the Morton curve of the bodies, in its cube (as the
    re-tiling builds them)."""
    from nbody_dask import config
    from nbody_dask.kernels import tree
    from nbody_dask.spatial import bounding_cube

    cube = bounding_cube(np.stack([position.min(axis=1), position.max(axis=1)]).astype(float))
    keys = tree.morton_keys(position[0], position[1], position[2], cube[:3].copy(), cube[3])
    order = np.argsort(keys, kind="stable")
    return [tree.build(position[:, run], mass[run], config.get("leaf-size"), cube=cube)
            for run in np.array_split(order, n_tiles)]


def step_tasks(n, n_tiles, near, layout="pairs"):
    """Tasks of one step between re-tilings, counted from the graph pieces that the driver
    would submit, with the classification ``near`` (None: every pair walked)."""
    from nbody_dask.graph import steps_pieces
    from nbody_dask.methods.tree import TreeWindow
    from nbody_dask.plan import Plan

    plan = Plan(n=n, steps=20, dt=0.01, tile_size=-(-n // n_tiles), method="tree",
                near_far_tiles=1 if near else n_tiles + 1, layout=layout)
    window = TreeWindow([f"tree-{i}" for i in range(n_tiles)], near)
    pieces = steps_pieces(plan, "count", [f"tile-{i}" for i in range(n_tiles)], window, 1, 1,
                          frozenset())
    return len(next(pieces).graph)


def retile_tasks(n, n_tiles, blocked=True):
    """Tasks of one re-tiling (:func:`nbody_dask.methods.tree.retile`), its parts taken in the
    plan's blocks or one by one."""
    from unittest import mock

    from nbody_dask.methods.tree import retile
    from nbody_dask.plan import Plan

    plan = Plan(n=n, steps=20, dt=0.01, tile_size=-(-n // n_tiles), method="tree")
    dsk = {}
    with mock.patch.object(Plan, "shuffle_blocks", Plan.shuffle_blocks if blocked else
                           lambda self: [(i, i + 1) for i in range(self.n_tiles)]):
        retile(dsk, plan, "count", 0, [f"tile-{i}" for i in range(n_tiles)])
    return len(dsk)


def classification(n, tiles, thetas):
    import nbody_dask
    from nbody_dask.kernels import tree

    bodies = nbody_dask.plummer(n, seed=1)
    position = bodies.position.values.T.astype(np.float32).copy()
    mass = bodies.mass.values.astype(np.float32)
    rows = []
    for t in tiles:
        trees = curve_trees(position, mass, t)
        forest = tree.forest(*map(tree.summarize, trees))
        nbytes = sum(a.nbytes for a in vars(forest).values())
        tree.near_sources(forest, thetas[0])  # compiled
        for theta in thetas:
            t0 = time.perf_counter()
            near = tree.near_sources(forest, theta)
            seconds = time.perf_counter() - t0
            pairs = sum(map(len, near))
            row = dict(n=n, tiles=t, theta=theta, near_share=pairs / t**2,
                       near_per_tile=pairs / t, forest_cells=int(forest.mass.shape[0]),
                       forest_bytes=int(nbytes), classify_s=seconds,
                       tasks_near_far=step_tasks(n, t, near),
                       tasks_every_pair=step_tasks(n, t, None),
                       tasks_rows=step_tasks(n, t, near, "rows"),
                       retile_tasks=retile_tasks(n, t),
                       retile_tasks_unblocked=retile_tasks(n, t, blocked=False))
            rows.append(row)
            print(f"| {n:,} | {t} | {theta} | {row['near_share']:.0%} | "
                  f"{row['near_per_tile']:.1f} | {row['forest_cells']:,} | "
                  f"{nbytes / 2**20:.1f} MiB | {seconds:.3f} s | "
                  f"{row['tasks_near_far']:,} | {row['tasks_every_pair']:,} | "
                  f"{row['tasks_rows']:,} | {row['retile_tasks']:,} / "
                  f"{row['retile_tasks_unblocked']:,} |", flush=True)
    return rows


def through_graph(n, n_tiles, workers):
    import dask
    from distributed import Client, LocalCluster

    import nbody_dask
    from nbody_dask.accuracy import force_errors
    from nbody_dask.benchmark import best_of

    bodies = nbody_dask.plummer(n, seed=1)
    tile = -(-n // n_tiles)
    rows = []
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client:
        for label, limit in (("near/far", 1), ("every pair", n_tiles + 1)):
            with dask.config.set({"nbody.near-far-tiles": limit}):
                def evaluate():
                    return nbody_dask.accelerations(bodies, method="tree", tile_size=tile,
                                                    dtype="float32", client=client)

                evaluate()  # compiled on the workers
                seconds, acc = best_of(2, evaluate)
                errors = force_errors(bodies, acc)

                def run(steps):
                    t0 = time.perf_counter()
                    nbody_dask.simulate(bodies, steps=steps, dt=1e-3, snapshot_every=10,
                                        method="tree", tile_size=tile, dtype="float32",
                                        client=client, progress=False)
                    return time.perf_counter() - t0

                per_step = (run(20) - run(10)) / 10
            rows.append(dict(n=n, tiles=n_tiles, workers=workers, label=label,
                             evaluation_s=seconds, step_s=per_step, median=errors.median,
                             p99=errors.p99))
            print(f"| {n:,} | {n_tiles} | {label} | {seconds:.2f} s | {per_step:.2f} s | "
                  f"{errors.median:.2e} / {errors.p99:.2e} |", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_048_576)
    parser.add_argument("--tiles", default="16,64,256,1024")
    parser.add_argument("--theta", default="0.4,0.7")
    parser.add_argument("--graph-n", type=int, default=262_144)
    parser.add_argument("--graph-tiles", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print("| N | tiles | theta | pairs near | near per tile | forest cells | forest | "
          "classify | tasks/step near-far | tasks/step every pair | tasks/step rows | "
          "re-tiling tasks (blocks / one by one) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = classification(args.n, [int(t) for t in args.tiles.split(",")],
                          [float(t) for t in args.theta.split(",")])
    graph_rows = []
    if args.graph_tiles:
        print(f"\n{args.workers} one-thread worker processes, float32, theta = 0.4:\n")
        print("| N | tiles | pairs | one evaluation | simulate() step | median / p99 error |")
        print("|---|---|---|---|---|---|")
        graph_rows = through_graph(args.graph_n, args.graph_tiles, args.workers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"classification": rows, "graph": graph_rows}, f, indent=1)


if __name__ == "__main__":
    main()
