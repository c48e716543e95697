"""Force methods behind one interface (nbody_dask.methods): the registry, and a method added
from outside the package with one module's worth of code and one registration line."""

from __future__ import annotations

import numpy as np
import pytest

import nbody_dask
from nbody_dask import methods, tasks
from nbody_dask.graph import close_targets
from nbody_dask.plan import Plan, check_method, reduction_groups


class PlainPairs(methods.ForceMethod):
    """A toy method: direct summation by the plain kernel, a task per ordered tile pair
    (the direct method without its symmetric kernel), written against the interface only."""

    name = "toy-plain-pairs"

    def tile_size(self, n, threads, workers, layout, backend):
        return max(1, -(-n // 3))

    def tasks_per_step(self, plan):
        t = plan.n_tiles
        return 1 if plan.fused else 2 * t + t * t

    def describe(self, plan):
        return "forces by the toy method"

    def evaluate(self, ev, dsk, tiles, state):
        yield from ()  # the graph never depends on data
        parts = []
        for i in range(len(tiles)):
            parts.append([])
            for j in range(len(tiles)):
                name = ev.key("pair", i, j)
                dsk[name] = (tasks.pair_forces, tiles[i], tiles[j], ev.forces)
                parts[i].append((name, None))
        return dsk, close_targets(ev, dsk, tiles, parts,
                                  lambda count: reduction_groups(count, ev.plan.split_every)
                                  ), None


TOY = methods.register(PlainPairs())  # the one registration line


def test_a_method_registered_from_outside_runs_in_simulate(client, tmp_path):
    """simulate(method=...) runs the toy through the plan, the graph, the driver and the
    store, and gives the bits of the direct method without the symmetric kernel."""
    import dask

    ds = nbody_dask.plummer(90, seed=3)
    kw = dict(steps=6, dt=1 / 64, softening=0.05, snapshot_every=3, tile_size=30,
              split_every=2, client=client, progress=False)
    toy = nbody_dask.simulate(ds, method=TOY.name, store=tmp_path / "toy.zarr", **kw)
    with dask.config.set({"nbody.symmetric": False}):
        direct = nbody_dask.simulate(ds, method="direct", **kw)
    assert toy.attrs["method"] == TOY.name
    for name in ("position", "velocity", "total_energy"):
        np.testing.assert_array_equal(toy[name].values, direct[name].values)
    resumed = nbody_dask.simulate(store=tmp_path / "toy.zarr", resume=True, client=client)
    assert resumed.sizes["time"] == 3


def test_registry_names_and_errors():
    assert {"direct", "tree", TOY.name} <= set(methods.names())
    assert methods.get("tree").name == "tree" and check_method("auto") == "auto"
    with pytest.raises(ValueError, match="method must be one of .*got 'nope'"):
        methods.get("nope")
    with pytest.raises(ValueError, match="method must be one of"):
        Plan(n=10, steps=1, dt=0.1, method="nope")
    with pytest.raises(TypeError, match="named ForceMethod"):
        methods.register(object())


def test_plans_check_every_value_themselves():
    """A plan built by hand or read from a store is checked like simulate()'s arguments."""
    for bad, match in ((dict(theta=5.0), r"theta must be in \(0, 1\], got 5.0"),
                       (dict(theta=0.0), "theta must be > 0"),
                       (dict(leaf_size=0), "leaf_size must be >= 1"),
                       (dict(split_every=1), "split_every must be >= 2"),
                       (dict(dt=-1.0), "dt must be > 0"),
                       (dict(dtype="float16"), "dtype must be one of"),
                       (dict(backend="gpu"), "backend must be one of"),
                       (dict(layout="grid"), "layout must be one of"),
                       (dict(retile_every=0), "retile_every must be >= 1"),
                       (dict(leaf_size=10**30), r"leaf_size must be < 2\*\*63, got 10+$"),
                       (dict(method="tree", backend="cuda"), "method='tree' runs on CPUs")):
        with pytest.raises((ValueError, TypeError), match=match):
            Plan(**{"n": 10, "steps": 1, "dt": 0.1, **bad})
    stored = Plan(n=10, steps=1, dt=0.1, method="tree").stored()
    with pytest.raises(ValueError, match="theta must be in"):
        Plan.from_stored({**stored, "theta": 5}, 10)
