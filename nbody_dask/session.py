"""A run's session around the driver: signals, the progress bar, the store's lease, the
energy bound, the temporary store of a run without one.

Each is a context manager or a small object that :func:`nbody_dask.simulate` composes; none
submits work to the cluster (that is :mod:`nbody_dask.driver`).
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import config
from .lease import StoreInUseError, WriterLease
from .location import LocalLocation, StoreLocation
from .plan import PERIODIC_CROSSOVER, TREE_CROSSOVER, Plan
from .storage import open_trajectory

__all__ = ["StopRequest", "stop_on_signals", "progress_bar", "output_location",
           "writer_lease", "EnergyBound", "EnergyErrorExceeded", "describe_method"]


class StopRequest(threading.Event):
    """Set by SIGTERM or a first Ctrl-C (SIGINT); ``signum`` says which."""

    signum: int = signal.SIGTERM


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """A stop request set by SIGTERM or Ctrl-C while the block runs (main thread only).

    Either lets the steps in flight finish and commit, then
    :class:`~nbody_dask.driver.SimulationInterrupted` is raised. After a first Ctrl-C, a
    second one interrupts at once (``KeyboardInterrupt``).
    """
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_term(signum, frame) -> None:
        stop.signum = signum
        stop.set()

    def on_interrupt(signum, frame) -> None:
        on_term(signum, frame)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("nbody-dask: Ctrl-C: finishing the steps in flight and committing them; "
              "Ctrl-C again stops at once", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, handler)
                for sig, handler in ((signal.SIGTERM, on_term), (signal.SIGINT, on_interrupt))}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def progress_bar(enabled: bool, steps: int,
                 redshift: Callable[[int], float] | None = None
                 ) -> Iterator[Callable[[int, dict | None], None]]:
    """A rich progress bar with steps/s, ETA, the relative energy error (a comoving run, whose
    energy is not conserved: the redshift after each step, ``redshift(step)``) and, when
    recorded, the median sampled force error."""
    if not enabled:
        yield lambda step, record: None
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    columns = [TextColumn("[bold]nbody"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]} steps/s"), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[energy]}")]
    start = time.perf_counter()
    energy0: list[float] = []
    with Progress(*columns) as bar:
        task = bar.add_task("steps", total=steps, rate="-", energy="")

        def report(step: int, record: dict | None) -> None:
            fields = {"rate": f"{step / max(time.perf_counter() - start, 1e-9):.1f}"}
            if redshift is not None:
                fields["energy"] = f"z = {redshift(step):.3g}"
            elif record is not None:
                if not energy0:
                    energy0.append(record["total_energy"])
                e0 = energy0[0]
                if e0 != 0:
                    fields["energy"] = f"|dE/E| {abs(record['total_energy'] / e0 - 1):.2e}"
            if record is not None and "force_error" in record:
                fields["energy"] = (f"{fields.get('energy', '')}  force error median "
                                    f"{record['force_error'][0]:.1e}")
            bar.update(task, completed=step, **fields)

        yield report


@contextmanager
def output_location(path: StoreLocation | None) -> Iterator[tuple[StoreLocation, bool]]:
    """Yield (location, temporary): the store's, or a temporary one removed afterwards."""
    if path is not None:
        yield path, False
        return
    tmp = Path(tempfile.mkdtemp(prefix="nbody-dask-"))
    try:
        yield LocalLocation(tmp / "trajectory.zarr"), True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def writer_lease(store: StoreLocation | None) -> Iterator[WriterLease | None]:
    """Hold the store's writer lease for the block (None: a private temporary store).

    A new local store's directory is created here, exclusively: of two runs starting into
    one new store, one gets it (in an object store, the lease's exclusive create decides).
    If the run ends before laying the store out, the directory goes too.
    """
    if store is None:
        yield None
        return
    created = False
    if isinstance(store, LocalLocation) and not store.exists():
        try:
            store.path.mkdir(parents=True)
        except FileExistsError:
            raise StoreInUseError(f"store {str(store)!r} appeared while this run was "
                                  "starting: another run is writing it") from None
        created = True
    lease = WriterLease(store)
    try:
        lease.acquire()
        try:
            yield lease
        finally:
            lease.release()
    finally:
        if created and not store.exists("zarr.json"):
            shutil.rmtree(store.path, ignore_errors=True)  # nothing but our lease was in it


class EnergyErrorExceeded(ArithmeticError):
    """The energy error passed ``max_energy_error``: the run stopped (its snapshots stay)."""


class EnergyBound:
    """``simulate(max_energy_error=...)``: checks each snapshot's energy against snapshot 0's."""

    def __init__(self, bound: float | None, resumed_store: StoreLocation | None) -> None:
        self.bound = bound
        self.e0: float | None = None
        if bound is not None and resumed_store is not None:
            self.e0 = float(open_trajectory(resumed_store, index=False).total_energy[0])

    def check(self, step: int, record: dict | None) -> None:
        if self.bound is None or record is None:
            return
        energy = float(record["total_energy"])
        if self.e0 is None:
            self.e0 = energy
        error = abs(energy / self.e0 - 1) if self.e0 else abs(energy - self.e0)
        if not error <= self.bound:
            raise EnergyErrorExceeded(
                f"energy error {error:.3e} at step {step} exceeds max_energy_error="
                f"{self.bound!r}; the run stopped, its snapshots up to this one are committed")


def describe_method(plan: Plan, asked: str | None) -> str:
    """One line saying how forces are computed, and why when ``method="auto"`` chose."""
    what = plan.force_method.describe(plan)
    if config.get("method", asked) == "auto":
        crossover = PERIODIC_CROSSOVER if plan.periodic else TREE_CROSSOVER
        side = ">=" if plan.n >= crossover else "<"
        what += f" (method='auto': {plan.n} bodies {side} {crossover})"
    return what
