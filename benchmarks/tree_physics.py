"""The tree against direct summation on one Plummer sphere over several crossing times.

    python benchmarks/tree_physics.py [--n 16384] [--t-end 8] [--json out.json]

Runs the same initial conditions (float32, softening 0.01, dt = 1/64, a snapshot every 0.5
time units) with ``method="direct"`` and ``method="tree"`` (default theta and leaf size, 4
spatial tiles re-cut every 10 steps) on the default local cluster, and reports for each: the
largest energy error and its drift (E/E0 - 1 at the end), the momentum drift |P - P0| (the
tree does not conserve momentum exactly), and the largest relative difference of the 10%,
50% and 90% Lagrangian radii between the two runs. The crossing time of a Hénon-unit system
is 2 sqrt(2) ≈ 2.8.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=16_384)
    parser.add_argument("--t-end", type=float, default=8.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import nbody_dask
    from nbody_dask.analysis import conservation, lagrangian_radii

    dt = 1 / 64
    steps = int(round(args.t_end / dt))
    bodies = nbody_dask.plummer(args.n, seed=3)
    runs, out = {}, {"n": args.n, "t_end": args.t_end, "dt": dt, "steps": steps}
    for method in ("direct", "tree"):
        extra = {"tile_size": -(-args.n // 4)} if method == "tree" else {}
        t0 = time.perf_counter()
        traj = nbody_dask.simulate(bodies, steps=steps, dt=dt, softening=0.01,
                                   snapshot_every=32, dtype="float32", method=method,
                                   progress=False, **extra)
        seconds = time.perf_counter() - t0
        runs[method] = traj
        cons = conservation(traj)
        energy = cons.energy_error.values
        out[method] = {"seconds": seconds, "max_energy_error": float(np.abs(energy).max()),
                       "final_energy_error": float(energy[-1]),
                       "max_momentum_drift": float(cons.momentum_drift.max())}
        print(f"{method:>6}: {seconds:6.1f} s, max |E/E0 - 1| {out[method]['max_energy_error']:.2e}"
              f", final {energy[-1]:+.2e}, max |P - P0| "
              f"{out[method]['max_momentum_drift']:.2e}", flush=True)
    fractions = (0.1, 0.5, 0.9)
    radii = {m: lagrangian_radii(runs[m], fractions).values for m in runs}
    worst = np.abs(radii["tree"] / radii["direct"] - 1).max(axis=0)
    out["lagrangian_radii_max_relative_difference"] = dict(zip(map(str, fractions),
                                                               map(float, worst), strict=True))
    for f, w in zip(fractions, worst, strict=True):
        print(f"Lagrangian radius {f:.0%}: tree within {w:.2%} of direct over the run")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
