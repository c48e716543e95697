"""Where a trajectory store lives: a local directory, or a prefix in an object store.

A store is named by a path (``run.zarr``, ``~/runs/a.zarr``, ``file:///scratch/a.zarr``) or
by an fsspec URL of an object store (``s3://bucket/runs/a.zarr``, ``gs://...``) with its
``storage_options`` (credentials, endpoint; see the fsspec implementation's docs, e.g.
s3fs's ``S3FileSystem``). :func:`store_location` turns either into a
:class:`StoreLocation`, the one object the storage and lease modules use for every file
operation and every Zarr store they open.

The commit protocol and the writer lease need three things of a store, which both kinds
give: whole-object writes that readers see entirely or not at all (a local file replaced by
``os.replace``; an object PUT), an exclusive create (``O_CREAT | O_EXCL``; a conditional
PUT with ``If-None-Match: *`` on S3 and ``ifGenerationMatch=0`` on GCS), and reads of a
named object that see the latest write (S3 and GCS are strongly consistent for these).
Listings are not trusted to be complete: code that needs the newest of a numbered series
probes past the listing (:meth:`StoreLocation.newest`).

Object-store URLs need the fsspec implementation of their protocol (``pip install
nbody-dask[s3]`` for ``s3://``). Only protocols whose exclusive create is atomic are
accepted, so that two runs can never both think they own a store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from . import config

__all__ = ["StoreLocation", "LocalLocation", "ObjectLocation", "StoreUnreachableError",
           "store_faults", "describe_error", "quiet_abandoned_requests",
           "store_location", "ATOMIC_CREATE_PROTOCOLS"]

_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

#: Object-store protocols whose fsspec implementation creates an object exclusively and
#: atomically (``pipe_file(mode="create")``): s3fs (``If-None-Match: *``), gcsfs
#: (``ifGenerationMatch=0``).
ATOMIC_CREATE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs"})

_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}

#: Options of the one request that checks a store can be reached: no retries, so that an
#: unreachable endpoint is reported at once (the run itself keeps the library's retries).
_PROBE_CONFIG = {"s3": {"retries": {"total_max_attempts": 1}, "connect_timeout": 5,
                        "read_timeout": 5}}


def store_faults() -> tuple[type[BaseException], ...]:
    """The errors that a store's file operations raise when the store fails: OSError (a
    full disk, a lost mount), and the errors of the object-store clients that are not
    OSErrors (botocore's lost endpoint or refused request, aiohttp's dropped connection)."""
    faults: list[type[BaseException]] = [OSError]
    with contextlib.suppress(ImportError):
        from botocore.exceptions import BotoCoreError, ClientError

        faults += [BotoCoreError, ClientError]
    with contextlib.suppress(ImportError):
        from aiohttp import ClientError as HTTPClientError

        faults.append(HTTPClientError)
    return tuple(faults)


class StoreUnreachableError(ConnectionError):
    """The object store could not be reached, or refused the credentials (one line)."""


class StoreLocation(ABC):
    """A store's location: the file operations the commit protocol and the lease need.

    Entry names are relative to the store's root and use ``/`` (``"zarr.json"``,
    ``"position/zarr.json"``). Instances pickle (workers receive them in task graphs) and
    hash by what they name, so that caches keyed by them are per store.
    """

    url: str  #: the store as messages show it: a local path, or the URL

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @abstractmethod
    def _key(self) -> tuple: ...

    @property
    def is_local(self) -> bool:
        """True for a directory on a local or shared file system."""
        return isinstance(self, LocalLocation)

    @abstractmethod
    def exists(self, name: str = "") -> bool:
        """True if entry ``name`` exists (the store itself for ``""``: anything in it)."""

    @abstractmethod
    def names(self) -> list[str]:
        """The names of the store's top-level entries (empty if it does not exist)."""

    @abstractmethod
    def read_bytes(self, name: str) -> bytes:
        """The content of entry ``name`` (FileNotFoundError if it has none)."""

    @abstractmethod
    def write_bytes(self, name: str, data: bytes) -> None:
        """Replace entry ``name`` with ``data``, as one write readers see whole or not at all."""

    @abstractmethod
    def create(self, name: str, data: bytes) -> None:
        """Create entry ``name`` holding ``data`` exclusively: FileExistsError if it exists."""

    @abstractmethod
    def remove(self, name: str) -> None:
        """Remove entry ``name`` (a file, or a folder and all under it), if it exists."""

    @abstractmethod
    def modified(self, name: str) -> float:
        """When entry ``name`` was last written (seconds since the epoch)."""

    @abstractmethod
    def zarr_store(self, read_only: bool = False) -> Any:
        """What Zarr and xarray open for this store (a path, or a Zarr ``FsspecStore``)."""

    #: Seconds after which one write is abandoned with a ``TimeoutError`` (None: never).
    deadline: float | None = None

    def read_json(self, name: str) -> Any:
        """Entry ``name`` parsed as JSON (ValueError if it is not)."""
        return json.loads(self.read_bytes(name))

    def clear(self, keep: Callable[[str], bool]) -> None:
        """Remove every top-level entry except those ``keep(name)`` says to keep."""
        for name in self.names():
            if not keep(name):
                self.remove(name)

    def newest(self, prefix: str) -> list[int]:
        """The numbers ``k`` of the entries named ``prefix + str(k)``, ascending.

        Starts from a listing and then probes ``k + 1, k + 2, ...`` by name past its
        highest, since an object store's listing may lag behind its latest writes.
        """
        found = sorted(int(n[len(prefix):]) for n in self.names()
                       if n.startswith(prefix) and n[len(prefix):].isdigit())
        k = found[-1] + 1 if found else 0
        while self.exists(f"{prefix}{k}"):
            found.append(k)
            k += 1
        return found

    @abstractmethod
    def check_reachable(self) -> None:
        """Raise :class:`StoreUnreachableError` if the store cannot be reached."""


