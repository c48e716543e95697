"""One writer per store: a second run, an overwrite or a resume of a store in use is refused.

Before, nothing stopped them: both runs exited 0 with the energies of one and the positions
of the other, snapshots all NaN, or a first run that "succeeded" while its store held
another trajectory.
"""

from __future__ import annotations

import json
import os
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


@pytest.mark.slow
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


# -- exactly one owner in every interleaving of racing acquirers (issue 33, item 1) -----------

def _schedules(counts):
    """Every sequence holding ``counts[i]`` times the index ``i`` (a multiset permutation)."""
    if not any(counts):
        yield ()
        return
    for i, left in enumerate(counts):
        if left:
            rest = list(counts)
            rest[i] -= 1
            for tail in _schedules(rest):
                yield (i, *tail)


def _initial(kind, host):
    """A store's lease before the race: none, a stale one (a dead owner), a released one."""
    def prepare(location):
        if kind == "empty":
            return
        if host == "here":  # this host: stale because its pid's start time is not ours
            record = {"run_id": "d" * 32, "host": socket.gethostname(), "pid": os.getpid(),
                      "pid_started": 0.0, "started": 0.0, "heartbeat": time.time()}
        else:  # another host: stale because its heartbeat is old
            record = {"run_id": "d" * 32, "host": "elsewhere.example", "pid": 1,
                      "pid_started": 0.0, "started": 0.0, "heartbeat": time.time() - 10**6}
        record["released"] = kind == "released"
        location.create("writer.lease.0", json.dumps(record).encode())
    return prepare


def _race(location, prepare, schedule, n):
    """Drive ``n`` acquirers of ``location`` through ``schedule`` (whose index moves next;
    each move is one store operation, a local clean-up counted with its create); return
    their outcomes and leases."""
    prepare(location)
    leases = [lease.WriterLease(location, heartbeat=3600) for _ in range(n)]
    steps = [held.acquire_steps() for held in leases]
    for step in steps:
        assert next(step) == "list"  # at the first operation, nothing done yet
    outcome = [None] * n

    def move(i):
        try:
            if next(steps[i]) == "clean":
                move(i)
        except StopIteration:
            outcome[i] = "owner"
        except lease.StoreInUseError:
            outcome[i] = "refused"

    for i in schedule:
        if outcome[i] is None:
            move(i)
    for i in range(n):
        while outcome[i] is None:
            move(i)
    return outcome, leases


def _check_one_owner(location, outcome, leases):
    try:
        records = {n: location.read_bytes(n) for n in location.names() if lease.is_lease_file(n)}
        assert outcome.count("owner") == 1, (outcome, [held.generation for held in leases],
                                             [held.run_id for held in leases], records)
        owner = leases[outcome.index("owner")]
        assert owner.held() and lease.holder(location).run_id == owner.run_id
        records = [n for n in location.names() if lease.is_lease_file(n)]
        for name in records:  # no refused run left a lease behind
            info = location.read_json(name)
            assert info["run_id"] in (owner.run_id, "d" * 32), (name, info)
    finally:
        for held in leases:
            held.release()


@pytest.mark.parametrize("kind", ["empty", "stale", "released"])
@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_lease_has_one_owner_in_every_interleaving_on_a_local_store(tmp_path, kind, n):
    """2 acquirers through every order of their list, read, create and clean-up operations
    (3 acquirers: every order of list, read and create), from an empty store, a dead run's
    lease and a released one: exactly one owner each time, the others refused before they
    create anything."""
    from nbody_dask.location import store_location

    ops = 4 if n == 2 else 3
    for k, schedule in enumerate(_schedules([ops] * n)):
        location = store_location(tmp_path / f"{kind}-{n}-{k}.zarr")
        location.path.mkdir()
        outcome, leases = _race(location, _initial(kind, "here"), schedule, n)
        _check_one_owner(location, outcome, leases)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["empty", "stale", "released"])
def test_lease_has_one_owner_in_every_interleaving_on_s3(s3, kind):
    """The same on moto's S3 server (conditional PUT, listings that may lag): 2 acquirers
    through every order of their operations; 3 from an empty store through 40 of the 1,680
    orders, drawn with a fixed seed (all of them take minutes against the server)."""
    import random

    from nbody_dask.location import store_location

    schedules = list(_schedules([3, 3]))
    if kind == "empty":
        schedules += random.Random(3).sample(list(_schedules([3, 3, 3])), 40)
    for schedule in schedules:
        location = store_location(s3.url("race.zarr"), s3.options)
        outcome, leases = _race(location, _initial(kind, "elsewhere"), schedule,
                                max(schedule) + 1)
        _check_one_owner(location, outcome, leases)


@pytest.mark.slow
def test_lease_race_between_threads_on_s3_breaks_nothing_in_50_trials(s3):
    """Two acquirers started together (threads released by one barrier), 50 times: exactly
    one owner each time (the red team's two `nbody-dask run --store s3://...` broke 2 of 11)."""
    import threading

    from nbody_dask.location import store_location

    for _ in range(50):
        location = store_location(s3.url("race.zarr"), s3.options)
        leases = [lease.WriterLease(location, heartbeat=3600) for _ in range(2)]
        barrier, outcome = threading.Barrier(2), [None, None]

        def acquire(i, leases=leases, barrier=barrier, outcome=outcome):
            barrier.wait()
            try:
                leases[i].acquire()
                outcome[i] = "owner"
            except lease.StoreInUseError:
                outcome[i] = "refused"

        threads = [threading.Thread(target=acquire, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        _check_one_owner(location, outcome, leases)


def test_a_lease_read_that_times_out_is_not_another_runs_lease(tmp_path, monkeypatch):
    """A read of the lease that times out (an endpoint that stopped answering) says nothing
    of who holds the store: it raises, where it used to read as an unreadable lease of
    another run (and a run on a paused endpoint said its lease was taken over)."""
    from nbody_dask.location import store_location

    location = store_location(tmp_path / "held.zarr")
    location.path.mkdir()
    held = lease.WriterLease(location)
    held.acquire()
    try:
        assert lease.holds(location, held.run_id, max_age=0)

        def no_answer(self, name):
            raise TimeoutError("no answer")

        monkeypatch.setattr(type(location), "read_bytes", no_answer)
        with pytest.raises(TimeoutError):
            lease.holds(location, held.run_id, max_age=0)
    finally:
        monkeypatch.undo()
        held.release()


def test_store_layout_refuses_to_clear_a_store_another_run_holds(tmp_path):
    """create_store's guard: a run that does not hold the newest lease clears nothing."""
    from nbody_dask.location import store_location
    from nbody_dask.storage import create_store

    location = store_location(tmp_path / "held.zarr")
    location.path.mkdir()
    first, second = lease.WriterLease(location), lease.WriterLease(location)
    first.acquire()
    (location.path / "precious").write_text("data")
    try:
        second.generation = first.generation - 1 if first.generation else -1  # not the holder
        with pytest.raises(lease.LeaseLostError):
            create_store(location, _bodies(), snapshot_steps=[0], times=[0.0],
                         dtype=np.float64, tile_size=64, attrs={}, guard=second.check)
        assert (location.path / "precious").read_text() == "data"
    finally:
        first.release()
