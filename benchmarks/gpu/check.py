"""The GPU check of issue 5, as one script for a device machine lent for a few minutes.

    bash benchmarks/gpu/wheels.sh                           # here: wheels the image lacks
    # device tool: run(command="bash benchmarks/gpu/device-check.sh", carry=[".whl"])
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/gpu/check.py --quick   # the script, no GPU

1. The CUDA kernel against the CPU kernel for every launch shape of
   ``kernels.cuda.VARIANTS``, both dtypes, the potential on and off, lengths that fill no
   block; and the float32 GPU result against the independent float64 direct sum.
2. ``simulate(backend="cuda")`` against ``backend="cpu"`` from the same bodies.
3. Kernel Gint/s and TFLOPS (20 FLOP per interaction) at N x N for every launch shape, the
   tiles already on the device, and the share of the H200's FP32 peak (~67 TFLOPS); then the
   default shape on target tiles of N/64, N/16 and N/4 (how small a GPU tile may be), and
   float64.
4. ``simulate()`` steady state at N with ``backend="cuda"`` (differential timing); then
   individual time steps (each criterion) on a 16,384-body Hernquist cusp on the GPU and
   on the CPUs: the same bins, the positions, both wall times.
5. TreePM's short range (``kernels.cuda.short_pair_forces``) against the CPU's pair kernel
   (``kernels.shortrange.short_p2p``), both dtypes; its rate in pairs a second at N x N
   (every pair evaluated, minimum image and split factors included); one TreePM evaluation
   of N uniform random bodies with ``backend="cuda"`` (pairs of near tiles on the GPU) and
   ``"cpu"`` (the walk), timed.

Prints one line per result and writes everything as JSON (``--json``). Exits non-zero if a
correctness check fails, after printing what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

FP32_PEAK_TFLOPS = 67.0  # H200 SXM, dense FP32 without tensor cores


def _quick_variants() -> tuple[tuple[int, int], ...]:
    """The launch shapes --quick checks and times: the first, and the one with the most
    targets a thread in the smallest block (the simulator runs a Python thread per CUDA
    thread, so a block of 256 costs it four times one of 64)."""
    from nbody_dask.kernels import cuda

    return cuda.VARIANTS[0], min(cuda.VARIANTS, key=lambda v: (-v[1], v[0]))


def _kernel_agreement(quick: bool) -> list[dict]:
    from nbody_dask.kernels import cpu, cuda
    from nbody_dask.testing import direct_sum_reference

    sizes = ((40, 20),) if quick else ((1, 1), (31, 31), (200, 200), (4097, 70_001))
    # --quick checks two launch shapes once (tests/test_cuda.py checks an odd one)
    variants = _quick_variants() if quick else cuda.VARIANTS
    dtypes = (np.float64,) if quick else (np.float32, np.float64)
    potentials = (True,) if quick else (False, True)
    rng = np.random.default_rng(5)
    rows = []
    for block, per_thread in variants:
        for nt, ns in sizes:
            pt, ps, ms = rng.random((3, nt)), rng.random((3, ns)), rng.random(ns) / ns
            for dtype in dtypes:
                t, s, m = pt.astype(dtype), ps.astype(dtype), ms.astype(dtype)
                for potential in potentials:
                    g = cuda.tile_pair_forces(t, s, m, dtype(1e-4), potential, block=block,
                                              per_thread=per_thread)
                    c = cpu.tile_pair_forces(t, s, m, dtype(1e-4), potential)
                    scale = np.abs(c).max(axis=1, keepdims=True) + m.max() / 1e-2
                    err = float((np.abs(g - c) / scale).max())
                    row = {"check": "cuda-vs-cpu", "block": block, "per_thread": per_thread,
                           "nt": nt, "ns": ns, "dtype": np.dtype(dtype).name,
                           "potential": potential, "max_rel_err": err}
                    if dtype == np.float64:
                        row.update(tol=1e-13, ok=err <= 1e-13)
                    else:
                        # float32 sums in another order differ by round-off growing with the
                        # source count: both kernels are held against the float64 sum of the
                        # same (float32) inputs, and the GPU may be at most twice as far off
                        # as the CPU kernel (floor 2e-6).
                        exact = cpu.tile_pair_forces(t.astype(np.float64), s.astype(np.float64),
                                                     m.astype(np.float64), 1e-4, potential)
                        gpu = float((np.abs(g - exact) / scale).max())
                        host = float((np.abs(c - exact) / scale).max())
                        tol = max(2 * host, 2e-6)
                        row.update(gpu_vs_float64=gpu, cpu_vs_float64=host, tol=tol,
                                   ok=gpu <= tol)
                    rows.append(row)
    # the CPU kernel's own tolerances (tests/test_kernels.py): per-body relative error against
    # the float64 sum of the same float32-rounded inputs, max <= 1e-4 and median <= 1e-6
    n = 128 if quick else 4096
    pos = rng.standard_normal((n, 3)).astype(np.float32)
    mass = np.full(n, 1.0 / n, dtype=np.float32)
    eps2 = np.float32(1e-4)
    ref, _ = direct_sum_reference(pos.astype(np.float64), mass.astype(np.float64),
                                      softening=float(np.sqrt(eps2)))
    p32 = np.ascontiguousarray(pos.T)
    results = {"gpu": cuda.tile_pair_forces(p32, p32, mass, eps2, False, diagonal=True).T,
               "cpu": cpu.tile_pair_forces(p32, p32, mass, eps2, False, diagonal=True).T}
    row = {"check": "cuda-float32-vs-float64-reference", "n": n, "tol_max": 1e-4,
           "tol_median": 1e-6}
    for name, acc in results.items():
        err = np.linalg.norm(acc - ref, axis=1) / np.linalg.norm(ref, axis=1)
        row[f"{name}_max_rel_err"] = float(err.max())
        row[f"{name}_median_rel_err"] = float(np.median(err))
    row["max_rel_err"] = row["gpu_max_rel_err"]
    row["ok"] = row["gpu_max_rel_err"] <= 1e-4 and row["gpu_median_rel_err"] <= 1e-6
    rows.append(row)
    return rows


def _simulate_agreement(quick: bool) -> dict:
    import nbody_dask

    n, steps = (64, 4) if quick else (8192, 50)
    bodies = nbody_dask.plummer(n, seed=1)
    runs = {b: nbody_dask.simulate(bodies, steps=steps, dt=1 / 256, softening=0.01,
                                   dtype="float64", backend=b, progress=False)
            for b in ("cpu", "cuda")}
    final = {b: r.position.isel(time=-1).values for b, r in runs.items()}
    err = float(np.abs(final["cuda"] - final["cpu"]).max())
    energy = runs["cuda"].total_energy.values
    drift = float(np.abs(energy / energy[0] - 1).max())
    return {"check": "simulate-cuda-vs-cpu", "n": n, "steps": steps, "dtype": "float64",
            "max_abs_position_diff": err, "cuda_energy_error": drift, "tol": 1e-9,
            "ok": err <= 1e-9}


def _individual_steps(quick: bool, criterion: str) -> dict:
    """Individual time steps (direct summation, by ``criterion``) on the GPU against the
    CPU: the same bins, positions to round-off (float64), and both runs' wall times."""
    from distributed import Client, LocalCluster

    import nbody_dask

    n, tile = (60, 40) if quick else (16_384, None)
    bodies = nbody_dask.hernquist(n, seed=1)
    kw = dict(steps=2, dt=1 / 64, softening=0.004, dtype="float64", tile_size=tile,
              timestep="individual", time_bins=6, step_criterion=criterion, progress=False)
    if quick:  # the simulator: a few ticks
        kw.update(steps=1, time_bins=4, eta=0.02 if criterion == "pairwise" else None)
    # the simulator runs one kernel at a time: one worker thread there
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                           dashboard_address=None) if quick else LocalCluster()
    runs, seconds = {}, {}
    with cluster, Client(cluster) as client:
        for backend in ("cpu", "cuda"):
            t0 = time.perf_counter()
            runs[backend] = nbody_dask.simulate(bodies, backend=backend, client=client, **kw)
            seconds[backend] = time.perf_counter() - t0
    err = float(np.abs(runs["cuda"].position.values - runs["cpu"].position.values).max())
    same_bins = bool((runs["cuda"].time_bin.values == runs["cpu"].time_bin.values).all())
    return {"check": f"individual-steps-{criterion}-cuda-vs-cpu", "n": n, "dtype": "float64",
            "max_abs_position_diff": err, "same_bins": same_bins,
            "force_evaluations": float(runs["cuda"].force_evaluations.values[1:].sum()),
            "cpu_seconds": seconds["cpu"], "cuda_seconds": seconds["cuda"], "tol": 1e-9,
            "ok": err <= 1e-9 and same_bins}


