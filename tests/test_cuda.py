"""The CUDA kernel and backend selection. CI has no GPU: the kernel runs in Numba's CUDA
simulator, which must be enabled before Numba is imported, so these tests drive a fresh
Python process with ``NUMBA_ENABLE_CUDASIM=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nbody_dask

pytestmark = pytest.mark.gpu


def _in_simulator(code: str, timeout: float = 600) -> dict:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_cuda_kernel_matches_cpu_kernel_in_simulator():
    """N in {1, 31}, and 300 sources over several staged chunks, the last part-filled; both
    dtypes."""
    result = _in_simulator("""
        import json, numpy as np
        from nbody_dask.kernels import cpu, cuda
        from nbody_dask.testing import bound_ratio, kernel_error_bound
        assert cuda.available()
        out = {}
        for dtype in (np.float32, np.float64):
            for nt, ns in ((1, 1), (31, 31), (5, 300)):
                rng = np.random.default_rng(nt + ns)
                t = [rng.random(nt).astype(dtype) for _ in range(3)]
                s = [rng.random(ns).astype(dtype) for _ in range(4)]
                eps2 = dtype(1e-4)
                for diagonal in (False, True):
                    if diagonal and nt != ns:
                        continue
                    src = t + [s[3]] if diagonal else s
                    g = cuda.accel_potential_tile(*t, *src, eps2, diagonal)
                    c = cpu.accel_potential_tile(*t, *src, eps2, diagonal)
                    a = cuda.accel_tile(*t, *src, eps2)
                    assert g.dtype == dtype and a.shape == (3, nt)
                    # both kernels within the error model's bound: twice it apart
                    bound = 2 * kernel_error_bound(t, src[:3], src[3], eps2, dtype,
                                                   skip_self=diagonal)
                    key = f"{np.dtype(dtype).name}-{nt}-{ns}-{diagonal}"
                    out[key] = [bound_ratio(g, c, bound), bound_ratio(a, c[:3], bound[:3])]
        print(json.dumps(out))
    """)
    for key, (err_full, err_accel) in result.items():
        assert err_full <= 1 and err_accel <= 1, (key, err_full, err_accel)


@pytest.mark.slow
def test_launch_shape_matches_cpu_kernel_in_simulator():
    """An odd launch shape (the benchmark's shapes are all checked by the GPU check script,
    below): several targets per thread, blocks partly filled with targets and with sources,
    the potential on and off."""
    result = _in_simulator("""
        import json, numpy as np
        from nbody_dask import benchmark
        from nbody_dask.kernels import cpu, cuda
        from nbody_dask.testing import bound_ratio, kernel_error_bound
        out = {}
        rng = np.random.default_rng(7)
        for block, per_thread in ((32, 3),):
            for nt, ns in ((1, 1), (70, 45), (100, 77)):
                pt, ps = rng.random((3, nt)), rng.random((3, ns))
                ms = rng.random(ns) / ns
                for dtype in (np.float32, np.float64):
                    t, s, m = pt.astype(dtype), ps.astype(dtype), ms.astype(dtype)
                    for potential in (False, True):
                        g = cuda.tile_pair_forces(t, s, m, dtype(1e-4), potential,
                                                  block=block, per_thread=per_thread)
                        c = cpu.tile_pair_forces(t, s, m, dtype(1e-4), potential)
                        assert g.dtype == dtype and g.shape == c.shape
                        bound = 2 * kernel_error_bound(t, s, m, dtype(1e-4), dtype)
                        key = f"{block}-{per_thread}-{nt}-{ns}-{np.dtype(dtype).name}-{potential}"
                        out[key] = bound_ratio(g, c, bound[:len(c)])
        rate = benchmark.kernel_rate(40, 40, reps=1, backend="cuda",
                                     launch={"block": 32, "per_thread": 2})
        out["rate"] = [rate["block"], rate["per_thread"], rate["gint_s"]["median"]]
        print(json.dumps(out))
    """)
    block, per_thread, rate = result.pop("rate")
    assert (block, per_thread) == (32, 2) and rate > 0
    assert len(result) == 3 * 2 * 2
    for key, err in result.items():
        assert err <= 1, (key, err)  # within twice the error model's bound


@pytest.mark.slow
def test_prepared_gpu_check_runs_in_simulator(tmp_path):
    """benchmarks/gpu/check.py, the one script a lent GPU machine runs, works end to end."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "check.py"
    out = tmp_path / "gpu.json"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run([sys.executable, str(script), "--quick", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["device"] == "simulator"
    checks = {r["check"]: r for r in data["results"] if "check" in r}
    assert checks["cuda-vs-cpu (all)"]["ok"]
    assert checks["cuda-vs-cpu (all)"]["cases"] == 2 + 1  # --quick: two launch shapes
    assert checks["simulate-cuda-vs-cpu"]["ok"]
    rates = [r for r in data["results"] if r.get("kind") == "kernel"]
    assert len(rates) == 2 + 3  # --quick times two launch shapes
    assert all(r["backend"] == "cuda" and r["tflops"] > 0 for r in rates)
    assert [r["n_targets"] for r in rates[-3:]] == [1, 4, 16]
    assert [r for r in data["results"] if r.get("kind") == "simulate"][0]["backend"] == "cuda"
    assert checks["individual-steps-pairwise-cuda-vs-cpu"]["ok"]
    assert checks["individual-steps-acceleration-cuda-vs-cpu"]["ok"]
    assert checks["short-range-cuda-vs-cpu"]["ok"]
    assert [r["backend"] for r in data["results"] if r.get("kind") == "treepm-evaluation"] == [
        "cpu", "cuda"]


def test_zero_softening_is_finite_in_simulator():
    result = _in_simulator("""
        import json, numpy as np
        from nbody_dask.kernels import cuda
        x = np.array([0.0, 0.0, 1.0], np.float32); z = np.zeros(3, np.float32)
        out = cuda.accel_potential_tile(x, z, z, x, z, z, np.ones(3, np.float32),
                                        np.float32(0), True)
        print(json.dumps(out.tolist()))
    """)
    out = np.array(result)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], [1.0, 1.0, -2.0])


