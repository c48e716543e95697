"""The tree far-field kernel against pytreegrav and the C direct reference, in one run.

    python benchmarks/tree.py [--n 65536,262144,1048576] [--theta 0.4,0.7] [--json out.json]

For each N (a Plummer sphere, float32, no softening): one force evaluation by
``kernels.tree.tree_accelerations`` at each opening angle (best of 2, Numba already
compiled), by pytreegrav ``Accel(method="tree", theta=0.7, parallel=True)`` (float64, its
default accuracy; install it with the ``bench`` extra), and the C direct reference's rate from
``../shared/bench/refbench.py`` when it is there, turned into the time of an N² evaluation.
Errors: median, 99th percentile and max relative force error on 1,000 targets against a
float64 direct sum (:func:`nbody_dask.accuracy.force_errors`). The ratio is tree time over
pytreegrav time; compare rows whose median error is no worse than pytreegrav's.

This measures the kernel in one process on all cores; the tile graph around it is the next step
of issue 13.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def best_time(fn, *args, reps: int = 2, **kwargs) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="65536,262144,1048576")
    parser.add_argument("--theta", default="0.4,0.7")
    parser.add_argument("--leaf-size", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import nbody_dask
    from nbody_dask.accuracy import force_errors
    from nbody_dask.benchmark import find_reference, reference_rate
    from nbody_dask.kernels.tree import LEAF_SIZE, tree_accelerations

    leaf = args.leaf_size or LEAF_SIZE
    thetas = [float(t) for t in args.theta.split(",")]
    try:
        from pytreegrav import Accel
    except ImportError:
        Accel = None
        print("pytreegrav is not installed (pip install 'nbody-dask[bench]'): no ratios")
    refbench = find_reference()
    rows = []
    for n in (int(v) for v in args.n.split(",")):
        bodies = nbody_dask.plummer(n, seed=1)
        pos64 = bodies.position.values
        mass64 = bodies.mass.values
        pos = np.ascontiguousarray(pos64.T.astype(np.float32))
        mass = mass64.astype(np.float32)
        tree_accelerations(pos[:, :1000], mass[:1000], 0.0, thetas[0], leaf)  # compile
        row = {"n": n, "cores": len(os.sched_getaffinity(0)), "leaf_size": leaf, "tree": []}
        for theta in thetas:
            seconds, acc = best_time(tree_accelerations, pos, mass, 0.0, theta, leaf)
            err = force_errors(bodies, acc.T).as_dict()
            row["tree"].append({"theta": theta, "seconds": seconds, **err})
            print(f"N={n:>8} tree theta={theta:<5} {seconds:8.3f} s  median {err['median']:.2e}"
                  f"  p99 {err['p99']:.2e}  max {err['max']:.2e}", flush=True)
        if Accel is not None:
            Accel(pos64[:1000].copy(), mass64[:1000], theta=0.7, method="tree", parallel=True)
            seconds, acc = best_time(Accel, pos64.copy(), mass64, theta=0.7, method="tree",
                                     parallel=True, reps=1)
            err = force_errors(bodies, acc).as_dict()
            row["pytreegrav"] = {"theta": 0.7, "seconds": seconds, **err}
            print(f"N={n:>8} pytreegrav 0.7 {seconds:8.3f} s  median {err['median']:.2e}"
                  f"  p99 {err['p99']:.2e}  max {err['max']:.2e}", flush=True)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