def _short_range_agreement(quick: bool) -> dict:
    from nbody_dask.kernels import cuda, shortrange

    rng = np.random.default_rng(9)
    box, split, cutoff = 1.0, 0.02, 0.1
    worst = {}
    for nt, ns in ((40, 60),) if quick else ((1, 1), (300, 5000), (4097, 20_001)):
        t, s, m = rng.random((3, nt)), rng.random((3, ns)), rng.random(ns) / ns
        for dtype in (np.float32, np.float64):
            law = shortrange.walk_constants(box, split, cutoff, dtype)
            tt, ss, mm, eps2 = t.astype(dtype), s.astype(dtype), m.astype(dtype), dtype(1e-6)
            host = np.zeros((4, nt), dtype=dtype)
            shortrange.short_p2p(*tt, *ss, mm, eps2, law, host)
            gpu = cuda.short_pair_forces(tuple(tt), tuple(ss), mm, eps2, box, split, cutoff,
                                         True)
            err = float(np.abs(gpu - host).max() / max(np.abs(host).max(), 1e-300))
            name = np.dtype(dtype).name
            worst[name] = max(worst.get(name, 0.0), err)
    ok = worst["float64"] <= 1e-12 and worst["float32"] <= 1e-5
    return {"check": "short-range-cuda-vs-cpu", "max_rel_err": worst, "ok": ok,
            "tol": {"float64": 1e-12, "float32": 1e-5}}


