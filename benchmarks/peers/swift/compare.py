"""nbody_dask against SWIFT on the same cosmological IC file: P(k) and halo mass functions.

Writes 2LPT ICs (``--n-side`` cubed bodies in a ``--box`` Mpc/h box at ``--z-start``) to a
GADGET-layout HDF5 file, runs SWIFT (``swift --cosmology --self-gravity``) and nbody_dask
(``run --ic`` equivalent) on it to z = 0 with snapshots at z = 1 and 0, then measures both
codes' snapshots with nbody_dask's estimators: the power spectrum (TSC, interlacing, mesh
``2 n_side``) and FoF halos (b = 0.2, at least ``--min-members``). Prints and stores the ratio
of the spectra per shell up to ``--k-max`` h/Mpc, the mass functions per bin, and each code's
wall time and number of steps. See README.md beside this file.

    python benchmarks/peers/swift/compare.py --swift /path/to/swift --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import time
from pathlib import Path

import numpy as np

import nbody_dask
from nbody_dask.gadget import read_gadget, write_gadget
from nbody_dask.halos import mass_function

#: The cosmology both codes run: Planck 2018's parameters, flat, without radiation (as
#: SWIFT and GADGET integrate by default).
COSMOLOGY = {"H0": 67.66, "Om0": 0.30966, "Ob0": 0.04897, "Tcmb0": 0.0}
SIGMA8, N_S = 0.8102, 0.9665

SWIFT_PARAMETERS = """\
InternalUnitSystem:
  UnitMass_in_cgs:     1.98841e43
  UnitLength_in_cgs:   3.08567758e24
  UnitVelocity_in_cgs: 1e5
  UnitCurrent_in_cgs:  1
  UnitTemp_in_cgs:     1
Cosmology:
  Omega_cdm:      {omega_cdm}
  Omega_lambda:   {omega_lambda}
  Omega_b:        {omega_b}
  h:              {h}
  a_begin:        {a_begin}
  a_end:          1.0
TimeIntegration:
  dt_min:     1e-8
  dt_max:     {dlna}
Gravity:
  eta:          0.025
  MAC:          adaptive
  theta_cr:     0.7
  epsilon_fmm:  0.001
  comoving_DM_softening:     {softening}
  max_physical_DM_softening: {softening}
  mesh_side_length:       {mesh}
Snapshots:
  basename:            snap
  output_list_on:      1
  output_list:         outputs.txt
Statistics:
  delta_time:          1.02
  scale_factor_first:  {a_begin}
Scheduler:
  max_top_level_cells: 8
  cell_split_size:     64
InitialConditions:
  file_name:                   ics.hdf5
  periodic:                    1
  cleanup_h_factors:           1
  cleanup_velocity_factors:    1
