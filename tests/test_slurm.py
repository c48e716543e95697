"""A real single-node Slurm (started by .ci/start-slurm): jobqueue workers and sbatch.

Skipped where no Slurm controller answers (run ``bash .ci/start-slurm`` as root first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

import nbody_dask
from nbody_dask.storage import committed_snapshots

# one at a time (in one test process): each fills the single node's cores
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "slurm"


def _slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.strip() in {"idle", "mix", "alloc"}


if not _slurm_up():
    pytest.skip("no Slurm controller (run .ci/start-slurm)", allow_module_level=True)


def _run(client, store, **kw):
    ds = nbody_dask.plummer(500, seed=5)
    traj = nbody_dask.simulate(ds, steps=12, dt=1 / 64, softening=0.02, tile_size=128,
                               snapshot_every=4, store=store, client=client, progress=False,
                               **kw)
    return traj.isel(time=-1).load()


@pytest.mark.slow
def test_slurm_cluster_matches_local_cluster_bit_for_bit(tmp_path):
    from nbody_dask.clusters import slurm

    with slurm(jobs=2, layout="pairs", cores=1, processes=1, memory="2GB",
               walltime="00:10:00", interface="lo", log_directory=str(tmp_path / "logs"),
               scheduler_options={"interface": "lo", "dashboard_address": "127.0.0.1:0"},
               ) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        assert len(client.nthreads()) == 2
        on_slurm = _run(client, tmp_path / "slurm.zarr")
    with LocalCluster(n_workers=1, threads_per_worker=2, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        local = _run(client, tmp_path / "local.zarr")
    for name in ("position", "velocity", "total_energy"):
        np.testing.assert_array_equal(on_slurm[name].values, local[name].values)


@pytest.mark.slow
def test_hpc_layout_on_slurm_matches_local_run_bit_for_bit(tmp_path):
    """One worker job of 2 cores, one Dask thread, the parallel kernel on both cores."""
    import dask

    from nbody_dask.clusters import slurm

    with slurm(jobs=1, cores=2, memory="2GB", walltime="00:10:00", interface="lo",
               log_directory=str(tmp_path / "logs"),
               scheduler_options={"interface": "lo", "dashboard_address": "127.0.0.1:0"},
               ) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=120)
        assert list(client.nthreads().values()) == [1]
        assert "--cpus-per-task=2" in cluster.job_script()
        on_slurm = _run(client, tmp_path / "slurm.zarr", layout="rows")
    assert on_slurm.attrs["layout"] == "rows"
    with dask.config.set({"nbody.symmetric": False}), \
            LocalCluster(n_workers=1, threads_per_worker=2, host="127.0.0.1",
                         dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        local = _run(client, tmp_path / "local.zarr")
    for name in ("position", "velocity", "total_energy"):
        np.testing.assert_array_equal(on_slurm[name].values, local[name].values)


@pytest.mark.slow
def test_sbatch_script_runs_a_simulation(tmp_path):
    store = tmp_path / "sbatch.zarr"
    env = {**os.environ, "NBODY_PYTHON": sys.executable, "NBODY_INTERFACE": "lo"}
    proc = subprocess.run(
        ["sbatch", "--wait", f"--chdir={tmp_path}", f"--output={tmp_path}/job.out",
         str(DEPLOY / "run-in-allocation.sbatch"), "--n", "400", "--steps", "10",
         "--snapshot-every", "5", "--tile-size", "200", "--store", str(store)],
        capture_output=True, text=True, env=env, timeout=300)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stderr + log
    assert committed_snapshots(store) == 3, log
    assert "3 committed" in log


@pytest.mark.parametrize("worker, message", [
    ("cuda", "NBODY_WORKER=cuda needs dask-cuda"),
    ("gpu", "NBODY_WORKER must be cpu or cuda, got 'gpu'"),
])
def test_sbatch_script_refuses_a_worker_kind_it_cannot_start(tmp_path, worker, message):
    """The GPU path of the script (deploy/gpu) fails at once, and clearly, without dask-cuda."""
    if worker == "cuda":
        try:
            import dask_cuda  # noqa: F401
            pytest.skip("dask-cuda is installed here")
        except ImportError:
            pass
    env = {**os.environ, "NBODY_PYTHON": sys.executable, "NBODY_INTERFACE": "lo",
           "NBODY_WORKER": worker}
    proc = subprocess.run(
        ["sbatch", "--wait", f"--chdir={tmp_path}", f"--output={tmp_path}/job.out",
         str(DEPLOY / "run-in-allocation.sbatch"), "--n", "64", "--steps", "2",
         "--store", str(tmp_path / "never.zarr")],
        capture_output=True, text=True, env=env, timeout=120)
    log = (tmp_path / "job.out").read_text()
    assert proc.returncode != 0
    assert message in log, log
    assert not (tmp_path / "never.zarr").exists()
