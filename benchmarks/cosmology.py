"""Cosmological boxes: 2LPT initial conditions and linear growth against theory.

Sections (all by default):

``ics``
    The power spectrum of a fixed-amplitude 2LPT IC set (``--n-side`` cubed bodies in a
    ``--box`` Mpc/h box at z = 49) against the input linear spectrum times D1^2, shell by
    shell, measured on a mesh 4x finer than the particle grid; the time to generate it.
``growth``
    The same ICs run to z = 3, 1 and 0 (three runs, each continuing from the last snapshot
    of the one before, steps of at most ``--dlna`` in ln a, TreePM at its defaults): the
    power of the shells below ``--k-linear`` h/Mpc over their power at z = 49, against
    ``[D(z) / D(49)]^2`` (the issue's check of the PM force's time integration); the wall
    time of each run. The same run's ratio for every shell shows where the lattice's
    discreteness (modes off the grid's axes feel a weaker force than a fluid's) and
    nonlinearity take over.
``scale``
    The issue's scale check at ``--scale-n-side`` (512 by default): fixed-amplitude 2LPT ICs
    of that many bodies a side generated as a Dask graph and written to a Zarr body set by
    ``--workers`` worker processes of one thread each (``save_bodies``: chunk by chunk on
    the workers), then ``power_spectrum`` of that store on a mesh of the same size; the
    time of each and the peak resident memory of every worker and of this process
    (sampled every 0.2 s), the largest sum over all of them at one instant included.

    python benchmarks/cosmology.py --json benchmarks/results/<name>.json
    python benchmarks/cosmology.py --sections scale --scale-n-side 512 --store /tmp/ics.zarr
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time

import numpy as np

import nbody_dask
from nbody_dask.cosmology import Background, linear_power
from nbody_dask.testing import grid_shell_average
from rss import PeakRSS

SECTIONS = ("ics", "growth", "scale")


def ics_section(args) -> dict:
    start = time.perf_counter()
    ics = nbody_dask.cosmological_ics(args.n_side, args.box, "Planck18", z_start=49,
                                      seed=args.seed, fixed_amplitude=True).persist()
    ics = ics.compute()
    seconds = time.perf_counter() - start
    mesh = 4 * args.n_side
    pk = nbody_dask.power_spectrum(ics, mesh)
    d1 = Background("Planck18").growth(float(ics.time)).d1[0]
    expected = grid_shell_average(linear_power("Planck18"), args.n_side, args.box, mesh) \
        * d1**2
    ratio = pk.power.values / expected[: pk.sizes["k"]]
    half = pk.k.values < 0.5 * math.pi * args.n_side / args.box
    row = {"section": "ics", "n_side": args.n_side, "box": args.box, "mesh": mesh,
           "seconds": seconds, "k": pk.k.values[half].tolist(),
           "ratio": ratio[half].tolist(),
           "worst_below_half_nyquist": float(np.abs(ratio[half] - 1).max())}
    print(f"ICs {args.n_side}^3 in {seconds:.2f} s; P/P_lin below half the particle Nyquist "
          f"frequency: worst {row['worst_below_half_nyquist']:.2e}")
    return row


def growth_section(args) -> dict:
    ics = nbody_dask.cosmological_ics(args.n_side, args.box, "Planck18", z_start=49,
                                      seed=args.seed, fixed_amplitude=True).compute()
    bodies, snapshots, runs = ics, [ics], []
    a_now = float(ics.time)
    for z_end in (3.0, 1.0, 0.0):
        a_end = 1 / (1 + z_end)
        steps = math.ceil(math.log(a_end / a_now) / args.dlna)
        start = time.perf_counter()
        traj = nbody_dask.simulate(bodies, steps=steps, z_end=z_end,
                                   softening=args.softening * args.box / args.n_side,
                                   dtype="float32", progress=False, cutoff=args.cutoff,
                                   theta=args.theta)
        runs.append({"z_end": z_end, "steps": steps, "seconds": time.perf_counter() - start})
        bodies = traj.isel(time=-1).load()
        snapshots.append(bodies)
        a_now = float(bodies.time)
        print(f"to z = {z_end}: {steps} steps in {runs[-1]['seconds']:.1f} s")
    mesh = 2 * args.n_side
    spectra = [nbody_dask.power_spectrum(s[["position", "mass"]], mesh, box_size=args.box)
               for s in snapshots]
    a = np.array([float(s.time) for s in snapshots])
    d1 = Background("Planck18").growth(a).d1
    k = spectra[0].k.values
    ratios = np.array([s.power.values / spectra[0].power.values for s in spectra[1:]])
    ratios /= (d1[1:] / d1[0])[:, None] ** 2
    linear = k < args.k_linear
    for z, row in zip((3, 1, 0), ratios, strict=True):
        print(f"z = {z}: P/P_49 / (D/D_49)^2 for k < {args.k_linear}: "
              + " ".join(f"{r:.4f}" for r in row[linear]))
    return {"section": "growth", "n_side": args.n_side, "box": args.box, "mesh": mesh,
            "cutoff": args.cutoff, "theta": args.theta,
            "dlna": args.dlna, "runs": runs, "k": k.tolist(),
            "ratio": {str(z): row.tolist() for z, row in zip((3, 1, 0), ratios, strict=True)},
            "k_linear": args.k_linear,
            "worst_linear": float(np.abs(ratios[:, linear] - 1).max())}


def scale_section(args) -> dict:
    import psutil
    import xarray as xr
    from distributed import Client, LocalCluster

    from nbody_dask.bodyfiles import save_bodies

    n = args.scale_n_side
    box = args.box * n / args.n_side  # the same spacing as the other sections
    store = args.store or f"ics-{n}.zarr"
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        pids = client.run(os.getpid)
        processes = {f"worker {i}": psutil.Process(pid)
                     for i, pid in enumerate(pids.values())}
        processes["driver"] = psutil.Process()
        row = {"section": "scale", "n_side": n, "box": box, "workers": args.workers,
               "threads_per_worker": 1}
        with PeakRSS(processes) as ics_memory:
            start = time.perf_counter()
            ics = nbody_dask.cosmological_ics(n, box, "Planck18", z_start=49, seed=args.seed,
                                              fixed_amplitude=True)
            save_bodies(ics, store, overwrite=True)
            row["ics_seconds"] = time.perf_counter() - start
        row["ics_memory"] = ics_memory.report()
        row["ics_slabs"] = len(ics.position.chunks[0])
        print(f"ICs {n}^3 written in {row['ics_seconds']:.1f} s; peak "
              f"{row['ics_memory']['peak_total_gib']:.2f} GiB in all")
        with PeakRSS(processes) as pk_memory:
            start = time.perf_counter()
            # without the body index, which xarray would read into this process (8 bytes a
            # body, twice that while it is built): the spectrum needs no ids
            pk = nbody_dask.power_spectrum(xr.open_zarr(store, create_default_indexes=False), n,
                                           box_size=box)
            row["power_seconds"] = time.perf_counter() - start
        row["power_memory"] = pk_memory.report()
        print(f"power_spectrum on {n}^3 in {row['power_seconds']:.1f} s; peak "
              f"{row['power_memory']['peak_total_gib']:.2f} GiB in all")
        d1 = Background("Planck18").growth(float(ics.time)).d1[0]
        expected = grid_shell_average(linear_power("Planck18"), n, box, n) * d1**2
        half = pk.k.values < 0.5 * math.pi * n / box
        ratio = pk.power.values[half] / expected[: pk.sizes["k"]][half]
        row["power_over_linear_below_half_nyquist"] = [float(ratio.min()), float(ratio.max())]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-side", type=int, default=64)
    parser.add_argument("--box", type=float, default=500.0, help="Mpc/h")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dlna", type=float, default=0.05, help="largest step in ln a")
    parser.add_argument("--softening", type=float, default=0.05,
                        help="in mean interparticle spacings")
    parser.add_argument("--cutoff", type=float, default=None, help="TreePM cutoff (r_s)")
    parser.add_argument("--theta", type=float, default=None, help="TreePM opening angle")
    parser.add_argument("--k-linear", type=float, default=0.04, help="h/Mpc")
    parser.add_argument("--scale-n-side", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2, help="scale: worker processes")
    parser.add_argument("--store", default=None,
                        help="scale: the Zarr body set written (ics-N.zarr here by default)")
    parser.add_argument("--sections", nargs="+", default=["ics", "growth"], choices=SECTIONS)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    out = {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d"), "results": []}
    for section in args.sections:
        out["results"].append({"ics": ics_section, "growth": growth_section,
                               "scale": scale_section}[section](args))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
