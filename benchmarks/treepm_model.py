"""A model of a TreePM step on a cluster, from constants measured on this machine.

    python benchmarks/treepm_model.py benchmarks/results/2026-12-06-periodic-262144-2core.json \\
        benchmarks/results/2026-12-06-meshfft-2core.json [--n-side 1024] [--json out.json]

A step costs

    t_step = t_short + t_mesh + t_fft + t_transpose + t_scheduler + t_latency + t_halo

- t_short = N c_short / (nodes cores): the short-range walks, ``c_short`` core-seconds a body
  (the benchmark's one-tile walk on its cores, uniform and clustered boxes);
- t_mesh = N c_mesh / (nodes cores): deposits and interpolations (serial kernels);
- t_fft = 4 M^3 log2(M^3) c_fft / (nodes cores): one forward and three inverse transforms of
  the M^3 mesh (M = 2 n_side by default), ``c_fft`` from one ``scipy.fft.rfftn`` of 512^3;
- t_transpose = 4 (4 M^3 bytes) (1 - 1/nodes) / nodes / bandwidth: each transform of the slab
  decomposition moves the complex half-spectrum (8 bytes a point, M^3 / 2 points) once
  across the network, at 100 Gb/s line rate;
- t_scheduler = s_task tasks: ``s_task`` = 472 us of scheduler CPU a task (docs/scaling.md),
  tasks from ``Plan.tasks_per_step``: the ``"pairs"`` layout with tiles of 1,048,576 bodies
  (a task per pair of near tiles), the ``"rows"`` layout with its own tiles (at least one a
  node, at most 8,388,608 bodies each; a task per tile walking its near tiles);
- t_latency = waves L, L = 5.2 ms (docs/scaling.md), 16 dependent rounds a step;
- t_halo = bytes / bandwidth: the neighbour tiles' trees a node fetches once a step (its
  tiles a cube of tiles; the shell one tile deep around it, 16 bytes a body).

With ``--cosmology-scale FILE`` (``benchmarks/cosmology.py --sections scale``'s results: 2LPT
ICs of n^3 bodies written to Zarr, and ``power_spectrum`` of them on an n^3 mesh, each timed
on this machine's cores) it also projects those two to ``--n-side`` and twice it on 16 and
64 nodes:

    t = T_measured cores (N / n)^3 [log2 N^3 / log2 n^3] / (nodes cores) + t_transpose

the measured core-seconds scaled by the points and the FFTs' log (an upper bound for the
per-body parts), spread over all cores, plus the transposes that the measurement made in
memory and a cluster makes across its network: the ICs' 14 distributed transforms (the
noise's, 3 first-order displacements, 6 second derivatives, the second-order source's, 3
second-order displacements) and the spectrum's 2 (a mesh and its interlaced twin), each
moving a complex128 half-spectrum (8 bytes a point) once, ``(1 - 1/nodes) / nodes`` of it a
node, at 100 Gb/s; and the scheduler's 472 us a task: the IC graph has 190 tasks a slab
(counted in its graph at 128^3 with 4 to 128 slabs: 1,088 to 24,092), the spectrum about
12 (2 deposits, 2 slab sums and 2 x 4 FFT tasks), slabs of 4,194,304 points. Writing the
bodies (56 bytes each) is in the measured time, at this machine's local disk.
"""

from __future__ import annotations

import argparse
import json
import math

from nbody_dask.plan import Plan, tree_tile_size

S_TASK = 472e-6  # scheduler CPU a task (docs/scaling.md, fitted)
LATENCY = 5.2e-3  # a dependent round trip (docs/scaling.md, fitted)
WAVES = 16  # drift, bounds, layout fetch, deposit, slab sums (2), FFT stages (6), long, short,
#             combine, kick
BANDWIDTH = 100e9 / 8  # bytes per second, 100 Gb/s
TILE = 1_048_576  # bodies a tile (the tree's largest tile in the "pairs" layout)


def constants(periodic: dict, meshfft: dict) -> dict:
    cores = periodic["cores"]
    out = {}
    for row in periodic["cost"]:
        n = row["n"]
        out[row["box"]] = dict(short=row["short_range"] * cores / n,
                               mesh=(row["deposit"] + row["interpolation"]) / n)
    big = max((r for r in meshfft["rows"] if r["chunks"] == [1, 1]), key=lambda r: r["n"])
    points = big["n"] ** 3
    out["fft"] = big["scipy_seconds"] * meshfft["cores"] / (points * math.log2(points))
    return out


def project(c: dict, box: str, n_side: int, nodes: int, cores: int, layout: str) -> dict:
    n = n_side**3
    tile = TILE if layout == "pairs" else tree_tile_size(n, nodes * cores, nodes, "rows")
    plan = Plan(n=n, steps=10, dt=0.01, method="treepm", box_size=1.0, tile_size=tile,
                dtype="float32", layout=layout)
    m = plan.mesh_size
    all_cores = nodes * cores
    short = n * c[box]["short"] / all_cores
    mesh = n * c[box]["mesh"] / all_cores
    fft = 4 * m**3 * math.log2(m**3) * c["fft"] / all_cores
    transpose = 4 * (4 * m**3) * (1 - 1 / nodes) / nodes / BANDWIDTH
    tasks = plan.tasks_per_step()
    scheduler = S_TASK * tasks
    latency = WAVES * LATENCY
    per_node = plan.n_tiles / nodes
    side = per_node ** (1 / 3)
    shell = (side + 2) ** 3 - per_node if nodes > 1 else 0
    halo = shell * tile * 16 / BANDWIDTH
    terms = dict(short=short, mesh=mesh, fft=fft, transpose=transpose, scheduler=scheduler,
                 latency=latency, halo=halo)
    return dict(box=box, layout=layout, n=n, nodes=nodes, cores=cores, mesh_size=m,
                slabs=plan.mesh_slabs,
                tiles=plan.n_tiles, tasks=tasks, **terms, step=sum(terms.values()),
                dominant=max(terms, key=terms.get))


