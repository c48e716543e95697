"""The command line: run with options or a config file, info, and one-line errors."""

from __future__ import annotations

import pytest
import xarray as xr
from click.testing import CliRunner

from nbody_dask.cli import main
from nbody_dask.testing import direct_sum_reference


@pytest.fixture
def runner():
    return CliRunner()


@pytest.mark.slow
def test_run_with_config_file_then_info(runner, tmp_path):
    store = tmp_path / "cfg.zarr"
    config = tmp_path / "run.toml"
    config.write_text(f'ic = "plummer"\nn = 200\nsteps = 20\nsnapshot-every = 5\n'
                      f'dtype = "float32"\nstore = "{store}"\n')
    result = runner.invoke(main, ["run", "--config", str(config), "--no-progress",
                                  "--steps", "10"])
    assert result.exit_code == 0, result.output
    ds = xr.open_zarr(store)
    assert ds.sizes["body"] == 200 and ds.position.dtype == "float32"
    assert list(ds.step.values) == [0, 5, 10]  # the command line wins over the file
    info = runner.invoke(main, ["info", str(store)])
    assert info.exit_code == 0
    assert "200" in info.output and "3 committed" in info.output


def test_yaml_config(runner, tmp_path):
    store = tmp_path / "y.zarr"
    config = tmp_path / "run.yaml"
    config.write_text(f"ic: kepler\nsteps: 8\nsnapshot_every: 4\nstore: {store}\n")
    result = runner.invoke(main, ["run", "--config", str(config), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert xr.open_zarr(store).sizes["body"] == 2


def test_every_simulate_option_has_a_flag(runner, tmp_path):
    """G, split-every and backend reach simulate(): the store records them."""
    import inspect
    import json

    import nbody_dask
    from nbody_dask.cli import run

    flags = {p.name for p in run.params}
    wanted = set(inspect.signature(nbody_dask.simulate).parameters) - {
        "bodies", "client", "resume", "callback"}
    assert wanted <= flags, wanted - flags
    store = tmp_path / "g.zarr"
    result = runner.invoke(main, ["run", "--ic", "kepler", "--steps", "4", "--no-progress",
                                  "-G", "2.5", "--split-every", "3", "--backend", "cpu",
                                  "--layout", "rows", "--store", str(store)])
    assert result.exit_code == 0, result.output
    ds = xr.open_zarr(store)
    assert ds.attrs["G"] == 2.5 and ds.attrs["backend"] == "cpu"
    assert ds.attrs["layout"] == "rows"
    assert json.loads(ds.attrs["config"])["split_every"] == 3


@pytest.mark.parametrize(("args", "code", "message"), [
    (["run", "--dt", "-1", "--no-progress"], 1, "Error: dt must be > 0, got -1.0"),
    (["run", "--steps", "abc"], 2, "'abc' is not a valid integer"),
    (["run", "--ic", "galaxy"], 2, "'galaxy' is neither one of plummer"),
    (["run", "--layout", "grid"], 2, "'grid' is not one of 'pairs', 'rows'"),
    (["ic", "plummer", "ic.npz", "-p", "radius"], 2, "expected KEY=VALUE, got 'radius'"),
    (["ic", "plummer", "ic.npz", "-p", "radius=2"], 1,
     "plummer initial conditions: plummer() got an unexpected keyword argument 'radius'"),
    (["ic", "disk", "ic.txt"], 1, "cannot tell the format of 'ic.txt'"),
    (["ic", "disk", "ic.npz", "-n", "0"], 1, "Error: n must be >= 1, got 0"),
    (["plot", "nowhere.zarr"], 1, "Error: no trajectory store at 'nowhere.zarr'"),
    (["run", "--config", "missing.toml"], 2, "cannot read 'missing.toml'"),
    (["info", "nowhere.zarr"], 1, "Error: no trajectory store at 'nowhere.zarr'"),
])
def test_errors_are_one_line(runner, tmp_path, monkeypatch, args, code, message):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, args)
    assert result.exit_code == code
    assert message in result.output
    assert "Traceback" not in result.output


def test_existing_store_is_refused(runner, tmp_path):
    store = tmp_path / "s.zarr"
    args = ["run", "--ic", "kepler", "--steps", "2", "--store", str(store), "--no-progress"]
    assert runner.invoke(main, args).exit_code == 0
    again = runner.invoke(main, args)
    assert again.exit_code == 1 and "--overwrite" in again.output
    assert runner.invoke(main, [*args, "--overwrite"]).exit_code == 0


def test_unknown_key_in_config(runner, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("stepz = 3\n")
    result = runner.invoke(main, ["run", "--config", str(config)])
    assert result.exit_code == 2 and "unknown option(s)" in result.output


def test_bench_writes_json(runner, tmp_path, monkeypatch):
    import json
    import math

    from nbody_dask import benchmark

    monkeypatch.setattr(benchmark, "find_reference", lambda path=None: None)
    out = tmp_path / "bench.json"
    result = runner.invoke(main, ["bench", "--n", "600", "--steps", "20", "--dtype", "float64",
                                  "--backend", "cpu", "--no-kernel-sweep", "--strong", "600",
                                  "--weak", "300", "--workers", "1,2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    run, *scaling = data["results"]
    assert run["kind"] == "simulate" and run["n"] == 600 and run["timed_steps"] == 10
    assert run["gint_s"] == pytest.approx(600**2 / run["seconds_per_step"] / 1e9, nan_ok=True)
    strong, weak = scaling[:2], scaling[2:]
    assert [(r["scaling"], r["workers"], r["n"]) for r in strong] == [("strong", 1, 600),
                                                                       ("strong", 2, 600)]
    assert [(r["scaling"], r["workers"], r["n"]) for r in weak] == [("weak", 1, 300),
                                                                     ("weak", 2, 600)]
    # N = 600 is far too small to time reliably: only the bookkeeping is checked here
    assert strong[0]["speedup"] == 1 or math.isnan(strong[0]["speedup"])
    assert all(not r["seconds_per_step"] <= 0 for r in scaling)
    assert "| strong | 2 | 600 |" in result.output and "Gint/s" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("pytreegrav", [True, False])
def test_bench_tree_reports_an_evaluation_and_the_ratio_to_pytreegrav(runner, tmp_path,
                                                                       monkeypatch,
                                                                       pytreegrav):
    """bench --method tree: a simulate() step, one evaluation with its force errors, and
    pytreegrav's time and errors on the same bodies with the ratio (when installed)."""
    import json

    from nbody_dask import benchmark

    monkeypatch.setattr(benchmark, "find_reference", lambda path=None: None)
    import sys

    if pytreegrav:  # a stand-in with pytreegrav's interface: a direct sum, slow on purpose
        import time
        import types

        def accel(pos, m, theta, method, parallel):
            time.sleep(0.2)
            return direct_sum_reference(pos, m, 0.0)[0]

        monkeypatch.setitem(sys.modules, "pytreegrav", types.SimpleNamespace(Accel=accel))
    else:
        monkeypatch.setitem(sys.modules, "pytreegrav", None)  # import fails: not installed
    out = tmp_path / "bench.json"
    result = runner.invoke(main, ["bench", "--n", "500", "--n", "900", "--steps", "20",
                                  "--method", "tree", "--theta", "0.5", "--no-kernel-sweep",
                                  "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    ours = [r for r in rows if r["kind"] == "evaluation"]
    assert [(r["n"], r["theta"]) for r in ours] == [(500, 0.5), (900, 0.5)]
    assert all(0 < r["median"] <= r["p99"] <= r["max"] < 0.05 for r in ours)
    assert "one evaluation N=900, tree theta=0.5" in result.output
    assert "tree: cost per body x" in result.output
    if pytreegrav:
        theirs = [r for r in rows if r["kind"] == "pytreegrav"]
        assert [r["n"] for r in theirs] == [500, 900] and theirs[0]["max"] < 1e-12
        assert ours[1]["ratio_to_pytreegrav"] == ours[1]["seconds"] / theirs[1]["seconds"]
        assert "ratio" in result.output and "(worse median)" in result.output
    else:
        assert "pytreegrav is not installed" in result.output


def test_kernel_sweep_counts_both_directions_of_the_symmetric_kernel():
    from nbody_dask import benchmark

    plain = benchmark.kernel_sweep(sources=(64, 300), n_targets=128, reps=1)
    both = benchmark.kernel_sweep(sources=(64, 300), n_targets=128, reps=1, symmetric=True)
    assert [(k["n_targets"], k["n_sources"]) for k in plain] == [(128, 64), (128, 300)]
    assert [k["kind"] for k in both] == ["kernel-symmetric"] * 2
    assert all(k["gint_s"]["median"] > 0 for k in plain + both)


def test_kernel_timings_repeat_short_calls():
    import time

    from nbody_dask import benchmark

    calls = []

    def kernel():  # a 10 ms "kernel" of 1e7 interactions: 1 Gint/s at most
        calls.append(1)
        time.sleep(0.01)

    rates = benchmark._call_rates(kernel, 10**7, reps=2, min_seconds=0.05)
    per_rep = (len(calls) - 2) / 2  # one untimed call to compile, one to size the reps
    assert len(rates) == 2 and per_rep == int(per_rep) and 2 <= per_rep <= 5
    assert all(0.3 < r <= 1.0 for r in rates)


def test_bench_rejects_bad_worker_counts(runner):
    result = runner.invoke(main, ["bench", "--workers", "1,x", "--no-kernel-sweep"])
    assert result.exit_code == 2 and "--workers" in result.output


def test_resume_command(runner, tmp_path):
    store = tmp_path / "r.zarr"
    args = ["run", "--ic", "kepler", "--steps", "6", "--snapshot-every", "2", "--store",
            str(store), "--no-progress"]
    assert runner.invoke(main, args).exit_code == 0
    result = runner.invoke(main, ["resume", str(store), "--no-progress"])
    assert result.exit_code == 0 and "4 committed" in result.output
    missing = runner.invoke(main, ["resume", str(tmp_path / "none.zarr"), "--no-progress"])
    assert missing.exit_code == 1 and "no trajectory store" in missing.output


def test_ic_then_run_from_file_then_plot(runner, tmp_path):
    from PIL import Image

    ic_file = tmp_path / "disk.npz"
    result = runner.invoke(main, ["ic", "disk", str(ic_file), "-n", "300", "-p", "toomre_q=1.5"])
    assert result.exit_code == 0, result.output
    assert "wrote 300 bodies (disk)" in result.output
    again = runner.invoke(main, ["ic", "disk", str(ic_file), "-n", "300"])
    assert again.exit_code == 1 and "exists; pass overwrite=True (--overwrite)" in again.output

    store = tmp_path / "disk.zarr"
    result = runner.invoke(main, ["run", "--ic", str(ic_file), "--steps", "20", "--dt", "0.01",
                                  "--snapshot-every", "5", "--store", str(store),
                                  "--no-progress"])
    assert result.exit_code == 0, result.output
    assert xr.open_zarr(store).sizes == {"time": 5, "body": 300, "axis": 3}

    result = runner.invoke(main, ["plot", str(store), "--kind", "positions", "--kind",
                                  "conservation", "--kind", "lagrangian", "--kind",
                                  "animation", "--snapshot", "0", "--snapshot", "-1"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "disk-plots"
    for name in ("positions.png", "conservation.png", "lagrangian.png", "animation.gif"):
        with Image.open(folder / name) as image:
            image.verify()  # a valid, complete image file
            assert image.format == ("GIF" if name.endswith(".gif") else "PNG")
    with Image.open(folder / "animation.gif") as image:
        assert image.n_frames == 5
    refused = runner.invoke(main, ["plot", str(store)])
    assert refused.exit_code == 1 and "positions.png' exists" in refused.output
    assert runner.invoke(main, ["plot", str(store), "--overwrite"]).exit_code == 0


@pytest.mark.parametrize(("text", "message"), [
    ("steps = 2.7\n", "steps in {path!r} must be an integer, got 2.7"),
    ("steps = true\n", "steps in {path!r} must be an integer, got True"),
    ("n = [64]\n", "n in {path!r} must be an integer, got [64]"),
    ("dt = \"fast\"\n", "dt in {path!r} must be a number, got 'fast'"),
    ("overwrite = 1\n", "overwrite in {path!r} must be true or false, got 1"),
])
def test_config_values_are_not_coerced(runner, tmp_path, text, message):
    """Before: `steps = 2.7` ran 2 steps, `steps: true` ran 1, `n: [64]` a traceback."""
    path = tmp_path / "c.toml"
    path.write_text(text)
    result = runner.invoke(main, ["run", "--config", str(path), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert message.format(path=str(path)) in result.output
    assert isinstance(result.exception, SystemExit)  # click's usage error, no traceback


def test_yaml_config_list_value_is_one_line(runner, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("n: [64]\n")
    result = runner.invoke(main, ["run", "--config", str(path)])
    assert result.exit_code == 2 and "n in" in result.output and "must be an integer" in \
        result.output
    assert isinstance(result.exception, SystemExit)


def test_unparsable_ic_parameter_is_one_line(runner, tmp_path):
    result = runner.invoke(main, ["ic", "plummer", str(tmp_path / "ic.npz"), "-p", "k=[1"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "cannot read the value of 'k=[1'" in result.output


def test_non_json_scheduler_file_is_one_line(runner, tmp_path):
    bad = tmp_path / "scheduler.json"
    bad.write_text("not json at all")
    result = runner.invoke(main, ["run", "--n", "8", "--steps", "1", "--no-progress",
                                  "--scheduler-file", str(bad)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.strip() == (f"Error: {str(bad)!r} is not a Dask scheduler file (JSON "
                                     "with an 'address', as `dask scheduler --scheduler-file` "
                                     "writes)")


def test_export_never_replaces_its_source(client, tmp_path):
    """`export run.zarr run.zarr --overwrite` destroyed the trajectory and exited 0
    (issue 33, item 5): now one line, exit 1, the trajectory intact."""
    import nbody_dask

    store = tmp_path / "run.zarr"
    nbody_dask.simulate(nbody_dask.plummer(16, seed=0), steps=2, dt=0.01, store=store,
                        client=client, progress=False)
    runner = CliRunner()
    for output in (str(store), str(store) + "/", str(tmp_path / "." / "run.zarr")):
        result = runner.invoke(main, ["export", str(store), output, "--overwrite"])
        assert result.exit_code == 1 and "OUTPUT" in result.output and "is SOURCE" in \
            result.output, result.output
    assert nbody_dask.open_trajectory(store).sizes["time"] == 2


def test_abandoned_store_requests_that_fail_later_stay_quiet(caplog):
    """A request the run gave up on (timed out, or its connection dropped with the
    endpoint) may fail inside the object store's client after the one-line error;
    asyncio's note about it is dropped, any other stays."""
    import asyncio
    import gc

    from aiohttp import ClientConnectionResetError

    from nbody_dask.location import quiet_abandoned_requests

    quiet_abandoned_requests()

    async def fail(error):
        raise error

    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level("ERROR", logger="asyncio"):
            for error in (TimeoutError("Timeout"), ValueError("kept"),
                          ClientConnectionResetError("Cannot write to closing transport")):
                task = loop.create_task(fail(error))
                loop.run_until_complete(asyncio.sleep(0.01))
                del task
                gc.collect()
    finally:
        loop.close()
    messages = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert [type(e) for e in messages] == [ValueError]
