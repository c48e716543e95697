"""One writer per store: a second run, an overwrite or a resume of a store in use is refused.

Before, nothing stopped them: both runs exited 0 with the energies of one and the positions
of the other, snapshots all NaN, or a first run that "succeeded" while its store held
another trajectory.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from click.testing import CliRunner

import nbody_dask
from nbody_dask import lease
from nbody_dask.cli import main
from nbody_dask.storage import committed_snapshots, write_tile

PARAMS = dict(steps=60, dt=0.01, softening=0.05, snapshot_every=10)


def _bodies():
    return nbody_dask.plummer(64, seed=4)


def _forge(store, generation, **fields):
    record = {"run_id": "f" * 32, "host": "elsewhere.example", "pid": 1, "pid_started": 0.0,
              "started": time.time(), "heartbeat": time.time(), **fields}
    (store / f"writer.lease.{generation}").write_text(json.dumps(record))


def test_concurrent_overwrite_and_resume_are_refused(client, tmp_path):
    store = tmp_path / "busy.zarr"
    script = textwrap.dedent(f"""
        import time, nbody_dask
        nbody_dask.simulate(nbody_dask.plummer(64, seed=4), store={str(store)!r},
                            progress=False, callback=lambda step, record: time.sleep(0.4),
                            **{PARAMS!r})
        print("DONE")
    """)
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while lease.holder(store) is None or not (store / "zarr.json").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        owner = rf"is in use by run \w+ \(pid {first.pid} on {socket.gethostname()}"
        with pytest.raises(lease.StoreInUseError, match=owner):
            nbody_dask.simulate(_bodies(), store=store, overwrite=True, client=client,
                                progress=False, **PARAMS)
        with pytest.raises(lease.StoreInUseError, match=owner):
            nbody_dask.simulate(store=store, resume=True, client=client, progress=False)
        with pytest.raises(lease.StoreInUseError, match=owner):
            nbody_dask.simulate(_bodies(), store=store, client=client, progress=False,
                                **PARAMS)
        result = CliRunner().invoke(main, ["resume", str(store), "--no-progress"])
        assert result.exit_code == 1
        assert result.output.startswith(f"Error: store {str(store)!r} is in use by run ")
        assert len(result.output.strip().splitlines()) == 1
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0 and "DONE" in out, err[-3000:]
    assert lease.holder(store) is None  # released at the end
    solo = nbody_dask.simulate(_bodies(), client=client, progress=False, **PARAMS)
    done = nbody_dask.open_trajectory(store)
    assert np.array_equal(done.position.values, solo.position.values)
    assert np.array_equal(done.total_energy.values, solo.total_energy.values)


def test_stale_leases_are_taken_over_live_ones_are_not(client, tmp_path):
    store = tmp_path / "s.zarr"
    nbody_dask.simulate(_bodies(), store=store, client=client, progress=False, **PARAMS)
    # another host, heartbeat fresh: in use
    _forge(store, 0)
    with pytest.raises(lease.StoreInUseError, match="elsewhere.example"):
        nbody_dask.simulate(_bodies(), store=store, overwrite=True, client=client,
                            progress=False, **PARAMS)
    # another host, heartbeat older than nbody.lease.timeout: stale, taken over
    _forge(store, 0, heartbeat=time.time() - 10_000)
    nbody_dask.simulate(_bodies(), store=store, overwrite=True, client=client,
                        progress=False, **PARAMS)
    assert lease.holder(store) is None
    # this host, owner process gone: stale at once, whatever its heartbeat
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    _forge(store, 3, host=socket.gethostname(), pid=int(dead.stdout))
    nbody_dask.simulate(store=store, resume=True, client=client, progress=False)
    assert lease.holder(store) is None


def test_run_that_lost_its_lease_stops_writing(client, tmp_path):
    store = tmp_path / "taken.zarr"

    def take_over(step, record):
        if step == 10:
            current = lease.holder(store)
            _forge(store, current.generation + 1)

    with pytest.raises(lease.LeaseLostError, match="taken over by run f+ "):
        nbody_dask.simulate(_bodies(), store=store, client=client, progress=False,
                            callback=take_over, **PARAMS)
    assert committed_snapshots(store) <= 3
    assert lease.holder(store).host == "elsewhere.example"  # the new owner's lease stays
    tile = nbody_dask.bodies.split_tiles(_bodies(), 64, np.float64)[0]
    with pytest.raises(lease.LeaseLostError):
        write_tile(str(store), 0, tile, "run", writer="not-the-holder")


def test_store_of_a_failed_start_is_removed(no_cluster, tmp_path):
    """A new store whose run never laid it out (here: no cluster) leaves nothing behind."""
    store = tmp_path / "never.zarr"
    with pytest.raises(AssertionError, match="a cluster was started"):
        nbody_dask.simulate(_bodies(), store=store, progress=False, **PARAMS)
    assert not store.exists()