"""


def run_swift(swift: str, workdir: Path, ics_a: float, args,
              redshifts: tuple = (1.0, 0.0)) -> dict:
    """Run SWIFT in ``workdir`` on its ``ics.hdf5`` to z = 0, with snapshots at
    ``redshifts``; its wall time, steps and snapshot files."""
    from nbody_dask.cosmology import as_cosmology

    c = as_cosmology(COSMOLOGY)
    h = float(c.h)
    (workdir / "outputs.txt").write_text(
        "# Redshift\n" + "".join(f"{z}\n" for z in redshifts))
    (workdir / "params.yml").write_text(SWIFT_PARAMETERS.format(
        omega_cdm=c.Om0 - c.Ob0, omega_lambda=1 - c.Om0, omega_b=c.Ob0, h=h, a_begin=ics_a,
        dlna=args.swift_dt_max, softening=args.softening * args.box / args.n_side / h,
        mesh=2 * args.n_side))  # SWIFT's internal lengths are Mpc, not Mpc/h
    start = time.perf_counter()
    proc = subprocess.run([swift, "--cosmology", "--self-gravity",
                           f"--threads={os.cpu_count()}", "params.yml"], cwd=workdir,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (workdir / "swift.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"SWIFT failed ({proc.returncode}); see {workdir / 'swift.log'}")
    steps = [int(m.group(1)) for m in re.finditer(r"^\s+(\d+)\s+\S+\s+\S+\s+\S+",
                                                  proc.stdout, re.M)]
    snaps = sorted(workdir.glob("snap_*.hdf5"))
    return {"seconds": seconds, "steps": max(steps) if steps else None,
            "snapshots": [str(p) for p in snaps]}


def measure(bodies, args) -> tuple:
    box = float(bodies.attrs["box_size"])
    pk = nbody_dask.power_spectrum(bodies, 2 * args.n_side, box_size=box)
    halos = nbody_dask.friends_of_friends(bodies, 0.2, args.min_members, box_size=box)
    return pk, halos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swift", required=True, help="the swift executable")
    parser.add_argument("--n-side", type=int, default=64)
    parser.add_argument("--box", type=float, default=128.0, help="Mpc/h")
    parser.add_argument("--z-start", type=float, default=49.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--softening", type=float, default=1 / 25,
                        help="comoving, in mean interparticle spacings")
    parser.add_argument("--plummer-factor", type=float, default=1.0,
                        help="nbody_dask's Plummer softening over SWIFT's Plummer-equivalent "
                             "one (SWIFT's is a Wendland C2 kernel, Newtonian beyond 3 of "
                             "its lengths; 0.6 matches its force best, README.md)")
    parser.add_argument("--dlna", type=float, default=0.02,
                        help="nbody_dask's step in ln a (a block's, with --timestep individual)")
    parser.add_argument("--timestep", choices=["global", "individual"], default="global",
                        help="nbody_dask's time steps")
    parser.add_argument("--time-bins", type=int, default=None,
                        help="nbody_dask's time bins (with --timestep individual)")
    parser.add_argument("--eta", type=float, default=None,
                        help="nbody_dask's time-step accuracy (with --timestep individual)")
    parser.add_argument("--swift-dt-max", type=float, default=0.01,
                        help="SWIFT's largest step (ln a)")
    parser.add_argument("--cutoff", type=float, default=None, help="nbody_dask's TreePM cutoff")
    parser.add_argument("--theta", type=float, default=None, help="nbody_dask's opening angle")
    parser.add_argument("--mesh-size", type=int, default=None,
                        help="nbody_dask's TreePM mesh")
    parser.add_argument("--split", type=float, default=None,
                        help="nbody_dask's TreePM split (mesh cells)")
    parser.add_argument("--min-members", type=int, default=100)
    parser.add_argument("--k-max", type=float, default=1.0, help="h/Mpc")
    parser.add_argument("--workdir", default="swift-compare")
    parser.add_argument("--reuse", action="store_true",
                        help="take the runs of an earlier call in --workdir")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    ics = nbody_dask.cosmological_ics(args.n_side, args.box, COSMOLOGY, z_start=args.z_start,
                                      seed=args.seed, sigma8=SIGMA8, n_s=N_S).compute()
    write_gadget(ics, workdir / "ics.hdf5", overwrite=True)
    a_start = float(ics.time)

    if args.reuse and (workdir / "result-swift.json").exists():
        swift = json.loads((workdir / "result-swift.json").read_text())
    else:
        swift = run_swift(args.swift, workdir, a_start, args)
        (workdir / "result-swift.json").write_text(json.dumps(swift))
    print(f"SWIFT: {swift['seconds']:.1f} s, {swift['steps']} steps")

    if args.reuse and (workdir / "result-nbody.json").exists():
        ours = json.loads((workdir / "result-nbody.json").read_text())
        traj = nbody_dask.open_trajectory(workdir / "nbody.zarr")
    else:
        bodies = read_gadget(workdir / "ics.hdf5")  # the same file, as nbody_dask reads it
        start = time.perf_counter()
        traj = nbody_dask.simulate(bodies, dt=args.dlna, snapshot_redshifts=[1.0],
                                   softening=args.plummer_factor * args.softening
                                   * args.box / args.n_side,
                                   dtype="float32", store=workdir / "nbody.zarr",
                                   overwrite=True, progress=False, cutoff=args.cutoff,
                                   theta=args.theta, mesh_size=args.mesh_size,
                                   split=args.split, timestep=args.timestep,
                                   time_bins=args.time_bins, eta=args.eta)
        ours = {"seconds": time.perf_counter() - start, "steps": int(traj.step[-1])}
        if args.timestep == "individual":
            ours["force_evaluations_per_body"] = float(traj.force_evaluations.sum()
                                                       / traj.sizes["body"])
        (workdir / "result-nbody.json").write_text(json.dumps(ours))
    print(f"nbody_dask: {ours['seconds']:.1f} s, {ours['steps']} steps")

    rows = []
    theirs = [read_gadget(p) for p in swift["snapshots"]]
    for z in (1.0, 0.0):
        mine = traj.sel(time=1 / (1 + z), method="nearest").load()
        other = min(theirs, key=lambda s: abs(float(s.time) - 1 / (1 + z)))
        (pk_a, halos_a), (pk_b, halos_b) = measure(mine, args), measure(other, args)
        k = pk_a.k.values
        shown = k <= args.k_max
        ratio = (pk_a.power.values / pk_b.power.values)[shown]
        edges = np.logspace(math.log10(min(halos_a.mass.min(), halos_b.mass.min())),
                            math.log10(max(halos_a.mass.max(), halos_b.mass.max())) + 1e-9,
                            7)
        hmf_a, hmf_b = mass_function(halos_a, edges), mass_function(halos_b, edges)
        row = {"z": z, "a_nbody_dask": float(mine.time), "a_swift": float(other.time),
               "k": k[shown].tolist(), "power_ratio": ratio.tolist(),
               "worst_power_ratio": float(np.abs(ratio - 1).max()),
               "halos": [int(halos_a.sizes["halo"]), int(halos_b.sizes["halo"])],
               "mass_bins": hmf_a.mass.values.tolist(),
               "counts": [hmf_a["count"].values.tolist(), hmf_b["count"].values.tolist()]}
        rows.append(row)
        print(f"z = {z}: P_nbody_dask / P_swift for k <= {args.k_max}: worst "
              f"{row['worst_power_ratio']:.3f}; halos {row['halos']}; counts per bin "
              f"{row['counts']}")
    out = {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d"), "args": vars(args), "swift": swift,
           "nbody_dask": ours, "results": rows}
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
