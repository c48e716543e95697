"""The same bits before and after a refactoring: SHA-256 of final states of fixed runs.

Every run below is deterministic for a given machine code: its final positions and
velocities hash to a value recorded in ``same_bits.json``, per CPU (the host CPU that
Numba compiles for: vector width and fused multiply-adds change the last bits from one CPU
model to another, never from one run to the next). A change that alters any result, by a
summation order, a kernel rewrite or a changed default, fails here; a change meant to alter
results re-records the hashes in its own commit, saying why::

    python tests/test_same_bits.py --record

On a CPU with no recorded hashes the test skips, saying so, rather than fail for the CPU.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import nbody_dask

RECORD = Path(__file__).with_name("same_bits.json")

#: name -> (bodies, simulate() keywords, config): direct pairs (symmetric and plain), direct
#: rows, the tree on one tile, on 3 spatial tiles and on 8 with far pairs from summaries
#: (pairs and rows), in both dtypes, and a resumed run.
CASES = {
    "direct-pairs-symmetric-float64": ("plummer-300", dict(tile_size=100), {}),
    "direct-pairs-plain-float32": ("plummer-300", dict(tile_size=100, dtype="float32"),
                                   {"nbody.symmetric": False}),
    "direct-rows-float64": ("plummer-300", dict(tile_size=100, layout="rows"), {}),
    "direct-one-tile-float32": ("plummer-300", dict(dtype="float32"), {}),
    "tree-one-tile-float32": ("plummer-2000", dict(method="tree", dtype="float32"), {}),
    "tree-3-tiles-float64": ("plummer-2000", dict(method="tree", tile_size=700), {}),
    "tree-3-tiles-float32-resumed": ("plummer-2000", dict(method="tree", tile_size=700,
                                                          dtype="float32"), {"resume": 4}),
    "tree-8-tiles-near-far-float64": ("plummer-2000", dict(method="tree", tile_size=250),
                                      {"nbody.near-far-tiles": 2}),
    "tree-8-tiles-near-far-rows-float32": ("plummer-2000", dict(method="tree", tile_size=250,
                                                                layout="rows", dtype="float32"),
                                           {"nbody.near-far-tiles": 2}),
}


def cpu_name() -> str:
    """The CPU model Numba compiles for (LLVM's name for the host)."""
    import llvmlite.binding as llvm

    return llvm.get_host_cpu_name()


def _bodies(name: str):
    kind, n = name.split("-")
    return nbody_dask.plummer(int(n), seed=7)


class _Stop(Exception):
    pass


def final_hash(case: str, client, tmp_path: Path) -> str:
    """SHA-256 of the final positions and velocities of run ``case`` (8 steps)."""
    import dask

    bodies, kw, extra = CASES[case]
    extra = dict(extra)
    resume_after = extra.pop("resume", None)
    run = dict(steps=8, dt=1 / 128, softening=0.02, snapshot_every=4, client=client,
               progress=False, **kw)
    store = tmp_path / f"{case}.zarr"
    with dask.config.set(extra):
        if resume_after is None:
            traj = nbody_dask.simulate(_bodies(bodies), store=store, **run)
        else:
            def stop(step, record):
                if step >= resume_after:
                    raise _Stop
            with pytest.raises(_Stop):
                nbody_dask.simulate(_bodies(bodies), store=store, callback=stop, **run)
            traj = nbody_dask.simulate(store=store, resume=True, client=client, progress=False)
        last = traj.isel(time=-1)
        digest = hashlib.sha256()
        for name in ("position", "velocity"):
            digest.update(np.ascontiguousarray(last[name].values).tobytes())
    return digest.hexdigest()


def _recorded() -> dict:
    return json.loads(RECORD.read_text()).get(cpu_name(), {}) if RECORD.exists() else {}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_bits_as_recorded(case, client, tmp_path):
    want = _recorded().get(case)
    if want is None:
        pytest.skip(f"no recorded final-state hash of {case!r} for CPU {cpu_name()!r} "
                    "(python tests/test_same_bits.py --record)")
    assert final_hash(case, client, tmp_path) == want, (
        f"{case}: the final state changed on CPU {cpu_name()!r}")


def _record() -> None:
    import tempfile

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c, \
            tempfile.TemporaryDirectory() as tmp:
        hashes = {case: final_hash(case, c, Path(tmp)) for case in sorted(CASES)}
    data = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    data[cpu_name()] = hashes
    RECORD.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"recorded {len(hashes)} hashes for CPU {cpu_name()!r} in {RECORD}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(__doc__)
    _record()
