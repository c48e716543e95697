"""method="tree" against pytreegrav and the C direct reference, in one run.

    python benchmarks/tree.py [--n 65536,262144,1048576] [--theta 0.4,0.7] [--steps]
                              [--tiles T] [--json out.json]

For each N (a Plummer sphere, float32, no softening): one force evaluation by
``nbody_dask.accelerations(method="tree")`` on the default local cluster (the whole task
graph: scatter, re-tiling into spatial tiles, trees, walks, routing back to body order), and by
the kernel alone in this process (``kernels.tree.tree_accelerations``), at each opening angle
(best of 2, Numba already compiled); with ``--steps``, the time of a simulate() step at the
default opening angle (snapshots every 10 steps, differential: 20 steps minus 10); by
pytreegrav ``Accel(method="tree", theta=0.7, parallel=True)`` (float64, its default
accuracy; install it with the ``bench`` extra); and the C direct reference's rate from
``../shared/bench/refbench.py`` when it is there, turned into the time of an N² evaluation.
With ``--tiles T`` the evaluations run on ``T`` spatial tiles (``tile_size`` = N / T, as
on a cluster of ``T`` workers) instead of the one tile of the default local cluster.
Errors: median, 99th percentile and max relative force error on 1,000 targets against a
float64 direct sum (:func:`nbody_dask.accuracy.force_errors`). The ratio is tree time
(through the graph) over pytreegrav time; compare rows whose median error is no worse than
pytreegrav's.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="65536,262144,1048576")
    parser.add_argument("--theta", default="0.4,0.7")
    parser.add_argument("--leaf-size", type=int, default=None)
    parser.add_argument("--steps", action="store_true")
    parser.add_argument("--pytreegrav-theta", default="0.7",
                        help="pytreegrav's opening angles (the first is the one compared)")
    parser.add_argument("--plot", default=None,
                        help="PNG of median error against time per evaluation, last N")
    parser.add_argument("--tiles", type=int, default=None,
                        help="spatial tiles of the evaluations (default: the plan's)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--replot", default=None, metavar="JSON",
                        help="only draw --plot again from this JSON of an earlier run")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f)[-1], args.plot)
        return

    from distributed import Client

    import nbody_dask
    from nbody_dask.accuracy import force_errors
    from nbody_dask.benchmark import (best_of, find_reference, pytreegrav_evaluation,
                                      reference_rate, simulate_rate)
    from nbody_dask.clusters import local
    from nbody_dask import config
    from nbody_dask.kernels.tree import tree_accelerations

    leaf = config.get("leaf-size", args.leaf_size)
    thetas = [float(t) for t in args.theta.split(",")]
    refbench = find_reference()
    rows = []
    cluster = local()
    client = Client(cluster)
    for n in (int(v) for v in args.n.split(",")):
        bodies = nbody_dask.plummer(n, seed=1)
        pos64 = bodies.position.values
        mass64 = bodies.mass.values
        pos = np.ascontiguousarray(pos64.T.astype(np.float32))
        mass = mass64.astype(np.float32)
        tree_accelerations(pos[:, :1000], mass[:1000], 0.0, thetas[0], leaf)  # compile
        row = {"n": n, "cores": len(os.sched_getaffinity(0)), "leaf_size": leaf,
               "tiles": args.tiles, "tree": []}
        kw = dict(method="tree", leaf_size=leaf, dtype="float32", client=client,
                  tile_size=-(-n // args.tiles) if args.tiles else None)
        nbody_dask.accelerations(bodies.isel(body=slice(0, 40_000)), theta=thetas[0], **kw)
        for theta in thetas:
            seconds, acc = best_of(2, partial(nbody_dask.accelerations, bodies, theta=theta,
                                              **kw))
            kernel, _ = best_of(2, partial(tree_accelerations, pos, mass, 0.0, theta, leaf))
            err = force_errors(bodies, acc).as_dict()
            row["tree"].append({"theta": theta, "seconds": seconds, "kernel_seconds": kernel,
                                **err})
            print(f"N={n:>8} tree theta={theta:<5} {seconds:8.3f} s (kernel alone "
                  f"{kernel:.3f} s)  median {err['median']:.2e}  p99 {err['p99']:.2e}  max "
                  f"{err['max']:.2e}", flush=True)
        if args.steps:
            run = simulate_rate(n, steps=20, dtype="float32", snapshot_every=10,
                                client=client, method="tree")
            row["simulate_step_seconds"] = run["seconds_per_step"]
            print(f"N={n:>8} simulate() step, default theta (vs theta={thetas[0]}): "
                  f"{run['seconds_per_step']:.3f} s = "
                  f"{run['seconds_per_step'] / row['tree'][0]['seconds']:.2f}x one evaluation",
                  flush=True)
        sweep = [pytreegrav_evaluation(n, theta=float(t), seed=1)
                 for t in args.pytreegrav_theta.split(",")]
        if None in sweep:
            print("pytreegrav is not installed (pip install 'nbody-dask[bench]'): no ratios")
        else:
            row["pytreegrav_sweep"] = sweep
            for p in sweep:
                print(f"N={n:>8} pytreegrav {p['theta']:<5} {p['seconds']:8.3f} s  median "
                      f"{p['median']:.2e}  p99 {p['p99']:.2e}  max {p['max']:.2e}", flush=True)
            row["pytreegrav"] = row["pytreegrav_sweep"][0]
            seconds = row["pytreegrav"]["seconds"]
            for entry in row["tree"]:
                entry["ratio_to_pytreegrav"] = entry["seconds"] / seconds
                print(f"           theta={entry['theta']}: {entry['ratio_to_pytreegrav']:.2f}x "
                      "pytreegrav's time", flush=True)
        if refbench is not None:
            rate = reference_rate(refbench, n=min(n, 65536), threads=row["cores"],
                                  reps=3)["gint_s"]["median"]
            row["direct_reference_seconds"] = n * n / (rate * 1e9)
            print(f"N={n:>8} C direct reference (est. from its rate) "
                  f"{row['direct_reference_seconds']:8.2f} s", flush=True)
        rows.append(row)
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        for i, theta in enumerate(thetas):
            growth = (last["tree"][i]["seconds"] / last["n"]) / (first["tree"][i]["seconds"]
                                                                  / first["n"])
            print(f"cost per body, theta={theta}: x{growth:.2f} from N={first['n']} to "
                  f"N={last['n']}")
    client.close()
    cluster.close()
    if args.plot:
        plot(rows[-1], args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def plot(row: dict, path: str) -> None:
    """Median and 99th-percentile error against time per evaluation, ours and pytreegrav's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, points, style in (("nbody_dask tree", row["tree"], "o-"),
                                 ("pytreegrav", row.get("pytreegrav_sweep", []), "s--")):
        if not points:
            continue
        points = sorted(points, key=lambda p: p["theta"])
        t = [p["seconds"] for p in points]
        line, = ax.loglog(t, [p["median"] for p in points], style, label=f"{label}, median")
        ax.loglog(t, [p["p99"] for p in points], style, color=line.get_color(), alpha=0.45,
                  label=f"{label}, 99th percentile")
        for p in points:
            ax.annotate(f"θ={p['theta']:g}", (p["seconds"], p["median"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("seconds per force evaluation (2 cores)")
    ax.set_ylabel("relative force error")
    ax.set_title(f"Plummer sphere, N = {row['n']:,}, float32")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