def _short_range_rates(n: int, quick: bool) -> list[dict]:
    import nbody_dask
    from nbody_dask.kernels import cuda

    rng = np.random.default_rng(11)
    pos = rng.random((3, n)).astype(np.float32)
    mass = np.full(n, 1.0 / n, dtype=np.float32)
    coords = tuple(pos)
    args = (coords, coords, mass, np.float32(1e-8), 1.0, 0.02, 0.1, False)
    cuda.short_pair_forces(*args)  # compile, and the tiles onto the device
    reps = 1 if quick else 5
    start = time.perf_counter()
    for _ in range(reps):
        cuda.short_pair_forces(*args)
    seconds = (time.perf_counter() - start) / reps
    rows = [{"kind": "short-range", "backend": "cuda", "n": n, "seconds": seconds,
             "gpairs_s": n * n / seconds / 1e9}]
    x = rng.random((n, 3))
    bodies = nbody_dask.make_bodies(x, np.zeros_like(x), np.full(n, 1.0 / n))
    with nbody_dask.clusters.client_context(None) as client:  # one cluster for both
        for backend in ("cpu", "cuda"):
            kw = dict(box_size=1.0, method="treepm", dtype="float32", backend=backend,
                      client=client)
            nbody_dask.accelerations(bodies, **kw)
            start = time.perf_counter()
            nbody_dask.accelerations(bodies, **kw)
            rows.append({"kind": "treepm-evaluation", "backend": backend, "n": n,
                         "seconds": time.perf_counter() - start})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="sizes for Numba's CUDA simulator (tests this script)")
    parser.add_argument("--n", type=int, default=None, help="N of the rate measurements")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    n = args.n or (64 if args.quick else 262_144)

    import numba
    from numba import cuda as numba_cuda

    from nbody_dask import benchmark
    from nbody_dask.kernels import cuda

    if not cuda.available():
        print("no CUDA device (and no simulator): nothing to check", file=sys.stderr)
        return 2
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    device = "simulator" if simulator else numba_cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else str(device)
    out = {"device": device, "numba": numba.__version__, "python": platform.python_version(),
           "n": n, "results": []}

    def report(row: dict) -> None:
        out["results"].append(row)
        print(json.dumps(row), flush=True)

    t0 = time.perf_counter()
    agreement = _kernel_agreement(args.quick)
    failed = [r for r in agreement if not r["ok"]]
    report({"check": "cuda-vs-cpu (all)", "cases": len(agreement), "failed": failed,
            "worst": max(r["max_rel_err"] for r in agreement), "ok": not failed,
            "seconds": time.perf_counter() - t0})
    report(_simulate_agreement(args.quick))
    def report_rate(rate: dict) -> None:
        rate["tflops"] = rate["gint_s"]["gflops"] / 1e3
        rate["share_of_fp32_peak"] = rate["tflops"] / FP32_PEAK_TFLOPS
        report(rate)

    # --quick times two shapes (the agreement above checked every one)
    variants = _quick_variants() if args.quick else cuda.VARIANTS
    for rate in benchmark.cuda_variants(n, reps=1 if args.quick else 5, variants=variants):
        report_rate(rate)
    # the target tile a simulate() pair task sees (auto_tile_size: >= 65,536 on GPUs); a GPU
    # needs ~2,048 threads per SM to hide latency: 132 SMs x 2,048 = 270k targets at 1/thread
    for nt in (n // 64, n // 16, n // 4):
        report_rate(benchmark.kernel_rate(nt, n, reps=1 if args.quick else 5, backend="cuda"))
    if not args.quick:
        report(benchmark.kernel_rate(65_536, 65_536, dtype="float64", backend="cuda"))
    steps, every = (4, 2) if args.quick else (30, 10)
    report(benchmark.simulate_rate(n, steps=steps, snapshot_every=every, dtype="float32",
                                   backend="cuda"))
    for criterion in ("pairwise", "acceleration"):
        report(_individual_steps(args.quick, criterion))
    report(_short_range_agreement(args.quick))
    for row in _short_range_rates(n, args.quick):
        report(row)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if all(r.get("ok", True) for r in out["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
