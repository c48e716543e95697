"""Cluster helpers: TLS end to end, clear and fast failures for bad configuration."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.security import Security

import nbody_dask
from nbody_dask import clusters


def test_tls_cluster_runs_and_refuses_clients_without_credentials(tmp_path):
    pytest.importorskip("cryptography")
    security = Security.temporary()
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tls",
                      host="127.0.0.1", security=security,
                      dashboard_address="127.0.0.1:0") as cluster:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        with Client(cluster, security=security) as client:
            traj = nbody_dask.simulate(nbody_dask.plummer(200, seed=1), steps=5, dt=0.01,
                                       softening=0.05, tile_size=100, client=client,
                                       store=tmp_path / "tls.zarr", progress=False)
            assert np.isfinite(traj.position.values).all()
        with pytest.raises((OSError, TimeoutError, TypeError)):
            Client(cluster.scheduler_address, timeout="3s")  # no credentials at all
        with pytest.raises((OSError, TimeoutError)):  # a certificate of another authority
            Client(cluster.scheduler_address, security=Security.temporary(), timeout="3s")


def test_unknown_cluster_kind():
    with pytest.raises(ValueError, match=r"cluster kind must be one of .*got 'pbs'"):
        clusters.make("pbs")


def test_unreachable_scheduler_fails_within_seconds():
    start = time.monotonic()
    with pytest.raises(OSError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        clusters.connect("tcp://127.0.0.1:9", timeout="2s")
    assert time.monotonic() - start < 10


def test_missing_scheduler_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no scheduler file"):
        clusters.connect(scheduler_file=str(tmp_path / "scheduler.json"))
    with pytest.raises(ValueError, match="exactly one of"):
        clusters.connect()


@pytest.mark.parametrize(("kind", "module", "extra", "kwargs"), [
    ("kubernetes", "dask_kubernetes", "kubernetes", {"image": "nbody-dask:test"}),
    ("cuda", "dask_cuda", "gpu", {}),
    ("slurm", "dask_jobqueue", "slurm", {}),
])
def test_missing_optional_package_says_which_extra(monkeypatch, kind, module, extra, kwargs):
    for name in list(sys.modules):  # hide the package even where it is installed
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    start = time.monotonic()
    with pytest.raises(ImportError, match=rf"pip install 'nbody-dask\[{extra}\]'"):
        clusters.make(kind, **kwargs)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(("layout", "threads"), [("rows", 1), ("pairs", 4)])
def test_slurm_job_script_uses_this_python_and_config(layout, threads):
    """The rows (HPC) layout, the default: one Dask thread, all the job's cores booked."""
    pytest.importorskip("dask_jobqueue")
    import sys

    import dask

    with dask.config.set({"jobqueue.slurm.cores": 4, "jobqueue.slurm.processes": 1,
                          "jobqueue.slurm.memory": "8GB",
                          "jobqueue.slurm.walltime": "00:42:00"}):
        with clusters.slurm(jobs=0, layout=layout, interface="lo",
                            scheduler_options={"interface": "lo",
                                               "dashboard_address": "127.0.0.1:0"}) as cluster:
            script = cluster.job_script()
    assert sys.executable in script
    assert "#SBATCH -t 00:42:00" in script and "--cpus-per-task=4" in script
    assert f"--nthreads {threads} " in script and "--interface lo" in script


def test_slurm_refuses_a_layout_it_cannot_shape():
    pytest.importorskip("dask_jobqueue")
    with pytest.raises(ValueError, match="layout must be one of"):
        clusters.slurm(jobs=0, layout="grid")
    with pytest.raises(ValueError, match="one worker process per job, got processes=4"):
        clusters.slurm(jobs=0, processes=4)
    assert clusters.shaped_layout("slurm") == "rows"
    assert clusters.shaped_layout("local") is None


def test_slurm_gpu_workers_job_script():
    """deploy/gpu's recipe for GPU workers as jobs: dask-cuda's worker and a --gres line."""
    pytest.importorskip("dask_jobqueue")
    import sys

    with clusters.slurm(jobs=0, cores=8, memory="64GB", walltime="02:00:00",
                        worker_command="dask_cuda.cli", job_extra_directives=["--gres=gpu:1"],
                        interface="lo", scheduler_options={
                            "interface": "lo", "dashboard_address": "127.0.0.1:0"}) as cluster:
        script = cluster.job_script()
    assert f"{sys.executable} -m dask_cuda.cli tcp://" in script
    assert "#SBATCH --gres=gpu:1" in script
    assert "--nworkers" not in script  # dask cuda worker starts one worker per GPU itself


@pytest.mark.slow
def test_cli_cluster_errors_are_one_line(tmp_path):
    from click.testing import CliRunner

    from nbody_dask.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["run", "--cluster", "slurm", "--scheduler", "tcp://x:1",
                                  "--store", str(tmp_path / "a.zarr")])
    assert result.exit_code == 2 and "cannot be combined" in result.output
    result = runner.invoke(main, ["run", "--scheduler", "tcp://127.0.0.1:9", "--no-progress",
                                  "--store", str(tmp_path / "b.zarr")])
    assert result.exit_code == 1 and "cannot reach the Dask scheduler" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("error, dropped", [
    ("ClientPayloadError('Response payload is not completed')", True),
    ("EndpointConnectionError('Could not connect')", True),
    ("NonFiniteStateError('the state is not finite')", True),
    ("ValueError('a bug')", False),
])
def test_workers_leave_out_tracebacks_of_errors_the_driver_reports(error, dropped):
    """A task's error that the driver reports in one line (a store's fault, a non-finite
    state) is not logged by the worker with its traceback as well; any other error is."""
    import logging

    record = logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1,
                               "Compute Failed\nKey: %s\nException: %s\n", ("k", error),
                               None)
    assert clusters._ReportedErrorsFilter().filter(record) is not dropped


def test_a_cluster_stopped_at_once_closes_without_logs_and_restores_logging(caplog,
                                                                            monkeypatch):
    """A KeyboardInterrupt (a second Ctrl-C) inside ``client_context``'s own cluster closes
    it with every log record held back (a worker's failed heartbeat while it closes is no
    news), re-raises, and leaves logging as it was."""
    import logging

    close = LocalCluster.close

    def noisy_close(self, *args, **kwargs):  # what a worker says when its scheduler is gone
        if self.status.name != "closed":  # (closing a closed cluster again does nothing)
            logging.getLogger("distributed.worker").error("Failed to communicate with "
                                                          "scheduler during heartbeat.")
        return close(self, *args, **kwargs)

    monkeypatch.setattr(LocalCluster, "close", noisy_close)
    caplog.set_level(logging.INFO, logger="distributed")
    with pytest.raises(KeyboardInterrupt), clusters.client_context(None) as client:
        assert client.submit(sum, [1, 2]).result() == 3
        caplog.clear()
        raise KeyboardInterrupt
    assert not [r for r in caplog.records if r.name.startswith("distributed")]
    assert logging.root.manager.disable == logging.NOTSET
    logging.getLogger("distributed").info("heard again")
    assert caplog.records[-1].getMessage() == "heard again"