IC_TRANSFORMS = 14  # distributed FFTs in cosmological_ics's graph (the docstring)
POWER_TRANSFORMS = 2  # power_spectrum: the mesh and its interlaced twin
IC_TASKS_A_SLAB = 190  # counted in the IC graph
POWER_TASKS_A_SLAB = 12  # from the spectrum's graph structure
SLAB_POINTS = 1 << 22  # points a slab (nbody_dask.lpt and power)


def project_cosmology(scale: dict, n_side: int, nodes: int, cores: int) -> dict:
    """The ICs' and the spectrum's projected wall time for ``n_side^3`` bodies (a mesh of
    ``n_side^3`` for the spectrum) from ``scale``, a row of ``cosmology.py``'s scale
    section measured on ``scale_cores`` cores (module docstring)."""
    n0, measured_cores = scale["n_side"], scale["cores"]
    grow = (n_side / n0) ** 3 * math.log2(n_side**3) / math.log2(n0**3)
    all_cores = nodes * cores
    share = (1 - 1 / nodes) / nodes
    slabs = min(n_side, -(-n_side**3 // SLAB_POINTS))
    out = dict(n_side=n_side, nodes=nodes, cores=cores, slabs=slabs)
    for name, seconds, transforms, tasks in (
            ("ics", scale["ics_seconds"], IC_TRANSFORMS, IC_TASKS_A_SLAB * slabs),
            ("power", scale["power_seconds"], POWER_TRANSFORMS, POWER_TASKS_A_SLAB * slabs)):
        compute = seconds * measured_cores * grow / all_cores
        transpose = transforms * 8 * n_side**3 * share / BANDWIDTH
        scheduler = S_TASK * tasks
        out[name] = dict(compute=compute, transpose=transpose, tasks=tasks,
                         scheduler=scheduler, total=compute + transpose + scheduler)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("periodic")
    parser.add_argument("meshfft")
    parser.add_argument("--n-side", type=int, default=1024)
    parser.add_argument("--cores", type=int, default=64)
    parser.add_argument("--cosmology-scale", default=None,
                        help="benchmarks/cosmology.py's scale results: project the ICs and "
                             "the spectrum too")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with open(args.periodic) as f:
        periodic = json.load(f)
    with open(args.meshfft) as f:
        meshfft = json.load(f)
    c = constants(periodic, meshfft)
    print(f"constants: short {c['uniform']['short']:.3g} (uniform) / "
          f"{c['clustered']['short']:.3g} (clustered) core-s a body, mesh "
          f"{c['uniform']['mesh']:.3g} s a body, FFT {c['fft']:.3g} core-s a point-log")
    rows = [project(c, box, args.n_side, nodes, args.cores, layout)
            for box in ("uniform", "clustered") for nodes in (16, 64)
            for layout in ("pairs", "rows")]
    keys = ("short", "mesh", "fft", "transpose", "scheduler", "latency", "halo", "step")
    print("| box | layout | nodes | tiles | tasks | " + " | ".join(keys) + " | dominant |")
    print("|---" * (len(keys) + 6) + "|")
    for r in rows:
        print(f"| {r['box']} | {r['layout']} | {r['nodes']} | {r['tiles']} | {r['tasks']:,} | "
              + " | ".join(f"{r[k]:.3g}" for k in keys) + f" | {r['dominant']} |")
    cosmology_rows = []
    if args.cosmology_scale:
        with open(args.cosmology_scale) as f:
            measured = json.load(f)
        scale = next(r for r in measured["results"] if r["section"] == "scale")
        scale = {**scale, "cores": measured["cores"]}
        print(f"\nfrom {scale['n_side']}^3 on {scale['cores']} cores: ICs "
              f"{scale['ics_seconds']:.1f} s, power spectrum {scale['power_seconds']:.1f} s")
        parts = ("compute", "transpose", "scheduler", "total")
        print("| bodies | nodes | ICs: compute | transposes | scheduler | total | spectrum: "
              "compute | transposes | scheduler | total |")
        print("|---" * 10 + "|")
        for n_side in (args.n_side, 2 * args.n_side):
            for nodes in (16, 64):
                r = project_cosmology(scale, n_side, nodes, args.cores)
                cosmology_rows.append(r)
                print(f"| {n_side}^3 | {nodes} | " + " | ".join(
                    f"{r[part][k]:.3g}" for part in ("ics", "power")
                    for k in parts) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(constants=c, rows=rows, cosmology=cosmology_rows), f, indent=1)


if __name__ == "__main__":
    main()
