"""overwrite deletes only what nbody_dask wrote; store strings never become odd local folders.

Before: any folder with a top-level ``zarr.json`` was wiped by ``overwrite``, unrelated files
included; ``--store ""`` was read as ``.`` and emptied the working directory before failing;
``store="s3://bucket/run.zarr"`` wrote a local folder named ``s3:`` and reported success.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import nbody_dask
from nbody_dask.cli import main


def _run(store, **kwargs):
    return nbody_dask.simulate(nbody_dask.plummer(16, seed=1), steps=2, dt=0.01,
                               softening=0.05, store=store, progress=False, **kwargs)


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def test_foreign_zarr_group_with_an_unrelated_file_is_kept(no_cluster, tmp_path):
    store = tmp_path / "theirs.zarr"
    root = zarr.open_group(store, mode="w", zarr_format=3)
    root.create_array("x", data=np.arange(4))
    (store / "notes.txt").write_text("my thesis")
    before = _snapshot(store)
    with pytest.raises(ValueError, match="nbody_dask did not write"):
        _run(store, overwrite=True)
    assert _snapshot(store) == before


def test_own_store_with_an_added_file_is_kept(client, tmp_path):
    store = tmp_path / "run.zarr"
    _run(store, client=client)
    (store / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="entries nbody_dask did not write: notes.txt"):
        _run(store, overwrite=True, client=client)
    assert (store / "notes.txt").read_text() == "keep me"
    (store / "notes.txt").unlink()
    _run(store, overwrite=True, client=client)  # its own store alone: replaced


@pytest.mark.parametrize("store", ["", "   ", ".", "..", "~", "/"])
def test_working_directory_home_and_root_are_never_deleted(no_cluster, tmp_path, monkeypatch,
                                                           store):
    work = tmp_path / "work"
    work.mkdir()
    (work / "precious.txt").write_text("data")
    (work / "zarr.json").write_text('{"attributes": {"nbody_dask_version": "0"}}')
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work))
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError, match="store"):
        _run(store, overwrite=True)
    assert _snapshot(tmp_path) == before


def test_cli_empty_store_is_one_line_and_deletes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "precious.txt").write_text("data")
    result = CliRunner().invoke(main, ["run", "--n", "16", "--steps", "1", "--no-progress",
                                       "--store", "", "--overwrite"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: store must name a directory, got ''"
    assert sorted(os.listdir(tmp_path)) == ["precious.txt"]


@pytest.mark.parametrize("url", ["memory://run.zarr", "https://example.org/r.zarr",
                                 "ftp://host/r.zarr"])
def test_urls_without_atomic_create_are_refused_not_made_into_folders(no_cluster, tmp_path,
                                                                      monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    scheme = url.split(":")[0]
    with pytest.raises(ValueError, match=f"{scheme}:// is not supported: a store needs an "
                                         "object store whose exclusive create is atomic"):
        _run(url)
    with pytest.raises(ValueError, match="is not supported"):
        nbody_dask.open_trajectory(url)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("url, why", [
    ("s3://bucket", "is a whole bucket; name a prefix in it"),
    ("s3:///run.zarr", "names no bucket"),
])
def test_object_store_urls_must_name_a_prefix(no_cluster, url, why):
    with pytest.raises(ValueError, match=why):
        _run(url)


def test_storage_options_need_an_object_store(no_cluster, tmp_path):
    with pytest.raises(ValueError, match="storage_options are for object-store URLs"):
        _run(tmp_path / "a.zarr", storage_options={"key": "k"})
    with pytest.raises(ValueError, match="no store given"):
        _run(None, storage_options={"key": "k"})
    with pytest.raises(TypeError, match="storage_options must be a dict, got str"):
        _run("s3://bucket/a.zarr", storage_options="key=k")


def test_file_url_and_home_are_local_paths(client, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _run(f"file://{tmp_path}/by-url.zarr", client=client)
    assert nbody_dask.open_trajectory(tmp_path / "by-url.zarr").sizes["time"] == 2
    _run("~/by-home.zarr", client=client)
    assert nbody_dask.open_trajectory("~/by-home.zarr").sizes["time"] == 2


def test_a_missing_object_store_library_names_the_extra(no_cluster):
    import importlib.util

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    with pytest.raises(ImportError, match=r"pip install 'nbody-dask\[gcs\]'"):
        _run("gs://bucket/run.zarr")


def test_a_folder_left_by_a_run_killed_while_starting_is_reused(client, tmp_path):
    """A store directory holding only a dead run's lease (SIGKILL before the store was laid
    out) is no store: a new run takes it without --overwrite, and over it with
    (issue 33, item 11)."""
    import json
    import os
    import socket

    store = tmp_path / "killed.zarr"
    store.mkdir()
    dead = {"run_id": "d" * 32, "host": socket.gethostname(), "pid": os.getpid(),
            "pid_started": 0.0, "started": 0.0, "heartbeat": 0.0}
    (store / "writer.lease.0").write_text(json.dumps(dead))
    kw = dict(steps=2, dt=0.01, store=store, client=client, progress=False)
    traj = nbody_dask.simulate(nbody_dask.plummer(16, seed=1), **kw)
    assert traj.sizes["time"] == 2
    (store / "writer.lease.7").write_text(json.dumps(dead))  # a newer dead one: still ours
    with pytest.raises(FileExistsError):  # a real store now: overwrite is needed
        nbody_dask.simulate(nbody_dask.plummer(16, seed=1), **kw)
    assert nbody_dask.simulate(nbody_dask.plummer(16, seed=1), overwrite=True,
                               **kw).sizes["time"] == 2


def test_scheme_case_does_not_matter(no_cluster):
    """S3://b/x is s3://b/x, not a bucket named 'S3:' (issue 33, item 14)."""
    pytest.importorskip("s3fs")
    from nbody_dask.location import store_location

    assert store_location("S3://bucket/run.zarr").url == "s3://bucket/run.zarr"
