"""Force methods: how a step's forces are computed, one module each, behind one interface.

The plan, the graph builders, the driver and the store know a method only by its name
(:attr:`nbody_dask.plan.Plan.method`) and the plan fields it declares it reads
(:attr:`ForceMethod.parameters`); everything else is the method's, in its own module:

:mod:`nbody_dask.methods.direct`
    Exact direct summation: a kernel call per tile pair (or per target row with
    ``layout="rows"``), the symmetric kernel for unordered pairs.
:mod:`nbody_dask.methods.tree`
    An octree per spatial tile, a group walk per tile pair, far tiles from summaries.
:mod:`nbody_dask.methods.treepm`
    Periodic boxes: a particle mesh (FFT) for the long range, a periodic tree walk with a
    cutoff between neighbouring spatial tiles for the short range.

The interface (:class:`ForceMethod`) has a planning half, pure arithmetic on a
:class:`~nbody_dask.plan.Plan` (no Dask, no arrays), and a graph half:

* :meth:`~ForceMethod.check` refuses plans the method cannot run (a ValueError naming the
  parameter), :meth:`~ForceMethod.tile_size` chooses tiles for a cluster,
  :meth:`~ForceMethod.settle` fixes what the cluster decides, :meth:`~ForceMethod.reorders`
  says whether its tiles leave body order (snapshots then route bodies back),
  :meth:`~ForceMethod.tasks_per_step` sizes submissions, :meth:`~ForceMethod.describe` is the
  line the progress bar prints;
* :meth:`~ForceMethod.evaluate` adds to a graph the tasks that give each target tile its
  forces at one step and close it (the reduction and the kick, from
  :mod:`nbody_dask.graph`), with the method's own per-step or per-window tasks (re-tiling,
  trees, summaries). It is a generator: a method that must look at data before building
  the rest (the tree's near/far classification) yields a :class:`~nbody_dask.graph.Piece`
  and gets back futures and the fetched value. It carries state from one step to the next
  (a :class:`CarriedState`, or None);
* a method that runs individual time steps (:attr:`~ForceMethod.individual_steps`,
  :mod:`nbody_dask.blocksteps`) adds a tick's force tasks on its active tiles
  (:meth:`~ForceMethod.tick_forces`) on tiles it may re-cut where every body is
  synchronised (:meth:`~ForceMethod.synchronised_tiles`), with what it builds once a block
  (:meth:`~ForceMethod.open_block`: the tree's trees) and, where every body is
  synchronised, a long-range force stepped on the block (:meth:`~ForceMethod.
  tick_long_range`: TreePM's mesh);
* a method whose tasks can fail in a way it knows how to avoid lists those exceptions in
  :attr:`~ForceMethod.fallback_errors`; :meth:`~ForceMethod.fallback_start` names the step
  from which the driver re-runs (from the last committed snapshot) with the method's
  fallback in force, deterministically, so resumed runs do the same.

Adding a method is one module that subclasses :class:`ForceMethod` and calls
:func:`register` on import, plus its name in :data:`BUILTIN` (or an import of that module
before use, for a method of one's own); see "Adding a force method" in docs/user-guide.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Generator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..graph import Evaluation, Graph
    from ..plan import Plan

__all__ = ["ForceMethod", "CarriedState", "register", "get", "names", "BUILTIN"]

#: The methods that ship with nbody_dask: name -> module, imported on first use.
BUILTIN = {"direct": "nbody_dask.methods.direct", "tree": "nbody_dask.methods.tree",
           "treepm": "nbody_dask.methods.treepm"}

_REGISTERED: dict[str, ForceMethod] = {}


class CarriedState(Protocol):
    """What a method carries from one step's evaluation to the next (the tree's window:
    the trees built at the last re-tiling and the near sets)."""

    def references(self) -> list:
        """The keys or futures of tasks that later steps use (kept alive across
        submissions)."""

    def rebound(self, references: list) -> CarriedState:
        """The same state with :meth:`references` replaced by these (their futures)."""


class ForceMethod:
    """A force method: subclass it, set :attr:`name`, and implement the abstract methods.

    Attributes
    ----------
    name : str
        The name users pass as ``method=``.
    parameters : tuple of str
        The :class:`~nbody_dask.plan.Plan` fields the method reads beyond the common ones;
        stored as store attributes and shown by :meth:`describe`.
    fallback_errors : tuple of exception types
        Errors of its tasks that :meth:`fallback_start` handles.
    individual_steps : bool
        Whether it runs ``timestep="individual"`` (:meth:`open_block`, :meth:`tick_forces`).
    """

    name: str = ""
    parameters: tuple[str, ...] = ()
    fallback_errors: tuple[type[BaseException], ...] = ()
    individual_steps: bool = False

    # -- planning: pure arithmetic on a plan ----------------------------------------------------

    def check(self, plan: Plan) -> None:
        """Raise ValueError, naming the parameter, for a plan the method cannot run."""

    def tile_size(self, n: int, threads: int, workers: int, layout: str, backend: str) -> int:
        """Bodies per tile for ``n`` bodies on a cluster of ``workers`` processes with
        ``threads`` threads in all."""
        raise NotImplementedError

    def settle(self, plan: Plan, threads: int, workers: int, backend: str) -> Plan:
        """``plan`` with the tile size (unless given) and the kernel backend chosen for a
        cluster; the symmetric kernel is the direct method's alone."""
        tile = plan.tile_size or self.tile_size(plan.n, threads, workers, plan.layout, backend)
        return replace(plan, tile_size=tile, backend=backend, symmetric=False)

    def reorders(self, plan: Plan) -> bool:
        """True if the method's tiles are not the plan's tiles in body order (snapshots then
        route the bodies back, :func:`nbody_dask.graph.body_order`)."""
        return False

    def tasks_per_step(self, plan: Plan) -> int:
        """Tasks of one step's graph (snapshots not included), to size submissions."""
        raise NotImplementedError

    def describe(self, plan: Plan) -> str:
        """One line saying how forces are computed."""
        raise NotImplementedError

    # -- the graph ------------------------------------------------------------------------------

    def evaluate(self, ev: Evaluation, dsk: Graph, tiles: list, state: Any
                 ) -> Generator[Any, Any, tuple[Graph, list, Any]]:
        """Add to ``dsk`` the tasks of one force evaluation on ``tiles`` (keys or futures of
        the tiles at ``ev.step``, drifted) and the tasks that close each tile; return the
        graph still to submit, the closed tiles' keys and the state for the next step.
        ``state`` is what the last evaluation returned (None at the start of a run)."""
        raise NotImplementedError

    def open_block(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                   tiles: list) -> list:
        """Add to ``dsk`` what the ticks of a block of individual time steps share (keys
        from ``name(stage, tile)``), built from ``tiles`` (every body synchronised at the
        block's start); return their keys (none by default)."""
        return []

    def synchronised_tiles(self, plan: Plan, dsk: Graph, token: str, step: int,
                           tiles: list) -> list:
        """Where every body of a run with individual time steps is synchronised (its first
        evaluation, each block's end: where snapshots are taken and resumes start), the
        tiles to compute the forces on and go on with: ``tiles`` themselves by default;
        spatial tiles re-cut from the positions alone (so a resume cuts the same ones)."""
        return tiles

    def tick_forces(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                    sources: list[tuple[Any, float]], drifted: dict[int, Any], tick: Any,
                    forces: Any, block: list) -> dict[int, list[str]]:
        """Add to ``dsk`` the partial forces of one tick of individual time steps on the
        bodies active in the tiles ``drifted`` (tile number -> key of the tile drifted to
        the tick), due to every tile ``j``: ``sources[j]`` is its key and the drift factor
        that takes it to the tick. ``tick`` and ``forces`` are the tasks' :class:`~nbody_dask.
        tasks.Tick` and :class:`~nbody_dask.tasks.Forces`, ``block`` what :meth:`open_block`
        returned (futures). Return, per active tile, its partials' keys in source order
        (each with the rows :func:`~nbody_dask.integrators.close_block` reads)."""
        raise NotImplementedError

    def tick_long_range(self, plan: Plan, dsk: Graph, name: Callable[..., str],
                        drifted: dict[int, Any], tick: Any, forces: Any) -> dict[int, str]:
        """Add to ``dsk`` the long-range forces of a tick of individual time steps, if the
        method splits one off (a mesh) and every body is synchronised at ``tick`` (a first
        evaluation, a block's end); return their keys per tile (each tile's forces, G = 1,
        with the potential if ``forces`` ask for it), none by default. They kick every body
        by half a block at each end of the block
        (:func:`~nbody_dask.integrators.close_block`)."""
        return {}

    def fallback_start(self, plan: Plan, error: BaseException) -> int | None:
        """For an error of :attr:`fallback_errors`: the first step of the stretch to re-run
        with the fallback (None: no fallback, the error stands)."""
        return None


def register(method: ForceMethod) -> ForceMethod:
    """Make ``method`` available by its name (``simulate(method=name)``); returns it."""
    if not isinstance(method, ForceMethod) or not method.name:
        raise TypeError(f"a force method is a named ForceMethod, got {method!r}")
    _REGISTERED[method.name] = method
    return method


def get(name: str) -> ForceMethod:
    """The method called ``name`` (a built-in one is imported on first use)."""
    if name not in _REGISTERED and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    try:
        return _REGISTERED[name]
    except KeyError:
        raise ValueError(f"method must be one of {names()}, got {name!r}") from None


def names() -> tuple[str, ...]:
    """The names of the built-in and registered methods."""
    return tuple(dict.fromkeys([*BUILTIN, *_REGISTERED]))
