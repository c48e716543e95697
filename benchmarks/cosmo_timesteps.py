"""Individual time steps in a comoving TreePM box against global steps: work and accuracy.

    python benchmarks/cosmo_timesteps.py [--n-side 32] [--box 64] [--z-start 20]
        [--reference 512] [--global-steps 64 128 256] [--blocks 16 32] [--bins 4]
        [--json out.json]

2LPT initial conditions (``nbody_dask.cosmological_ics``, Planck 2018, ``--n-side``
cubed bodies in a ``--box`` Mpc/h box at ``--z-start``) run to z = 0 by TreePM in
float32 with a comoving softening of 1/25 of the mean spacing, on the default local
cluster: the global step with ``--reference`` steps uniform in ln a as the reference, the
global step with each count of ``--global-steps``, and individual steps (the default
acceleration criterion, ``--bins`` bins) with each count of ``--blocks`` blocks. For every
run: the wall time, force evaluations per body, the final bins, the z = 0 matter power
spectrum (TSC, interlacing, a mesh of twice the grid) over the reference's in shells up to
half the particle Nyquist frequency and at k = 1 h/Mpc, and the bodies' mean distance from
their place in the reference run (nearest images), in mean spacings.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

import nbody_dask


def _measure(traj, seconds: float, reference, args) -> dict:
    n = args.n_side**3
    final = traj.isel(time=-1)
    out = {"seconds": seconds}
    if "force_evaluations" in traj:
        out["evaluations_per_body"] = float(traj.force_evaluations.sum()) / n
        out["bins_at_end"] = np.bincount(traj.time_bin.values[-1]).tolist()
    if reference is not None:
        pk = nbody_dask.power_spectrum(final, 2 * args.n_side)
        ref = nbody_dask.power_spectrum(reference.isel(time=-1), 2 * args.n_side)
        k = pk.k.values
        nyquist = np.pi * args.n_side / args.box
        ratio = (pk.power / ref.power).values
        shells = k <= nyquist / 2
        out["power_ratio_max_deviation"] = float(np.abs(ratio[shells] - 1).max())
        out["power_ratio_at_1"] = float(np.interp(1.0, k, ratio))
        apart = (final.position.values - reference.position.values[-1] + args.box / 2) \
            % args.box - args.box / 2
        spacing = args.box / args.n_side
        out["mean_distance_spacings"] = float(np.sqrt((apart**2).sum(axis=1)).mean()
                                              / spacing)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-side", type=int, default=32)
    parser.add_argument("--box", type=float, default=64.0)
    parser.add_argument("--z-start", type=float, default=20.0)
    parser.add_argument("--reference", type=int, default=512)
    parser.add_argument("--global-steps", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--blocks", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--bins", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from distributed import Client, LocalCluster

    ics = nbody_dask.cosmological_ics(args.n_side, args.box, "Planck18", z_start=args.z_start,
                                      seed=1).compute()
    kw = dict(softening=args.box / args.n_side / 25, dtype="float32", progress=False)
    runs = []
    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as c, \
            Client(c) as client:
        nbody_dask.simulate(ics, steps=2, client=client, **kw)  # compile the kernels

        def run(**extra):
            start = time.perf_counter()
            traj = nbody_dask.simulate(ics, client=client, **kw, **extra)
            return traj, time.perf_counter() - start

        reference, seconds = run(steps=args.reference)
        runs.append(dict(run="global", steps=args.reference, reference=True,
                         seconds=seconds, evaluations_per_body=float(args.reference)))
        print(f"reference: {args.reference} global steps, {seconds:.1f} s", flush=True)
        for steps in args.global_steps:
            traj, seconds = run(steps=steps)
            row = dict(run="global", steps=steps, **_measure(traj, seconds, reference, args))
            row["evaluations_per_body"] = float(steps)
            runs.append(row)
            print(row, flush=True)
        for blocks in args.blocks:
            traj, seconds = run(steps=blocks, timestep="individual", time_bins=args.bins)
            row = dict(run="individual", blocks=blocks, bins=args.bins,
                       **_measure(traj, seconds, reference, args))
            runs.append(row)
            print(row, flush=True)
    result = dict(benchmark="cosmo_timesteps", n_side=args.n_side, box=args.box,
                  z_start=args.z_start, machine=platform.processor() or platform.machine(),
                  date=time.strftime("%Y-%m-%d"), runs=runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