class LocalLocation(StoreLocation):
    """A directory on a local or shared file system."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = str(path)

    def _key(self) -> tuple:
        return ("local", self.url)

    def exists(self, name: str = "") -> bool:
        target = self.path / name
        return target.exists() or target.is_symlink()

    def names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_bytes(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def write_bytes(self, name: str, data: bytes) -> None:
        target = self.path / name
        tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)

    def create(self, name: str, data: bytes) -> None:
        fd = os.open(self.path / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def remove(self, name: str) -> None:
        target = self.path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)

    def modified(self, name: str) -> float:
        return (self.path / name).stat().st_mtime

    def zarr_store(self, read_only: bool = False) -> str:
        return str(self.path)

    def check_reachable(self) -> None:
        """A local path is always reachable; whether it can be written is checked apart."""


class ObjectLocation(StoreLocation):
    """A prefix in an object store, reached through fsspec (``s3://bucket/prefix``)."""

    def __init__(self, url: str, protocol: str, storage_options: Mapping[str, Any]) -> None:
        self.url = url.rstrip("/")
        self.protocol = protocol
        self.storage_options = dict(storage_options)
        self._reached = False  # check_reachable succeeded once: the run's later calls skip it

    def _key(self) -> tuple:
        from dask.base import tokenize

        return ("object", self.url, tokenize(self.storage_options))

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "fs"}  # rebuilt where used

    @cached_property
    def fs(self):
        """The fsspec file system (:meth:`options`)."""
        import fsspec

        return _bounded(fsspec.filesystem(self.protocol, **self.options()))

    def options(self) -> dict[str, Any]:
        """The file system's options: ``storage_options``, and on S3 requests that time out
        after ``nbody.object-store.timeout`` seconds with two tries (unless
        ``storage_options`` say otherwise), so that a store that stops answering stops a run
        in bounded time."""
        options = dict(self.storage_options)
        if self.protocol == "s3":
            timeout = float(config.get("object-store.timeout"))
            bounded = {"connect_timeout": timeout, "read_timeout": timeout,
                       "retries": {"total_max_attempts": 2}}
            options["config_kwargs"] = {**bounded, **options.get("config_kwargs", {})}
        return options

    @cached_property
    def root(self) -> str:
        """The store's path within :attr:`fs` (``bucket/prefix``)."""
        return self.fs._strip_protocol(self.url).rstrip("/")

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    @property
    def deadline(self) -> float:
        """Seconds one store operation may take in all, its requests and their tries
        (:data:`DEADLINE_PER_TIMEOUT` times ``nbody.object-store.timeout``): an endpoint
        that accepts connections and never answers (a paused server) does not time its
        requests out, so each operation is abandoned with a ``TimeoutError`` after this."""
        return DEADLINE_PER_TIMEOUT * float(config.get("object-store.timeout"))

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``fs.method(*args, **kwargs)``, within :attr:`deadline` where the file system is
        asynchronous (fsspec's blocking wrappers take a ``timeout``)."""
        if getattr(self.fs, "async_impl", False):
            kwargs["timeout"] = self.deadline
        try:
            return getattr(self.fs, method)(*args, **kwargs)
        except TimeoutError:
            quiet_abandoned_requests()
            raise

    def exists(self, name: str = "") -> bool:
        if not name:
            return bool(self.names())
        try:
            self._call("info", self._path(name), refresh=True)  # not from a cached listing
        except FileNotFoundError:
            return False
        return True

    def names(self) -> list[str]:
        try:
            entries = self._call("ls", self.root, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries} - {""})

    def read_bytes(self, name: str) -> bytes:
        return self._call("cat_file", self._path(name))

    def write_bytes(self, name: str, data: bytes) -> None:
        self._call("pipe_file", self._path(name), data)  # one PUT: atomic for readers

    def create(self, name: str, data: bytes) -> None:
        self._call("pipe_file", self._path(name), data, mode="create")

    def remove(self, name: str) -> None:
        path = self._path(name)
        try:
            self._call("rm", path, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(path)

    def modified(self, name: str) -> float:
        return self.fs.modified(self._path(name)).timestamp()

    def zarr_store(self, read_only: bool = False):
        """A Zarr ``FsspecStore``; to write, each Zarr operation of this process is then
        bounded by :attr:`deadline` (Zarr's ``async.timeout``, a setting of the process)."""
        import zarr
        from zarr.storage import FsspecStore

        import fsspec

        if not read_only:
            zarr.config.set({"async.timeout": self.deadline})

        fs = _bounded(fsspec.filesystem(self.protocol, asynchronous=True, **self.options()))
        return FsspecStore(fs, read_only=read_only, path=self.root)

    def check_reachable(self, timeout: float = 8.0) -> None:
        """Look at the store's bucket within ``timeout`` seconds; raise
        :class:`StoreUnreachableError` in one line if it cannot (no endpoint, bad
        credentials, no such bucket). Once it succeeded, later calls on this location return
        at once (a run validates, resumes, loads and reopens through one location)."""
        if self._reached:
            return
        import fsspec

        bucket = self.root.split("/", 1)[0]
        outcome: list[BaseException | None] = []
        options = dict(self.storage_options, skip_instance_cache=True)
        quick = _PROBE_CONFIG.get(_EXTRAS[self.protocol])
        if quick is not None:
            options["config_kwargs"] = {**quick, **options.get("config_kwargs", {})}

        def probe() -> None:
            try:
                fsspec.filesystem(self.protocol, **options).ls(bucket, detail=False,
                                                               refresh=True)
                outcome.append(None)
            except BaseException as exc:  # reported in the caller's thread
                outcome.append(exc)

        thread = threading.Thread(target=probe, name="nbody-store-probe", daemon=True)
        thread.start()
        thread.join(timeout)
        if not outcome:
            raise StoreUnreachableError(f"store {self.url!r}: the object store did not answer "
                                        f"within {timeout:g} s; check the endpoint and network")
        exc = outcome[0]
        if exc is None:
            self._reached = True
            return
        if isinstance(exc, FileNotFoundError):
            why = f"bucket {bucket!r} does not exist"
        elif isinstance(exc, PermissionError):
            why = f"access denied, check the credentials ({_one_line(exc)})"
        else:
            why = f"cannot reach the object store ({describe_error(exc)})"
        raise StoreUnreachableError(f"store {self.url!r}: {why}") from None


#: A store operation's deadline in units of ``nbody.object-store.timeout``: two tries of a
#: request, each allowed a connect and a read timeout (:attr:`ObjectLocation.deadline`).
DEADLINE_PER_TIMEOUT = 4

#: Tries of s3fs's own retry loop around each request (its default is 5, each with
#: botocore's tries inside): a store that stops answering then stops a run within a few
#: ``nbody.object-store.timeout``.
S3FS_TRIES = 1


def _bounded(fs: Any) -> Any:
    """``fs`` with s3fs's retry loop bounded (:data:`S3FS_TRIES`); other file systems as they
    are."""
    if hasattr(fs, "retries") and type(fs).__module__.startswith("s3fs"):
        fs.retries = S3FS_TRIES
    return fs


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one line (for one-line errors)."""
    return f"{type(exc).__name__}: {_one_line(exc)}"


def store_location(store: Any, storage_options: Mapping[str, Any] | None = None
                   ) -> StoreLocation:
    """The location a ``store`` argument names.

    Parameters
    ----------
    store : str, os.PathLike or StoreLocation
        A local path (``~`` expanded), a ``file://`` URL, or an object-store URL such as
        ``s3://bucket/runs/a.zarr``.
    storage_options : mapping, optional
        Passed to the fsspec file system of an object-store URL (credentials, endpoint).

    Raises
    ------
    TypeError
        If ``store`` is not a str or path, or ``storage_options`` not a mapping.
    ValueError
        If ``store`` is empty, ``storage_options`` is given for a local path, or the URL's
        protocol has no atomic exclusive create (see :data:`ATOMIC_CREATE_PROTOCOLS`).
    ImportError
        If the protocol's fsspec implementation is not installed, naming the extra.
    """
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
    if isinstance(store, StoreLocation):
        return store
    if not isinstance(store, (str, os.PathLike)):
        raise TypeError(f"store must be a path or URL (str or os.PathLike), got "
                        f"{type(store).__name__}")
    text = os.fspath(store)
    if not isinstance(text, str):
        raise TypeError(f"store must be a text path, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"store must name a directory, got {text!r}")
    scheme = _URL_SCHEME.match(text)
    protocol = scheme.group(1).lower() if scheme else "file"
    if protocol != "file":  # the scheme in lower case: S3://b/x is s3://b/x
        return _object_location(protocol + text[len(protocol):], protocol,
                                storage_options or {})
    if storage_options:
        raise ValueError(f"storage_options are for object-store URLs (s3://...), not for the "
                         f"local store {text!r}")
    if scheme:
        parsed = urllib.parse.urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"store={text!r}: a file:// URL must name a local path")
        text = urllib.parse.unquote(parsed.path)
    return LocalLocation(Path(text).expanduser())


def _object_location(url: str, protocol: str, options: Mapping[str, Any]) -> ObjectLocation:
    if protocol not in ATOMIC_CREATE_PROTOCOLS:
        raise ValueError(
            f"store={url!r}: {protocol}:// is not supported: a store needs an object store "
            "whose exclusive create is atomic, for its writer lease (s3://, gs://), or a path "
            "on a local or shared file system")
    import fsspec

    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError:
        extra = _EXTRAS[protocol]
        raise ImportError(f"store={url!r} needs the fsspec implementation of {protocol}://: "
                          f"pip install 'nbody-dask[{extra}]'") from None
    bucket = url[len(protocol) + 3:].split("/", 1)[0]
    if not bucket:
        raise ValueError(f"store={url!r} names no bucket")
    if not url[len(protocol) + 3 + len(bucket):].strip("/"):
        raise ValueError(f"store={url!r} is a whole bucket; name a prefix in it "
                         f"({protocol}://{bucket}/run.zarr)")
    return ObjectLocation(url, protocol, options)


def _not_an_abandoned_request(record: logging.LogRecord) -> bool:
    """False for asyncio's note that a store request which failed (timed out, or lost its
    connection) was never awaited."""
    error = record.exc_info[1] if record.exc_info else None
    return not (record.getMessage().startswith(("Future exception was never retrieved",
                                                 "Task exception was never retrieved"))
                and isinstance(error, store_faults()))


def quiet_abandoned_requests() -> None:
    """Keep asyncio's "exception was never retrieved" about a failed store request off the
    terminal, once a store operation failed or was abandoned for its deadline (and said so
    in its own error): the object store's client may leave a request of its own failing
    (a write to a dropped connection, a request that times out later), and asyncio logs
    that when the interpreter collects it, with a traceback. Other such notes stay."""
    logger = logging.getLogger("asyncio")
    if _not_an_abandoned_request not in logger.filters:
        logger.addFilter(_not_an_abandoned_request)
