"""One writer per store: an exclusive, heartbeated lease file inside the store.

A run holds ``writer.lease.<generation>`` in its store's root while it writes: a small JSON
record of the run (id, host, pid and the pid's start time, when it started, its last
heartbeat). The file is created exclusively (``O_CREAT | O_EXCL``, or a conditional PUT in
an object store: :mod:`nbody_dask.location`).

A lease is *live* unless it is released or *stale*: its owner is gone (on the same host, its
pid no longer runs or now belongs to another process; on another host, a shared file
system's or an object store's, its heartbeat is older than ``nbody.lease.timeout`` seconds).
Acquiring (:meth:`WriterLease.acquire`) is three store operations: list the generations
(probing past the listing, which an object store may not have updated yet), read the newest
``k`` and refuse if it is live or gone (only a newer generation's holder deletes one),
create ``k + 1`` exclusively (none: create 0). Exactly one of
any number of racing runs gets the store, in every interleaving of those operations: a
generation is created once; whoever creates ``k + 1`` read ``k`` not live, and every run
that lists after that creation finds ``k + 1`` (live) as the newest and is refused, while
every run that listed before it tries ``k + 1`` too and fails its exclusive create. For
that argument to hold, the newest generation is never deleted: a released lease stays as a
record (``released``), so that numbers never go back, and a new holder deletes only the
generations before its own (in a local directory; an object store keeps them all, so that
the probe past a lagging listing finds contiguous numbers). ``tests/test_lease.py`` drives
racing acquirers through every interleaving of their operations. The holder rewrites its
file every ``nbody.lease.heartbeat`` seconds (a whole-file replacement: no reader sees half
a record). Workers check, before they write a snapshot region, that their run's lease is
still the newest generation (:func:`holds`); a run that lost its lease stops writing.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from . import config
from .location import StoreLocation, store_faults, store_location

__all__ = ["StoreInUseError", "LeaseLostError", "LeaseInfo", "WriterLease", "holder", "holds",
           "is_lease_file", "refuse_if_in_use"]

_PREFIX = "writer.lease."


class StoreInUseError(RuntimeError):
    """Another live run holds the store's writer lease."""


class LeaseLostError(RuntimeError):
    """This run's writer lease was taken over: it must stop writing."""


@dataclass(frozen=True)
class LeaseInfo:
    """The record in a lease file."""

    run_id: str
    host: str
    pid: int
    pid_started: float
    started: float
    heartbeat: float
    released: bool = False
    generation: int = 0

    def describe(self, timeout: float | None = None) -> str:
        age = time.time() - self.heartbeat
        if self.run_id == _UNREADABLE:
            return (f"a run whose lease file {_PREFIX}{self.generation} is not a lease record "
                    f"(being written, or damaged; written {age:.0f} s ago): if no run writes "
                    f"this store, remove that file")
        begun = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        described = (f"run {self.run_id[:12]} (pid {self.pid} on {self.host}, started {begun}, "
                     f"last heartbeat {age:.0f} s ago")
        if timeout is not None and self.host != socket.gethostname():
            described += f"; stale if no heartbeat comes in the next {max(timeout - age, 0):.0f} s"
        return described + ")"

    def live(self, timeout: float) -> bool:
        """True unless the lease is released or stale."""
        return not self.released and not self.stale(timeout)

    def stale(self, timeout: float) -> bool:
        """True if the owner is gone (see the module docstring)."""
        if self.host == socket.gethostname():
            try:
                return abs(psutil.Process(self.pid).create_time() - self.pid_started) > 1.0
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                return True
            except psutil.Error:  # no permission to look: fall back on the heartbeat
                pass
        return time.time() - self.heartbeat > timeout


def is_lease_file(name: str) -> bool:
    """True for the names of lease files (entries a store may hold besides its arrays)."""
    return name.startswith(_PREFIX) and name[len(_PREFIX):].split(".")[0].isdigit()


#: The run id of a lease file that is not a lease record (see :func:`_read`).
_UNREADABLE = "unreadable"


def _generations(store: StoreLocation) -> list[int]:
    return store.newest(_PREFIX)


def _read(store: StoreLocation, generation: int) -> LeaseInfo | None:
    name = f"{_PREFIX}{generation}"
    try:
        record = store.read_json(name)
        return LeaseInfo(**{**record, "generation": generation})
    except FileNotFoundError:
        return None
    except TimeoutError:  # an endpoint that does not answer says nothing of the lease
        raise
    except (OSError, ValueError, TypeError):  # being written: held, as of its mtime
        try:
            mtime = store.modified(name)
        except FileNotFoundError:
            return None
        return LeaseInfo(_UNREADABLE, "unknown", -1, 0.0, mtime, mtime, generation=generation)


def holder(store: str | os.PathLike | StoreLocation) -> LeaseInfo | None:
    """The newest lease of ``store`` (live or stale), or None (none, or released)."""
    store = store_location(store)
    for generation in reversed(_generations(store)):
        info = _read(store, generation)
        if info is not None:
            return None if info.released else info
    return None


def refuse_if_in_use(store: str | os.PathLike | StoreLocation,
                     timeout: float | None = None) -> LeaseInfo | None:
    """Raise :class:`StoreInUseError` naming the owner if a live run holds the store.

    Returns the store's newest lease (stale), or None if it has none.
    """
    current = holder(store)
    timeout = float(config.get("lease.timeout", timeout))
    if current is not None and not current.stale(timeout):
        raise _in_use(store, current, timeout)
    return current