@pytest.mark.slow
def test_simulate_with_cuda_backend_in_simulator():
    """End to end: the tile-pair tasks run the CUDA kernel, other tasks as usual."""
    result = _in_simulator("""
        import json, numpy as np
        from distributed import Client, LocalCluster
        import nbody_dask
        ds = nbody_dask.plummer(60, seed=1)
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
            kw = dict(steps=3, dt=1 / 64, softening=0.05, tile_size=40, dtype="float32",
                      client=c, progress=False)
            gpu = nbody_dask.simulate(ds, backend="cuda", **kw)
            cpu = nbody_dask.simulate(ds, backend="cpu", **kw)
        from nbody_dask.kernels.cuda import DEVICE_CACHE
        diff = np.abs(gpu.position.values - cpu.position.values).max()
        print(json.dumps({"diff": float(diff), "backend": gpu.attrs["backend"],
                          "hits": DEVICE_CACHE.hits, "misses": DEVICE_CACHE.misses}))
    """)
    assert result["backend"] == "cuda"
    assert result["diff"] <= 1e-5
    # 2 tiles, 4 pair tasks per force evaluation, 4 evaluations: 32 lookups of positions,
    # and each tile's positions are copied once per evaluation, its masses once per run
    assert result["misses"] == 2 * 4 + 2
    assert result["hits"] == 4 * 4 * 3 - result["misses"]


@pytest.mark.slow
def test_rate_kernel_matches_the_cpus_in_simulator():
    """The pairwise criterion's kernel (forces, potential, the pairs' rates) against
    cpu.accel_rate_tile: a tick's active bodies of the source tile itself (their self terms
    left out), other tiles' targets, one body alone, a part-filled last chunk; two launch
    shapes, both dtypes."""
    result = _in_simulator("""
        import json, numpy as np
        from nbody_dask.kernels import cpu, cuda
        out = {}
        for dtype in (np.float32, np.float64):
            for nt, ns, same in ((1, 1, True), (15, 31, True), (5, 70, False)):
                rng = np.random.default_rng(nt + ns)
                s = rng.random((3, ns)).astype(dtype)
                m = (rng.random(ns) + 0.5).astype(dtype)
                if same:  # active bodies of the source tile
                    own = np.sort(rng.choice(ns, size=nt, replace=False)).astype(np.int64)
                    t, mt = np.ascontiguousarray(s[:, own]), m[own]
                else:
                    t = rng.random((3, nt)).astype(dtype)
                    mt = (rng.random(nt) + 0.5).astype(dtype)
                    own = np.full(nt, -1, dtype=np.int64)
                for pot in (False, True):
                    want = cpu.accel_rate_tile(*t, mt, own, *s, m, dtype(1e-3), pot)
                    for shape in ((None, None), (32, 3)):
                        got = cuda.tile_pair_rate_forces(t, mt, own, s, m, dtype(1e-3), pot,
                                                         block=shape[0], per_thread=shape[1])
                        scale = np.maximum(np.abs(want).max(axis=1), 1e-30)
                        out[f"{np.dtype(dtype).name}-{nt}-{ns}-{pot}-{shape[0]}"] = [
                            float((np.abs(got - want).max(axis=1) / scale).max()),
                            got.shape == want.shape and got.dtype == dtype,
                            float(np.abs(want[-1]).max())]
        print(json.dumps(out))
    """)
    for key, (error, same_shape, rates) in result.items():
        tolerance = 1e-5 if key.startswith("float32") else 1e-13
        assert same_shape and error <= tolerance, (key, error)
        assert (rates > 0) == (key.split("-")[1:3] != ["1", "1"]), key  # one body: no pair


