"""Throughput measurements: the tile-pair kernel alone, and simulate() in steady state.

Rates are interactions per second (N^2 per force evaluation) and GFLOPS by the 20-FLOP
convention. When the C reference kernel of ``shared/bench`` is found (or a path is given),
it is measured in the same run and each rate is also reported as a ratio to it: this machine
is shared and noisy, so only ratios measured together mean much.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["kernel_rate", "kernel_sweep", "cuda_variants", "simulate_rate", "scaling",
           "scaling_table", "reference_rate", "find_reference", "force_evaluation",
           "pytreegrav_evaluation", "best_of"]

FLOP_PER_INTERACTION = 20


def _stats(rates: list[float]) -> dict[str, float]:
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
            "gflops": FLOP_PER_INTERACTION * statistics.median(rates)}


def _call_rates(call, interactions: int, reps: int, min_seconds: float = 0.05) -> list[float]:
    """Gint/s of ``reps`` timings of ``call``, each repeating it for at least ``min_seconds``
    (one call of a small tile lasts ~0.3 ms: too short for one clock reading). The first
    call compiles or loads the kernel and is not timed; the second sizes the repetitions,
    and is the first timing when it lasts ``min_seconds`` already."""
    call()
    t0 = time.perf_counter()
    call()
    seconds = time.perf_counter() - t0
    calls = max(1, math.ceil(min_seconds / max(seconds, 1e-6)))
    rates = [interactions / seconds / 1e9] if seconds >= min_seconds else []
    while len(rates) < reps:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        rates.append(calls * interactions / (time.perf_counter() - t0) / 1e9)
    return rates


def kernel_rate(n_targets: int = 4096, n_sources: int = 65536, dtype: str = "float32",
                reps: int = 5, seed: int = 0, backend: str = "cpu",
                launch: dict[str, int] | None = None) -> dict[str, Any]:
    """One tile pair, in this process: Gint/s of the ``tile_pair_forces`` kernel of ``backend``.

    The CPU kernel runs on one thread. The CUDA timing is what a pair task pays on a worker
    whose device cache already holds both tiles: the kernel and the copy of the result back;
    ``launch`` (``block``, ``per_thread``) chooses its launch shape.
    """
    from .backends import tile_kernels

    tile_pair_forces = tile_kernels(backend).tile_pair_forces

    ftype = np.dtype(dtype).type
    rng = np.random.default_rng(seed)
    bodies = rng.random((3, max(n_targets, n_sources))).astype(ftype)
    sources = np.ascontiguousarray(bodies[:, :n_sources])
    targets = np.ascontiguousarray(bodies[:, :n_targets])  # the sources overlap the targets
    ms = np.full(n_sources, 1.0 / n_sources, ftype)
    eps2 = ftype(1e-4)
    rates = _call_rates(partial(tile_pair_forces, targets, sources, ms, eps2, False,
                                **(launch or {})), n_targets * n_sources, reps)
    return {"kind": "kernel", "backend": backend, "dtype": dtype, "n_targets": n_targets,
            "n_sources": n_sources, "threads": 1, **(launch or {}), "gint_s": _stats(rates)}


def cuda_variants(n: int = 262_144, dtype: str = "float32", reps: int = 5,
                  variants: Sequence[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """:func:`kernel_rate` of the CUDA kernel at ``n x n`` for each launch shape of
    ``variants`` (threads per block, targets per thread; default
    :data:`nbody_dask.kernels.cuda.VARIANTS`)."""
    from .kernels import cuda

    return [kernel_rate(n, n, dtype=dtype, reps=reps, backend="cuda",
                        launch={"block": block, "per_thread": per_thread})
            for block, per_thread in (cuda.VARIANTS if variants is None else variants)]


def simulate_rate(n: int, steps: int = 30, dtype: str = "float32", snapshot_every: int = 10,
                  tile_size: int | None = None, client: Any = None,
                  store_dir: str | Path | None = None, backend: str = "auto",
                  reps: int = 1, method: str = "direct") -> dict[str, Any]:
    """Steady-state time per step of :func:`nbody_dask.simulate`, snapshots included.

    ``method`` is simulate()'s (for the tree, ``gint_s`` is the effective rate: N² over the
    time of a step, comparable with direct summation's).

    Differential timing: the wall time of a run of ``steps`` steps minus that of a run of
    ``snapshot_every`` steps (same cluster, same start-up, compiled kernels, initial force
    evaluation and final snapshot), divided by the difference in steps. Callbacks at
    snapshot commits would not do: the driver submits many steps ahead, so commits can
    arrive in bursts. ``reps`` repeats the pair of runs (median and spread reported). If
    the steps cost less than the noise of a run (tiny N), the time is NaN.
    """
    import tempfile

    from .initial_conditions import plummer
    from .simulation import simulate
    from .clusters import client_context

    if steps < 2 * snapshot_every:
        raise ValueError(f"steps must be >= 2 * snapshot_every = {2 * snapshot_every}, "
                         f"got {steps}")
    bodies = plummer(n, seed=0)
    per_step = []
    with client_context(client) as c, tempfile.TemporaryDirectory(dir=store_dir) as tmp:
        def run(k: int, name: str) -> tuple[float, Any]:
            t0 = time.perf_counter()
            traj = simulate(bodies, steps=k, dt=1 / 256, softening=0.01,
                            store=Path(tmp) / name, snapshot_every=snapshot_every,
                            dtype=dtype, tile_size=tile_size, client=c, progress=False,
                            backend=backend, overwrite=True, method=method)
            return time.perf_counter() - t0, traj

        run(snapshot_every, "warm.zarr")  # compile, fill caches
        for _ in range(reps):
            short, _ = run(snapshot_every, "short.zarr")
            long, traj = run(steps, "long.zarr")
            per_step.append((long - short) / (steps - snapshot_every))
        threads = sum(c.nthreads().values())
        workers = len(c.nthreads())
    seconds = statistics.median(per_step)
    if not seconds > 0:  # the steps cost less than the runs' noise: say so, never a negative
        seconds = math.nan
    rate = n * n / seconds / 1e9
    return {"kind": "simulate", "method": traj.attrs.get("method", "direct"),
            "backend": traj.attrs["backend"], "dtype": dtype, "n": n,
            "tile_size": traj.attrs["tile_size"], "symmetric": bool(traj.attrs["symmetric"]),
            "threads": threads, "workers": workers,
            "steps": steps, "timed_steps": steps - snapshot_every,
            "snapshot_every": snapshot_every, "reps": reps,
            "seconds_per_step": seconds, "seconds_per_step_min": min(per_step),
            "seconds_per_step_max": max(per_step), "gint_s": rate,
            "gflops": FLOP_PER_INTERACTION * rate}


def best_of(reps: int, call) -> tuple[float, Any]:
    """The shortest of ``reps`` timings of ``call()``, and its last result."""
    best, out = math.inf, None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = call()
        best = min(best, time.perf_counter() - t0)
    return best, out


def force_evaluation(n: int, method: str = "tree", theta: float | None = None,
                     dtype: str = "float32", client: Any = None, reps: int = 2,
                     seed: int = 1) -> dict[str, Any]:
    """One force evaluation of a Plummer sphere of ``n`` bodies (ε = 0) through
    :func:`nbody_dask.accelerations` on ``client`` (the default local cluster if None): the
    best of ``reps`` times after a warm-up, and the relative force errors against a float64
    direct sum on 1,000 targets (:func:`nbody_dask.accuracy.force_errors`)."""
    from .evaluate import accelerations
    from .initial_conditions import plummer
    from .accuracy import force_errors
    from .clusters import client_context

    bodies = plummer(n, seed=seed)
    with client_context(client) as c:
        def evaluate():
            return accelerations(bodies, method=method, theta=theta, dtype=dtype, client=c)

        evaluate()  # compile, scatter once
        seconds, acc = best_of(reps, evaluate)
    return {"kind": "evaluation", "n": n, "method": method, "theta": theta, "dtype": dtype,
            "seconds": seconds, **force_errors(bodies, acc).as_dict()}


def pytreegrav_evaluation(n: int, theta: float = 0.7, reps: int = 1,
                          seed: int = 1) -> dict[str, Any] | None:
    """:func:`force_evaluation`'s bodies through pytreegrav's ``Accel(method="tree",
    parallel=True)`` (float64, its own default accuracy at ``theta=0.7``): time and errors.
    None when pytreegrav is not installed (``pip install 'nbody-dask[bench]'``)."""
    try:
        from pytreegrav import Accel
    except ImportError:
        return None

    from .initial_conditions import plummer
    from .accuracy import force_errors

    bodies = plummer(n, seed=seed)
    position, mass = bodies.position.values, bodies.mass.values
    Accel(position[:1000].copy(), mass[:1000], theta=theta, method="tree", parallel=True)
    seconds, acc = best_of(reps, lambda: Accel(position.copy(), mass, theta=theta,
                                                method="tree", parallel=True))
    return {"kind": "pytreegrav", "n": n, "theta": theta, "seconds": seconds,
            **force_errors(bodies, acc).as_dict()}


def find_reference(path: str | Path | None = None) -> Any | None:
    """Import ``refbench`` from ``path`` or the project's ``../shared/bench``, if present."""
    candidates = [Path(path)] if path else [Path.cwd() / ".." / "shared" / "bench",
                                            Path(__file__).resolve().parents[2] / "shared"
                                            / "bench"]
    for folder in candidates:
        module = folder / "refbench.py"
        if module.exists():
            spec = importlib.util.spec_from_file_location("refbench", module)
            refbench = importlib.util.module_from_spec(spec)
            sys.modules.setdefault("refbench", refbench)
            spec.loader.exec_module(refbench)
            return refbench
    return None


