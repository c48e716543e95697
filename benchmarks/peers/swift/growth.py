"""Linear growth in SWIFT and nbody_dask on the same fixed-amplitude IC file.

The linear-growth check of ``benchmarks/cosmology.py`` (64^3 bodies in 500 Mpc/h from
z = 49, the power of each shell at z = 3, 1 and 0 over its power in the ICs, divided by
``[D(z) / D(z_start)]^2``) run by both codes on one GADGET-layout file: fixed-amplitude
2LPT ICs on a grid, the flat cosmology without radiation that both integrate
(``compare.COSMOLOGY``). Both codes' snapshots are measured with nbody_dask's
``power_spectrum`` (TSC, interlacing, a mesh of twice the grid), so a deficit both show
belongs to the bodies (a lattice's modes off its axes grow more slowly than a fluid's),
and one only nbody_dask shows to its force or integration. ``--settings`` runs nbody_dask
once per setting (``default``, or ``key=value`` pairs of ``simulate`` such as
``cutoff=6,theta=0.3`` or ``method=direct,dtype=float64``: the Ewald sum, exact for the
bodies, for small sets).

    python benchmarks/peers/swift/growth.py --swift /path/to/swift --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import nbody_dask
from nbody_dask.cosmology import Background
from nbody_dask.gadget import read_gadget, write_gadget

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import COSMOLOGY, N_S, SIGMA8, run_swift  # noqa: E402

REDSHIFTS = (3.0, 1.0, 0.0)


def growth_ratios(snapshots, box: float, mesh: int) -> tuple:
    """Each later snapshot's power per shell over the first's, divided by the squared
    ratio of the linear growth factor: the shells' ``k`` and one row per later snapshot."""
    spectra = [nbody_dask.power_spectrum(s[["position", "mass"]], mesh, box_size=box)
               for s in snapshots]
    a = np.array([float(s.time) for s in snapshots])
    d1 = Background(COSMOLOGY).growth(a).d1
    ratios = np.array([s.power.values / spectra[0].power.values for s in spectra[1:]])
    return spectra[0].k.values, ratios / ((d1[1:] / d1[0])[:, None] ** 2), a


def parse_setting(text: str) -> dict:
    """``"default"`` or ``"key=value,key=value"`` as keyword arguments of ``simulate``
    (numbers where they parse as numbers)."""
    if text == "default":
        return {}
    out = {}
    for item in text.split(","):
        key, value = item.split("=")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out


def run_nbody_dask(bodies, args, setting: dict, store: Path) -> tuple:
    """nbody_dask's run of ``bodies`` to z = 0 with snapshots at ``args.redshifts``: its
    wall time and steps, and the snapshots."""
    options = {"dtype": "float32", **setting}
    start = time.perf_counter()
    traj = nbody_dask.simulate(bodies, dt=args.dlna,
                               snapshot_redshifts=[z for z in args.redshifts if z > 0],
                               softening=args.softening * args.box / args.n_side,
                               store=store, overwrite=True, progress=False, **options)
    run = {"seconds": time.perf_counter() - start, "steps": int(traj.step[-1])}
    return run, [traj.sel(time=1 / (1 + z), method="nearest").load() for z in args.redshifts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swift", required=True, help="the swift executable")
    parser.add_argument("--n-side", type=int, default=64)
    parser.add_argument("--box", type=float, default=500.0, help="Mpc/h")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--softening", type=float, default=1 / 25,
                        help="comoving, in mean interparticle spacings")
    parser.add_argument("--dlna", type=float, default=0.05,
                        help="nbody_dask's largest step in ln a")
    parser.add_argument("--swift-dt-max", type=float, default=0.01,
                        help="SWIFT's largest step (ln a)")
    parser.add_argument("--k-linear", type=float, default=0.04, help="h/Mpc")
    parser.add_argument("--k-max", type=float, default=0.1, help="h/Mpc, the shells shown")
    parser.add_argument("--redshifts", type=float, nargs="+", default=list(REDSHIFTS),
                        help="the snapshots compared (the last is 0)")
    parser.add_argument("--settings", nargs="+", default=["default"],
                        help="nbody_dask's runs: default, or key=value,... of simulate")
    parser.add_argument("--workdir", default="swift-growth")
    parser.add_argument("--reuse", action="store_true",
                        help="take SWIFT's run of an earlier call in --workdir")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    if args.redshifts[-1] != 0:
        parser.error("--redshifts must end with 0")

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    ics = nbody_dask.cosmological_ics(args.n_side, args.box, COSMOLOGY, z_start=49,
                                      seed=args.seed, sigma8=SIGMA8, n_s=N_S,
                                      fixed_amplitude=True).compute()
    write_gadget(ics, workdir / "ics.hdf5", overwrite=True)
    start_bodies = read_gadget(workdir / "ics.hdf5")

    if args.reuse and (workdir / "result-swift.json").exists():
        swift = json.loads((workdir / "result-swift.json").read_text())
    else:
        swift = run_swift(args.swift, workdir, float(start_bodies.time), args,
                          redshifts=tuple(args.redshifts))
        (workdir / "result-swift.json").write_text(json.dumps(swift))
    print(f"SWIFT: {swift['seconds']:.1f} s, {swift['steps']} steps")

    theirs = [read_gadget(p) for p in swift["snapshots"]]
    theirs = [min(theirs, key=lambda s, z=z: abs(float(s.time) - 1 / (1 + z)))
              for z in args.redshifts]
    mesh = 2 * args.n_side
    k, swift_ratio, a_swift = growth_ratios([start_bodies, *theirs], args.box, mesh)
    shown, linear = k <= args.k_max, k < args.k_linear

    def rows(ratio):
        return {str(z): r[shown].tolist() for z, r in zip(args.redshifts, ratio, strict=True)}

    out = {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d"), "args": vars(args), "k": k[shown].tolist(),
           "swift": {**swift, "a": a_swift.tolist(), "ratio": rows(swift_ratio),
                     "worst_linear": float(np.abs(swift_ratio[:, linear] - 1).max())},
           "nbody_dask": []}
    print("k (h/Mpc):       " + " ".join(f"{x:7.4f}" for x in k[shown]))
    for text in args.settings:
        run, mine = run_nbody_dask(start_bodies, args, parse_setting(text),
                                   workdir / "nbody.zarr")
        _, ratio, a_ours = growth_ratios([start_bodies, *mine], args.box, mesh)
        out["nbody_dask"].append({"setting": text, **run, "a": a_ours.tolist(),
                                  "ratio": rows(ratio),
                                  "worst_linear": float(np.abs(ratio[:, linear] - 1).max())})
        print(f"nbody_dask {text}: {run['seconds']:.1f} s, {run['steps']} steps")
        for i, z in enumerate(args.redshifts):
            print(f"z = {z}: nbody_dask " + " ".join(f"{x:7.4f}" for x in ratio[i][shown]))
            print("        SWIFT      " + " ".join(f"{x:7.4f}" for x in swift_ratio[i][shown]))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
