"""simulate() with no client as newcomers call it: no ``__main__`` guard, stdin, REPL, notebook.

The default cluster used to spawn worker processes, which re-import an unguarded script:
220 lines of tracebacks ending in ``Nanny failed to start`` and the user's code run twice.
Each case runs a real simulation in a fresh interpreter, counts how often the user's
top-level code ran and opens the trajectory it wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import nbody_dask
    print("USER-CODE-RAN", flush=True)
    bodies = nbody_dask.plummer(48, seed=3)
    traj = nbody_dask.simulate(bodies, steps=4, dt=0.01, softening=0.05,
                               snapshot_every=2, store={store!r}, progress=False)
    print("FINAL", traj.sizes["time"], flush=True)
""")


def _run(args, tmp_path, stdin=None, env=None):
    return subprocess.run(args, input=stdin, capture_output=True, text=True, cwd=tmp_path,
                          timeout=240, env={**os.environ, **(env or {})})


def _check(proc, store):
    import nbody_dask

    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert proc.stdout.count("USER-CODE-RAN") == 1, out[-3000:]
    assert "FINAL 3" in proc.stdout
    assert "Traceback" not in out, out[-3000:]
    assert nbody_dask.open_trajectory(store).sizes["time"] == 3


@pytest.mark.parametrize("how", ["file", "stdin", "dash-c", "repl"])
def test_unguarded_script_runs_once(tmp_path, how):
    store = tmp_path / "run.zarr"
    code = SCRIPT.format(store=str(store))
    if how == "file":
        (tmp_path / "first.py").write_text(code)
        proc = _run([sys.executable, "first.py"], tmp_path)
    elif how == "stdin":
        proc = _run([sys.executable, "-"], tmp_path, stdin=code)
    elif how == "repl":  # the interactive interpreter, fed line by line
        proc = _run([sys.executable, "-i", "-q"], tmp_path, stdin=code + "\n")
    else:
        proc = _run([sys.executable, "-c", code], tmp_path)
    _check(proc, store)


@pytest.mark.slow
def test_one_cell_notebook(tmp_path):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    store = tmp_path / "nb.zarr"
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        SCRIPT.format(store=str(store)))])
    nbclient.NotebookClient(book, timeout=240, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in book.cells[0].outputs)
    assert text.count("USER-CODE-RAN") == 1 and "FINAL 3" in text


@pytest.mark.slow
def test_worker_processes_remain_an_option(tmp_path):
    """``processes: true`` still works for a guarded script (and is what the guard is for)."""
    store = tmp_path / "procs.zarr"
    code = "if __name__ == '__main__':\n" + textwrap.indent(SCRIPT.format(store=str(store)), "    ")
    (tmp_path / "guarded.py").write_text(code)
    proc = _run([sys.executable, "guarded.py"], tmp_path,
                env={"DASK_NBODY__LOCAL_CLUSTER__PROCESSES": "true"})
    _check(proc, store)