def reference_rate(refbench: Any, n: int, threads: int, kernel: str = "avx512_j",
                   reps: int = 5) -> dict[str, Any]:
    """Gint/s of the C reference kernel (median, min, max over ``reps``)."""
    r = refbench.measure(n=n, threads=threads, reps=reps, kernel=kernel)
    return {"kind": "reference", "kernel": kernel, "n": n, "threads": threads,
            "gint_s": {"median": r["gint_s_median"], "min": r["gint_s_min"],
                       "max": r["gint_s_max"], "gflops": r["gflops_median"]}}


def kernel_sweep(sources: tuple[int, ...] = (1024, 4096, 16384, 65536, 131072),
                 n_targets: int = 4096, dtype: str = "float32", reps: int = 5,
                 symmetric: bool = False) -> list[dict[str, Any]]:
    """One-thread kernel rate against the source tile size (flat is the goal), for a target
    tile of ``n_targets`` bodies.

    ``symmetric`` times :func:`~nbody_dask.kernels.cpu.symmetric_pair_forces` on tiles of
    ``n_targets`` and ``ns`` bodies and counts both directions (``2 nt ns`` interactions),
    which is the effective rate a step gets from it.
    """
    if not symmetric:
        return [kernel_rate(n_targets, ns, dtype=dtype, reps=reps) for ns in sources]
    from .kernels.cpu import symmetric_pair_forces

    ftype = np.dtype(dtype).type
    rng = np.random.default_rng(0)
    out = []
    nt = n_targets
    for ns in sources:
        pt, ps = rng.random((3, nt)).astype(ftype), rng.random((3, ns)).astype(ftype)
        mt, ms = np.full(nt, 1 / ns, ftype), np.full(ns, 1 / ns, ftype)
        rates = _call_rates(partial(symmetric_pair_forces, pt, mt, ps, ms, ftype(1e-4), False),
                            2 * nt * ns, reps)
        out.append({"kind": "kernel-symmetric", "backend": "cpu", "dtype": dtype,
                    "n_targets": nt, "n_sources": ns, "threads": 1, "gint_s": _stats(rates)})
    return out