@pytest.mark.slow
def test_individual_steps_on_the_cuda_backend_in_simulator():
    """Individual time steps by either criterion: the active bodies' forces (and the pairs'
    rates) by the CUDA kernels, on two tiles and on one tile's fused blocks, take the CPU's
    bins and trajectory to round-off (float64)."""
    result = _in_simulator("""
        import json, numpy as np
        from distributed import Client, LocalCluster
        import nbody_dask
        ds = nbody_dask.hernquist(60, seed=1)
        out = {}
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
            for criterion, eta in (("acceleration", None), ("pairwise", 0.02)):
                kw = dict(steps=1, dt=1 / 16, softening=0.02, tile_size=40, dtype="float64",
                          timestep="individual", time_bins=4, step_criterion=criterion,
                          eta=eta, snapshot_every=1, client=c, progress=False)
                runs = {"gpu": nbody_dask.simulate(ds, backend="cuda", **kw),
                        "one": nbody_dask.simulate(ds, backend="cuda",
                                                   **{**kw, "tile_size": None}),
                        "cpu": nbody_dask.simulate(ds, backend="cpu", **kw)}
                cpu = runs["cpu"]
                out[criterion] = {name: {
                    "backend": traj.attrs["backend"], "tile_size": int(traj.attrs["tile_size"]),
                    "diff": float(np.abs(traj.position.values - cpu.position.values).max()),
                    "same_bins": bool((traj.time_bin.values == cpu.time_bin.values).all()),
                    "evaluations": traj.force_evaluations.values[1:].tolist(),
                    "bins": np.bincount(traj.time_bin.values[-1].ravel()).tolist()}
                    for name, traj in runs.items()}
        print(json.dumps(out))
    """)
    for criterion, runs in result.items():
        cpu = runs["cpu"]
        assert len(cpu["bins"]) == 4 and min(cpu["bins"]) > 0, criterion  # every bin in use
        for name, tiles in (("gpu", 40), ("one", 60)):
            run = runs[name]
            assert (run["backend"], run["tile_size"]) == ("cuda", tiles)
            assert run["diff"] <= 1e-13 and run["same_bins"], (criterion, name, run)
            assert run["evaluations"] == cpu["evaluations"]


@pytest.mark.slow
def test_short_range_kernel_matches_cpu_pairs_in_simulator():
    """TreePM's short range on the GPU against the CPU's pair kernel (shortrange.short_p2p):
    minimum images across the box's faces, pairs beyond the cutoff dropped, a coincident
    pair contributing nothing; 1 and 70 targets, float32 and float64, potential on and off,
    and an odd launch shape."""
    result = _in_simulator("""
        import json, numpy as np
        from nbody_dask.kernels import cuda, shortrange
        out = {}
        rng = np.random.default_rng(3)
        box, split, cutoff = 2.0, 0.1, 0.5
        for dtype in (np.float32, np.float64):
            for nt, ns in ((1, 1), (70, 90)):
                t = (rng.random((3, nt)) * box).astype(dtype)
                s = (rng.random((3, ns)) * box).astype(dtype)
                s[:, 0] = t[:, 0]
                t[0, -1], s[0, -1] = dtype(0.01), dtype(box - 0.02)  # near across a face
                m = (rng.random(ns) + 0.5).astype(dtype)
                eps2 = dtype(1e-4)
                law = shortrange.walk_constants(box, split, cutoff, dtype)
                cpu = np.zeros((4, nt), dtype=dtype)
                shortrange.short_p2p(t[0], t[1], t[2], s[0], s[1], s[2], m, eps2, law, cpu)
                full = cuda.short_pair_forces(tuple(t), tuple(s), m, eps2, box, split, cutoff,
                                              True)
                accel = cuda.short_pair_forces(tuple(t), tuple(s), m, eps2, box, split,
                                               cutoff, False, block=32, per_thread=3)
                key = f"{np.dtype(dtype).name}-{nt}-{ns}"
                out[key] = [float(np.abs(full - cpu).max() / np.abs(cpu).max()),
                            float(np.abs(accel - cpu[:3]).max() / np.abs(cpu[:3]).max()),
                            full.dtype == dtype, int((np.abs(cpu[:3]) > 0).sum())]
        print(json.dumps(out))
    """)
    for key, (full, accel, same_dtype, _) in result.items():
        tolerance = 1e-5 if key.startswith("float32") else 1e-12
        assert same_dtype and full <= tolerance and accel <= tolerance, (key, full, accel)
    assert result["float64-70-90"][3] > 0  # some pairs within the cutoff


