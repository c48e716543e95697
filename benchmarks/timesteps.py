"""Individual time steps against the global step at equal accuracy, on a cusp and a merger.

    python benchmarks/timesteps.py [--ic hernquist|merger] [--n 16384] [--t-end 5.66]
        [--global-dt 512 1024 2048] [--eta 0.04 0.02 0.01] [--criterion pairwise]
        [--method direct|tree] [--theta 0.5] [--processes 2] [--json out.json]

One set of initial conditions (a Hernquist sphere, or two of half the mass on a bound
orbit), float32, Plummer softening ``--softening``, direct summation on the default local
cluster (one tile: the global step runs fused with the symmetric kernel, the individual
steps as fused blocks with the parallel kernel), or with ``--method tree`` the tree
(``--theta``; one tile: a tree and its walk a step, or fused blocks whose tree is refit at
every tick; with ``--processes N``, N worker processes of one thread and the tree's spatial
tiles). The global step runs at ``dt = 1 / k`` for each ``k`` of ``--global-dt``; the
individual steps at each ``eta`` with blocks of ``--block`` and ``--bins`` bins. For every
run: the wall time, force evaluations per body, the largest relative energy error over the
snapshots (every 1/8 time unit), the momentum drift and the 10/50/90% Lagrangian radii at
the end against the most accurate global run. Then, for each individual run, the global step
that reaches the same energy error (interpolated in log-log between the global runs) and its
wall time and evaluations: the ratios are the savings at equal accuracy. The crossing time
of a Hénon-unit system is 2 sqrt(2) ≈ 2.83. """

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np