def _in_use(store: Any, owner: LeaseInfo, timeout: float) -> StoreInUseError:
    """The one-line refusal of a store whose lease ``owner`` holds."""
    return StoreInUseError(f"store {str(store)!r} is in use by {owner.describe(timeout)}; "
                           "wait for that run to end or stop it")


_HOLDS_CACHE: dict[tuple[StoreLocation, str], float] = {}
_HOLDS_LOCK = threading.Lock()


def holds(store: str | os.PathLike | StoreLocation, run_id: str, max_age: float = 1.0) -> bool:
    """True if ``run_id`` holds the store's newest lease (cached ``max_age`` s per process)."""
    store = store_location(store)
    key = (store, run_id)
    with _HOLDS_LOCK:
        if time.monotonic() - _HOLDS_CACHE.get(key, -max_age - 1) <= max_age:
            return True
    current = holder(store)
    ok = current is not None and current.run_id == run_id
    if ok:
        with _HOLDS_LOCK:
            _HOLDS_CACHE[key] = time.monotonic()
    return ok


class WriterLease:
    """The writer lease of one run on ``store`` (a context manager).

    Parameters
    ----------
    store : str, os.PathLike or StoreLocation
        The store (an existing directory, or a prefix in an object store).
    heartbeat, timeout : float, optional
        Seconds between heartbeats, and the age after which another host's lease is stale;
        ``nbody.lease.heartbeat`` and ``nbody.lease.timeout`` by default.
    """

    def __init__(self, store: str | os.PathLike | StoreLocation, heartbeat: float | None = None,
                 timeout: float | None = None) -> None:
        self.store = store_location(store)
        self.run_id = uuid.uuid4().hex
        self.heartbeat = float(config.get("lease.heartbeat", heartbeat))
        self.timeout = float(config.get("lease.timeout", timeout))
        self.generation: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> WriterLease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    @property
    def _file(self) -> str:
        return f"{_PREFIX}{self.generation}"

    def acquire(self) -> None:
        """Take the lease, or raise :class:`StoreInUseError` naming the live owner."""
        for _ in self.acquire_steps():
            pass

    def acquire_steps(self) -> Iterator[str]:
        """:meth:`acquire`, one store operation at a time: yields the name of each operation
        (``"list"``, ``"read"``, ``"create"``, ``"clean"``) before doing it, so that a test
        can drive several acquirers through every interleaving (see the module docstring)."""
        yield "list"
        taken = _generations(self.store)
        if taken:
            yield "read"
            newest = _read(self.store, taken[-1])
            if newest is None:  # gone since the listing: a newer generation replaced it
                raise StoreInUseError(f"store {str(self.store)!r} was just taken by another "
                                      "run (its lease generation changed while this one "
                                      "looked)")
            if newest.live(self.timeout):
                raise _in_use(self.store, newest, self.timeout)
        generation = taken[-1] + 1 if taken else 0
        now = time.time()
        me = psutil.Process()
        record = LeaseInfo(self.run_id, socket.gethostname(), me.pid, me.create_time(), now,
                           now, generation=generation)
        yield "create"
        try:
            self.store.create(f"{_PREFIX}{generation}", self._record(record))
        except FileExistsError:
            other = _read(self.store, generation)
            owner = other.describe(self.timeout) if other else "another run"
            raise StoreInUseError(f"store {str(self.store)!r} was just taken by {owner}") from None
        self.generation = generation
        if self.store.is_local and taken:  # the generations before ours (see the module doc)
            yield "clean"
            for old in taken:
                self.store.remove(f"{_PREFIX}{old}")
        self._info = record
        self._thread = threading.Thread(target=self._beat, name="nbody-lease-heartbeat",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def _record(info: LeaseInfo) -> bytes:
        record: dict[str, Any] = asdict(info)
        del record["generation"]  # the file name says it
        return json.dumps(record).encode()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                if not self.held():
                    return
                info = LeaseInfo(**{**asdict(self._info), "heartbeat": time.time()})
                self.store.write_bytes(self._file, self._record(info))
            except store_faults():
                continue  # a full disk, a vanished store or endpoint: the run notices at
                # its next write and stops there, with one line

    def held(self) -> bool:
        """True while this run's lease is the store's newest."""
        if self.generation is None:
            return False
        return (_generations(self.store)[-1:] == [self.generation]
                and self.store.exists(self._file))

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if another run took the lease over."""
        if not self.held():
            now = holder(self.store)
            by = f" by {now.describe()}" if now else ""
            raise LeaseLostError(f"store {str(self.store)!r}: this run's writer lease was taken "
                                 f"over{by}; it stopped writing")

    def release(self) -> None:
        """Stop the heartbeat and give the lease up, if it is still ours: its record is
        marked released (never removed: the newest generation always stays, see the module
        docstring)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if self.held():
                info = LeaseInfo(**{**asdict(self._info), "heartbeat": time.time(),
                                    "released": True})
                self.store.write_bytes(self._file, self._record(info))
        except store_faults():
            pass  # the store failed: the lease goes stale by itself (its heartbeat stopped)
        self.generation = None