@pytest.mark.slow
def test_treepm_with_cuda_backend_in_simulator():
    """End to end: TreePM's short-range pair tasks on the GPU (every pair of near tiles)
    agree with the CPU's walk to its accuracy; the mesh part is the same."""
    result = _in_simulator("""
        import json, numpy as np
        from distributed import Client, LocalCluster
        import nbody_dask
        rng = np.random.default_rng(5)
        x = rng.random((160, 3))
        ds = nbody_dask.make_bodies(x, np.zeros_like(x), np.full(160, 1 / 160))
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
            kw = dict(box_size=1.0, method="treepm", dtype="float64", softening=0.01,
                      tile_size=80, client=c, theta=0.2)
            gpu = nbody_dask.accelerations(ds, backend="cuda", **kw)
            cpu = nbody_dask.accelerations(ds, backend="cpu", **kw)
        errors = np.linalg.norm(gpu - cpu, axis=1) / np.linalg.norm(cpu, axis=1)
        print(json.dumps({"median": float(np.median(errors)), "max": float(errors.max())}))
    """)
    assert result["median"] <= 1e-4 and result["max"] <= 1e-2, result


def test_device_cache_in_simulator():
    """tile_pair_forces reuses device copies while the host arrays live, and only then."""
    result = _in_simulator("""
        import gc, json, numpy as np
        from nbody_dask.kernels import cpu, cuda
        cache = cuda.DEVICE_CACHE
        rng = np.random.default_rng(3)
        pos = rng.random((3, 40)).astype(np.float32)
        mass = np.full(40, 1 / 40, np.float32)
        eps2 = np.float32(1e-3)
        out = {}
        first = cuda.tile_pair_forces(pos, pos, mass, eps2, True, True)
        again = cuda.tile_pair_forces(pos, pos, mass, eps2, True, True)
        out["same"] = bool((first == again).all())
        out["matches_cpu"] = float(np.abs(
            first - cpu.tile_pair_forces(pos, pos, mass, eps2, True, True)).max())
        out["after_two"] = [cache.hits, cache.misses, len(cache)]
        del pos, first, again
        gc.collect()
        out["after_del"] = len(cache)
        # a new array (perhaps at the same address) with other values is copied anew
        moved = rng.random((3, 40)).astype(np.float32)
        got = cuda.tile_pair_forces(moved, moved, mass, eps2, False)
        want = cpu.tile_pair_forces(moved, moved, mass, eps2, False)
        out["fresh"] = float(np.abs(got - want).max())
        small = cuda.DeviceCache(max_bytes=moved.nbytes + mass.nbytes)
        extra = moved.copy()
        small.get(moved); small.get(mass); small.get(extra)  # the oldest, moved, goes
        out["bounded"] = [len(small), small.nbytes <= small.max_bytes,
                          small.get(mass) is small.get(mass)]
        x, y, z = extra  # an array alone and stacked with others: two copies, not one
        out["stacked"] = [list(small.get(x).shape), list(small.get(x, y, z).shape),
                          list(small.get(x).shape)]
        print(json.dumps(out))
    """)
    assert result["same"]
    assert result["matches_cpu"] < 1e-5
    # three lookups per call (target, source, mass): first call 1 miss for pos + 1 for mass
    # (the source is the target: a hit), second call all hits
    assert result["after_two"] == [4, 2, 2]
    assert result["after_del"] == 1  # only the masses are still alive
    assert result["fresh"] < 1e-5
    assert result["bounded"] == [2, True, True]
    assert result["stacked"] == [[40], [3, 40], [40]]


def test_cuda_backend_without_gpu_fails_at_once(client):
    from nbody_dask.kernels.cuda import available

    if available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match=r"backend='cuda' needs a CUDA GPU on every worker"):
        nbody_dask.simulate(nbody_dask.uniform_cube(8), steps=1, dt=0.1, backend="cuda",
                            client=client, progress=False)


def test_auto_backend_falls_back_to_cpu(client):
    from nbody_dask.kernels.cuda import available

    if available():
        pytest.skip("this machine has a GPU")
    traj = nbody_dask.simulate(nbody_dask.uniform_cube(8), steps=1, dt=0.1, backend="auto",
                               client=client, progress=False)
    assert traj.attrs["backend"] == "cpu"


def test_cuda_bench_without_gpu_fails_in_one_line():
    from click.testing import CliRunner

    from nbody_dask.cli import main

    result = CliRunner().invoke(main, ["bench", "--backend", "cuda", "--n", "1000"])
    assert result.exit_code == 1
    assert "--backend cuda needs a CUDA GPU" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match=r"backend must be one of .*got 'tpu'"):
        nbody_dask.simulate(nbody_dask.uniform_cube(8), steps=1, dt=0.1, backend="tpu")


def test_import_does_not_load_cuda():
    code = ("import sys, nbody_dask; "
            "print('nbody_dask.kernels.cuda' in sys.modules, 'numba.cuda' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]
