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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("periodic")
    parser.add_argument("meshfft")
    parser.add_argument("--n-side", type=int, default=1024)
    parser.add_argument("--cores", type=int, default=64)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(constants=c, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
