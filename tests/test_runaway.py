"""Runaway numbers: a run stops at the first non-finite state, and overflowing input is refused.

Before, ``--dt 1e300`` or a float32 overflow was integrated and written to every remaining
snapshot, and the CLI exited 0 with ``max |E/E0 - 1| = nan``.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import nbody_dask
from nbody_dask.cli import main
from nbody_dask.storage import committed_snapshots


def test_cli_stops_at_first_non_finite_step(tmp_path):
    store = tmp_path / "huge-dt.zarr"
    result = CliRunner().invoke(main, ["run", "--n", "64", "--steps", "6", "--dt", "1e300",
                                       "--snapshot-every", "2", "--no-progress",
                                       "--store", str(store)])
    assert result.exit_code != 0
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: the state is not finite after step 1:"), result.output
    assert "Traceback" not in result.output
    # the initial snapshot was committed before the failure and is intact
    assert committed_snapshots(store) == 1
    traj = nbody_dask.open_trajectory(store).load()
    assert np.isfinite(traj.position.values).all() and traj.sizes["time"] == 1


def test_float32_overflow_stops_with_earlier_snapshots_intact(client, tmp_path):
    bodies = nbody_dask.plummer(40, seed=2)
    store = tmp_path / "f32.zarr"
    # float32 holds dt = 1e30, but v_half * dt leaves its range within a step or two
    with pytest.raises(nbody_dask.NonFiniteStateError, match=r"after step \d+: .* float32"):
        nbody_dask.simulate(bodies, steps=50, dt=1e30, softening=0.05, dtype="float32",
                            store=store, snapshot_every=1, client=client, progress=False)
    traj = nbody_dask.open_trajectory(store).load()
    assert traj.sizes["time"] >= 1
    assert np.isfinite(traj.position.values).all()
    assert np.array_equal(traj.position.values[0], bodies.position.values.astype(np.float32))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"dtype": "float32", "dt": 1e300}, r"dt=1e\+300 is not representable in float32"),
    ({"dtype": "float32", "dt": 1e-50}, r"dt=1e-50 is not representable in float32"),
    ({"dtype": "float32", "softening": 1e30}, "softening_squared=.* float32"),
    ({"dtype": "float32", "position_scale": 1e30}, "position reaches .* float32"),
    ({"dtype": "float64", "position_scale": 1e160}, "position reaches .* float64"),
    ({"dtype": "float32", "position_scale": 1e-17, "softening": 0.0},
     r"position spans only .* overflow float32"),
])
def test_values_beyond_the_dtype_are_refused_before_work(no_cluster, tmp_path, kwargs, match):
    bodies = nbody_dask.plummer(8, seed=1)
    scale = kwargs.pop("position_scale", None)
    if scale is not None:
        bodies = bodies.assign(position=bodies.position * scale)
    args = {"steps": 2, "dt": 0.01, "softening": 0.01, **kwargs}
    store = tmp_path / "never.zarr"
    with pytest.raises(ValueError, match=match):
        nbody_dask.simulate(bodies, store=store, progress=False, **args)
    assert not store.exists()


def test_tiny_scales_pass_where_the_dtype_or_softening_holds_them():
    """The spacing check refuses only what overflows: float64 holds bodies 1e-17 apart, and
    a softening float32 holds keeps their forces finite."""
    from nbody_dask.bodies import check_fits_dtype

    bodies = nbody_dask.plummer(8, seed=1)
    tiny = bodies.assign(position=bodies.position * 1e-17)
    check_fits_dtype(tiny, "float64", softening=0.0)
    check_fits_dtype(tiny, "float32", softening=1e-3)
    with pytest.raises(ValueError, match="position spans only"):
        check_fits_dtype(tiny, "float32", softening=0.0)


def test_coincident_bodies_without_softening_stay_finite(client):
    """Two bodies at one point with softening 0: zero force between them, not NaN."""
    bodies = nbody_dask.make_bodies(position=[[0.0, 0, 0], [0.0, 0, 0], [1.0, 0, 0]],
                                    velocity=np.zeros((3, 3)), mass=[1.0, 1.0, 1.0])
    traj = nbody_dask.simulate(bodies, steps=3, dt=0.01, softening=0.0, client=client,
                               progress=False)
    assert np.isfinite(traj.position.values).all()


def test_energy_error_bound_stops_the_run(client, tmp_path):
    store = tmp_path / "drift.zarr"
    kw = dict(steps=8, dt=0.05, softening=0.01, snapshot_every=2, client=client,
              progress=False)
    with pytest.raises(nbody_dask.EnergyErrorExceeded,
                       match=r"energy error .* at step 2 exceeds max_energy_error=1e-12"):
        nbody_dask.simulate(nbody_dask.plummer(32, seed=1), store=store,
                            max_energy_error=1e-12, **kw)
    assert committed_snapshots(store) == 2  # snapshot 0 and the one that broke the bound
    loose = nbody_dask.simulate(nbody_dask.plummer(32, seed=1), max_energy_error=0.5, **kw)
    assert loose.sizes["time"] == 5


def test_energy_error_bound_from_the_cli_and_on_resume(tmp_path):
    store = tmp_path / "drift-cli.zarr"
    args = ["run", "--n", "32", "--steps", "8", "--dt", "0.05", "--snapshot-every", "2",
            "--no-progress", "--store", str(store)]
    result = CliRunner().invoke(main, [*args, "--max-energy-error", "1e-12"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: energy error ") and "at step 2" in result.output
    # resume checks against the same E0 (snapshot 0), so the bound stops it again at once
    again = CliRunner().invoke(main, ["resume", str(store), "--no-progress",
                                      "--max-energy-error", "1e-12"])
    assert again.exit_code == 1 and "exceeds max_energy_error=1e-12" in again.output
    done = CliRunner().invoke(main, ["resume", str(store), "--no-progress"])
    assert done.exit_code == 0, done.output


def test_bad_energy_bound_is_refused(no_cluster):
    with pytest.raises(ValueError, match="max_energy_error must be > 0, got -1"):
        nbody_dask.simulate(nbody_dask.plummer(8), steps=1, dt=0.1, max_energy_error=-1)


def test_cli_says_it_in_one_line_without_the_workers_report(tmp_path):
    """distributed's "Compute Failed" block (task, traceback) is not printed before the
    CLI's one line: the driver says it (issue 33, item 13)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "nbody_dask.cli", "run", "--n", "64",
                           "--steps", "4", "--dt", "1e300", "--no-progress", "--store",
                           str(tmp_path / "huge-dt.zarr")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "Compute Failed" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("Error: the state is not finite after step 1:"), proc.stderr
