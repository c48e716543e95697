"""The nbody namespace of dask.config: defaults, schema, environment overrides."""

from __future__ import annotations

import copy
import subprocess
import sys

import dask.config
import jsonschema
import pytest
import yaml

from nbody_dask.config import DEFAULTS_FILE

SCHEMA = yaml.safe_load(DEFAULTS_FILE.with_name("nbody-schema.yaml").read_text())
DEFAULTS = yaml.safe_load(DEFAULTS_FILE.read_text())


def test_defaults_validate_against_the_schema():
    jsonschema.validate(DEFAULTS, SCHEMA)


def test_every_key_is_described():
    described = SCHEMA["properties"]["nbody"]["properties"]
    assert set(described) == set(DEFAULTS["nbody"])
    for section in ("local-cluster", "kubernetes"):
        assert set(described[section]["properties"]) == set(DEFAULTS["nbody"][section])


@pytest.mark.parametrize("path, value", [
    (("dtype",), "float16"),
    (("split-every",), 1),
    (("tile-size",), 0),
    (("tile_size",), 64),  # a typo is an unknown key
    (("local-cluster", "n-workers"), "two"),
])
def test_bad_values_are_rejected(path, value):
    config = copy.deepcopy(DEFAULTS)
    node = config["nbody"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, SCHEMA)


def test_loaded_into_dask_config():
    assert dask.config.get("nbody.split-every") == DEFAULTS["nbody"]["split-every"]


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("DASK_NBODY__DTYPE", "float32")
    monkeypatch.setenv("DASK_NBODY__LOCAL_CLUSTER__N_WORKERS", "2")
    out = subprocess.run(
        [sys.executable, "-c", "import dask.config, nbody_dask; "
         "print(dask.config.get('nbody.dtype'), dask.config.get('nbody.local-cluster.n-workers'))"],
        capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["float32", "2"]


@pytest.mark.parametrize("key, value, match", [
    ("nbody.lease.heartbeat", 0, r"nbody\.lease\.heartbeat: 0 is less than or equal to"),
    ("nbody.max-restarts", -1, r"nbody\.max-restarts: -1 is less than the minimum of 0"),
    ("nbody.kernel-threads", -3, r"nbody\.kernel-threads: -3 is less than the minimum of 1"),
    ("nbody.local-cluster.n-workers", 0, r"nbody\.local-cluster\.n-workers: 0 is less than"),
    ("nbody.lookahead", "two", r"nbody\.lookahead: 'two' is not of type 'integer'"),
])
def test_settings_in_force_are_checked_before_any_work(no_cluster, key, value, match):
    """A configuration that makes no sense is refused in one line naming the key and the
    value, before a cluster starts (issue 33, item 12: a 0 s heartbeat was a busy loop of
    LIST+PUT on S3, n-workers 0 a ZeroDivisionError)."""
    import nbody_dask

    with dask.config.set({key: value}):
        with pytest.raises(ValueError, match=match):
            nbody_dask.simulate(nbody_dask.plummer(8, seed=0), steps=1, dt=0.1,
                                progress=False)


def test_settings_from_the_environment_pass_the_check():
    """DASK_NBODY__LOCAL_CLUSTER__PROCESSES sets nbody.local_cluster (underscore), which
    dask.config reads as local-cluster: so does the check."""
    out = subprocess.run(
        [sys.executable, "-c", "from nbody_dask import config; config.validate(); print('ok')"],
        capture_output=True, text=True, env={**__import__("os").environ,
                                             "DASK_NBODY__LOCAL_CLUSTER__PROCESSES": "true",
                                             "DASK_NBODY__SPLIT_EVERY": "4"})
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