def scaling(kind: str, n: int, workers: tuple[int, ...] = (1, 2), steps: int = 30,
            dtype: str = "float32", snapshot_every: int = 10) -> list[dict[str, Any]]:
    """Strong (fixed ``n``) or weak (``n`` bodies per worker) scaling over worker processes.

    Each point is a fresh loopback ``LocalCluster`` of ``w`` single-threaded worker
    processes, like ``w`` one-core nodes. Strong: speedup ``t_1 / t_w`` and efficiency
    ``speedup / w``. Weak: N grows ``w`` times, the work ``w**2`` times; efficiency is the
    interaction rate per worker relative to one worker.
    """
    from distributed import Client

    from .clusters import local

    if kind not in ("strong", "weak"):
        raise ValueError(f"kind must be 'strong' or 'weak', got {kind!r}")
    rows = []
    for w in workers:
        size = n if kind == "strong" else n * w
        with local(n_workers=w, threads_per_worker=1) as cluster, Client(cluster) as client:
            run = simulate_rate(size, steps=steps, dtype=dtype, client=client,
                                snapshot_every=snapshot_every)
        run.update(scaling=kind, workers=w)
        base = rows[0] if rows else run
        if kind == "strong":
            run["speedup"] = base["seconds_per_step"] / run["seconds_per_step"]
            run["efficiency"] = run["speedup"] / w
        else:
            run["efficiency"] = (run["gint_s"] / w) / base["gint_s"]
        rows.append(run)
    return rows


def scaling_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`scaling` rows, in the layout of the scaling studies."""
    lines = ["| scaling | workers | N | time per step | Gint/s | speedup | efficiency |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        lines.append(f"| {r['scaling']} | {r['workers']} | {r['n']:,} | "
                     f"{r['seconds_per_step'] * 1e3:.1f} ms | {r['gint_s']:.2f} | {speedup} | "
                     f"{r['efficiency']:.2f} |")
    return "\n".join(lines)
