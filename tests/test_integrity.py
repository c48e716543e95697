"""Damaged data is reported by snapshot and variable, never read as numbers.

Before, chunks carried no checksum: a flipped byte in a committed snapshot read as
|x| = 246,825 where the data was < 10, ``info`` exited 0 and resume continued from it; a
deleted chunk read as NaN; a truncated one failed with a zstd error naming no snapshot.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import nbody_dask
from nbody_dask.cli import main
from nbody_dask.storage import DamagedStoreError, committed_snapshots

PARAMS = dict(steps=6, dt=0.01, softening=0.05, snapshot_every=2, tile_size=32)


class _Stop(Exception):
    pass


def _flip(chunk):
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))


def _truncate(chunk):
    chunk.write_bytes(chunk.read_bytes()[: len(chunk.read_bytes()) // 2])


DAMAGE = {"flip": (_flip, "fails its check"), "truncate": (_truncate, "fails its check"),
          "delete": (lambda chunk: chunk.unlink(), "is missing")}


@pytest.fixture
def interrupted_store(client, tmp_path):
    """A store with snapshots 0..2 committed of 4 (the run stopped after snapshot 2)."""
    store = tmp_path / "run.zarr"

    def stop_after_snapshot_2(step, record):
        if step == 4:
            raise _Stop

    with pytest.raises(_Stop):
        nbody_dask.simulate(nbody_dask.plummer(64, seed=5), store=store, client=client,
                            progress=False, callback=stop_after_snapshot_2, **PARAMS)
    assert committed_snapshots(store) == 3
    return store


def test_every_chunk_has_a_checksum(interrupted_store):
    for name in ("position", "velocity", "mass", "total_energy", "momentum", "time"):
        meta = json.loads((interrupted_store / name / "zarr.json").read_text())
        assert "crc32c" in [c["name"] for c in meta["codecs"]], name


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("variable", ["position", "velocity"])
def test_damage_is_reported_by_snapshot_and_variable(client, interrupted_store, damage,
                                                     variable):
    store = interrupted_store
    harm, what = DAMAGE[damage]
    harm(store / variable / "c" / "2" / "1" / "0")  # snapshot 2, the second tile
    where = f"snapshot 2 of '{variable}': a chunk {what}"
    with pytest.raises(DamagedStoreError, match=where):
        nbody_dask.open_trajectory(store).load()
    undamaged = nbody_dask.open_trajectory(store).isel(time=slice(0, 2)).load()
    assert np.isfinite(undamaged.position.values).all()
    info = CliRunner().invoke(main, ["info", str(store)])
    assert info.exit_code == 1
    assert where in info.output and len(info.output.strip().splitlines()) == 1
    with pytest.raises(DamagedStoreError, match=where):  # resume starts from snapshot 2
        nbody_dask.simulate(store=store, resume=True, client=client, progress=False)
    assert committed_snapshots(store) == 3  # nothing was written


def test_damaged_diagnostics_are_reported(interrupted_store):
    _flip(interrupted_store / "total_energy" / "c" / "0")
    with pytest.raises(DamagedStoreError, match=r"snapshots 0\.\.2 of 'total_energy'"):
        nbody_dask.open_trajectory(interrupted_store).load()


def test_info_verifies_a_sound_store(interrupted_store):
    result = CliRunner().invoke(main, ["info", str(interrupted_store)])
    assert result.exit_code == 0, result.output
    assert "verified     every chunk of 3 snapshot(s)" in result.output


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("variable, chunk, where", [
    ("mass", "0", "bodies 0..63"), ("time", "0", "snapshots 0..3"),
    ("step", "0", "snapshots 0..3"), ("body", "0", "bodies 0..63")])
def test_every_variable_is_checked(interrupted_store, damage, variable, chunk, where):
    """Masses, times, steps and body ids too: a missing chunk read as NaN masses and times,
    steps and ids of 0, and `info` said "verified every chunk" (issue 33, item 4); a
    flipped one failed without naming the store or the variable."""
    store = interrupted_store
    harm, what = DAMAGE[damage]
    harm(store / variable / "c" / chunk)
    message = f"{where} of '{variable}': a chunk {what}"
    with pytest.raises(DamagedStoreError, match=rf"store '{store}' is damaged: {message}"):
        nbody_dask.open_trajectory(store).load()
    info = CliRunner().invoke(main, ["info", str(store)])
    assert info.exit_code == 1 and message in info.output, info.output


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_ids_left_unindexed_are_checked_where_read(interrupted_store, damage):
    """``open_trajectory(index=False)`` reads no body id here: the ids are a lazy coordinate
    whose chunks are checked (and a deleted one found at once) as the masses are."""
    store = interrupted_store
    sound = nbody_dask.open_trajectory(store, index=False)
    assert "body" not in sound.indexes and sound.body.chunks is not None
    np.testing.assert_array_equal(sound.body.values, np.arange(64))
    harm, what = DAMAGE[damage]
    harm(store / "body" / "c" / "0")
    message = f"bodies 0..63 of 'body': a chunk {what}"
    with pytest.raises(DamagedStoreError, match=message):
        nbody_dask.open_trajectory(store, index=False).body.load()