def _initial_conditions(kind: str, n: int):
    import nbody_dask

    if kind == "hernquist":
        return nbody_dask.hernquist(n, seed=1)
    # two Hernquist spheres of half the mass each (velocities scaled by sqrt(1/2) to stay
    # in equilibrium), 4 units apart on a bound orbit that merges within a crossing time
    half = nbody_dask.hernquist(n // 2, seed=2)
    other = nbody_dask.hernquist(n - n // 2, seed=3)
    scale = np.sqrt(0.5)
    position = np.concatenate([half.position.values - [2, 0, 0],
                               other.position.values + [2, 0, 0]])
    velocity = np.concatenate([half.velocity.values * scale + [0, 0.1, 0],
                               other.velocity.values * scale - [0, 0.1, 0]])
    return nbody_dask.make_bodies(position, velocity, np.full(n, 1.0 / n))


def _measure(traj, seconds: float, n: int) -> dict:
    from nbody_dask.analysis import conservation, lagrangian_radii

    cons = conservation(traj)
    energy = cons.energy_error.values
    out = {"seconds": seconds, "max_energy_error": float(np.abs(energy).max()),
           "max_momentum_drift": float(cons.momentum_drift.max()),
           "lagrangian_radii": lagrangian_radii(traj, (0.1, 0.5, 0.9)).values[-1].tolist()}
    if "force_evaluations" in traj:
        out["evaluations_per_body"] = float(traj.force_evaluations.sum()) / n
        out["bins_at_end"] = np.bincount(traj.time_bin.values[-1]).tolist()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ic", choices=("hernquist", "merger"), default="hernquist")
    parser.add_argument("--n", type=int, default=16_384)
    parser.add_argument("--t-end", type=float, default=5.66)
    parser.add_argument("--softening", type=float, default=0.004)
    parser.add_argument("--global-dt", type=int, nargs="+", default=[512, 1024, 2048],
                        help="global steps dt = 1 / k for each k")
    parser.add_argument("--eta", type=float, nargs="+", default=[0.04, 0.02, 0.01])
    parser.add_argument("--criterion", default="pairwise")
    parser.add_argument("--block", type=int, default=16, help="blocks of dt = 1 / k")
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--method", choices=("direct", "tree"), default="direct")
    parser.add_argument("--theta", type=float, default=None, help="the tree's (default: "
                        "the configured one)")
    parser.add_argument("--processes", type=int, default=0,
                        help="worker processes of one thread (spatial tiles for the tree); "
                             "0: the default cluster, one in-process worker")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import nbody_dask
    from distributed import Client, LocalCluster

    bodies = _initial_conditions(args.ic, args.n)
    out = {"ic": args.ic, "n": args.n, "t_end": args.t_end, "softening": args.softening,
           "dtype": "float32", "machine": f"{platform.processor() or platform.machine()}, "
                                          f"{__import__('os').cpu_count()} cores",
           "global": {}, "individual": {}}
    common = dict(softening=args.softening, dtype="float32", method=args.method,
                  progress=False)
    if args.method == "tree":
        common["theta"] = args.theta
        out["theta"] = args.theta or nbody_dask.config.get("theta")
    out["method"] = args.method
    out["processes"] = args.processes
    cluster_kw = (dict(n_workers=args.processes, threads_per_worker=1, processes=True,
                       host="127.0.0.1") if args.processes
                  else dict(n_workers=1, processes=False))
    with LocalCluster(dashboard_address=None, **cluster_kw) as cluster, \
            Client(cluster) as client:
        nbody_dask.simulate(bodies, steps=2, dt=1 / 64, client=client, **common)  # warm up
        nbody_dask.simulate(bodies, steps=2, dt=1 / 64, client=client,
                            timestep="individual", **common)
        for k in args.global_dt:
            steps = int(round(args.t_end * k))
            t0 = time.perf_counter()
            traj = nbody_dask.simulate(bodies, steps=steps, dt=1 / k, client=client,
                                       snapshot_every=max(1, k // 8), **common)
            traj = traj.load()
            result = _measure(traj, time.perf_counter() - t0, args.n)
            result["evaluations_per_body"] = float(steps)
            out["global"][str(k)] = result
            print(f"global dt=1/{k}: {result['seconds']:7.1f} s, {steps} evaluations/body, "
                  f"max |dE/E| {result['max_energy_error']:.2e}", flush=True)
        for eta in args.eta:
            blocks = int(round(args.t_end * args.block))
            t0 = time.perf_counter()
            traj = nbody_dask.simulate(bodies, steps=blocks, dt=1 / args.block,
                                       client=client, snapshot_every=max(1, args.block // 8),
                                       timestep="individual", step_criterion=args.criterion,
                                       eta=eta, time_bins=args.bins, **common)
            traj = traj.load()
            result = _measure(traj, time.perf_counter() - t0, args.n)
            out["individual"][str(eta)] = result
            print(f"individual eta={eta}: {result['seconds']:7.1f} s, "
                  f"{result['evaluations_per_body']:.0f} evaluations/body, max |dE/E| "
                  f"{result['max_energy_error']:.2e}, bins at the end "
                  f"{result['bins_at_end']}", flush=True)
    _compare(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


def _compare(out: dict) -> None:
    """Each individual run against the global step of the same energy error (log-log
    interpolation between the global runs; beyond them, not extrapolated)."""
    runs = sorted(out["global"].values(), key=lambda r: r["evaluations_per_body"])
    log_work = np.log([r["evaluations_per_body"] for r in runs])
    log_error = np.log([r["max_energy_error"] for r in runs])
    log_seconds = np.log([r["seconds"] for r in runs])
    reference = np.array(runs[-1]["lagrangian_radii"])
    for eta, run in out["individual"].items():
        run["lagrangian_radii_vs_finest_global"] = (
            np.array(run["lagrangian_radii"]) / reference - 1).tolist()
        error = np.log(run["max_energy_error"])
        order = np.argsort(log_error)
        if not log_error.min() <= error <= log_error.max():
            print(f"eta={eta}: its energy error lies outside the global runs' range")
            continue
        work = float(np.exp(np.interp(error, log_error[order], log_work[order])))
        seconds = float(np.exp(np.interp(error, log_error[order], log_seconds[order])))
        run["equal_error_global"] = {"evaluations_per_body": work, "seconds": seconds,
                                     "work_ratio": work / run["evaluations_per_body"],
                                     "wall_ratio": seconds / run["seconds"]}
        print(f"eta={eta}: the global step of equal error takes {work:.0f} evaluations/body "
              f"and {seconds:.1f} s: {work / run['evaluations_per_body']:.2f}x the work, "
              f"{seconds / run['seconds']:.2f}x the wall time; Lagrangian radii vs the "
              f"finest global run {np.round(run['lagrangian_radii_vs_finest_global'], 4)}")


if __name__ == "__main__":
    main()
