"""The tree's kernels in one namespace: an octree over bodies in Morton order, its
multipoles, a group walk that evaluates forces with quadrupole cells and the direct tile
kernel, and the far field of whole tiles from their trees' summaries.

Pure functions on structure-of-arrays; no Dask. The code lives in three modules:
:mod:`~nbody_dask.kernels.octree` (keys, cells, moments), :mod:`~nbody_dask.kernels.walk`
(the walk) and :mod:`~nbody_dask.kernels.farfield` (summaries, near/far classification, far
walks); this module gathers their public names. The method (Barnes & Hut 1986 with the
group walks of Barnes 1990, Bonsai and GADGET):

1. **Order.** Bodies are sorted by a 63-bit Morton key (21 bits per axis) in a bounding cube,
   so every octree cell is a contiguous run of bodies (:func:`morton_keys`).
2. **Tree.** :func:`build_tree` splits runs by key bits into at most eight children until a
   run has at most ``leaf_size`` bodies. Cells are stored in depth-first pre-order with a
   ``skip`` index (the cell after the subtree), so a walk needs no stack.
3. **Moments.** :func:`cell_moments` computes each cell's mass, centre of mass, traceless
   quadrupole about it and ``b_max`` (the largest distance of its bodies from the centre of
   mass) directly from its bodies, accumulated in float64.
4. **Walk.** :func:`walk`: each leaf of a target tree is a group that walks a source tree
   (the same tree, or another tile's). One walk per
   group accepts a cell when ``|com - c| - r > b_max / theta`` (``c``, ``r``: the group's
   centre and radius, so the test holds for every target) and evaluates it as a softened
   monopole plus a quadrupole (M2P); leaves that fail it have their bodies gathered into one
   list, evaluated with the direct tile kernel (P2P, :func:`~nbody_dask.kernels.cpu.
   accel_tile`). Every target sums its terms in a fixed order: the result does not depend
   on threads. With ``theta`` small enough that no cell is accepted, the result is the direct
   sum (the same kernel, in another order of sources).
5. **Tiles.** A spatial tile is a run of the Morton curve of all the bodies; its tree is
   built in their cube, so its cells are cells of one octree, and the cells its run cuts are
   never accepted (:func:`acceptable_cells`): walks of every tile pair are as accurate as one
   tree's walk.

The quadrupole term is not softened: accepted cells are far from their targets.
"""

from __future__ import annotations

from .farfield import (FarFieldError, Forest, Summary, displacement_bound, far_walk,
                       far_walk_sorted, forest, near_sources, summarize)
from .octree import (KEY_BITS, SUMMARY_BODIES, TileTree, acceptable_cells, build, build_tree,
                     cell_moments, morton_keys, refit)
from .walk import check_tree_parameters, tree_accelerations, walk, walk_sorted

__all__ = ["morton_keys", "build_tree", "cell_moments", "walk_sorted", "TileTree", "build",
           "walk", "refit", "Summary", "summarize", "SUMMARY_BODIES", "Forest", "forest",
           "far_walk_sorted", "far_walk", "FarFieldError", "near_sources",
           "displacement_bound", "check_tree_parameters", "acceptable_cells",
           "tree_accelerations", "KEY_BITS"]
