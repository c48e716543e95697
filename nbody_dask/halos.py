"""Halos of a periodic box by friends-of-friends (FoF), found slab by slab on the cluster, and
their mass function.

:func:`friends_of_friends` links every pair of bodies closer than ``b`` times the mean
interparticle spacing (``b = 0.2`` by default, as GADGET-4's ``FOF_LINKLENGTH``) and returns
the groups of at least ``min_members`` bodies. The box is cut into slabs along x: each chunk
of bodies is cut into its part of every slab (bodies within one linking length of a slab's
faces also go, as ghosts, to the slab beside it); each slab task finds its groups with a
periodic k-d tree (``scipy.spatial.cKDTree``) and keeps the groups that are big enough or
hold a ghost, with the partial sums of their owned bodies (count, mass, mass-weighted
offsets from a reference member and velocities); one task joins groups that share a body
across faces (connected components over the slabs' groups) and adds their sums. The halos
and their members are the same for any number of slabs (masses and centres to round-off)
and bit-identical on any cluster for a given number (tests/test_halos.py).

Centres of mass are taken with the periodic wrap: offsets from each group's member of lowest
id, by the minimum image, so a halo across the box's faces has its centre inside the box.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dask
import dask.array as da
import numpy as np
import xarray as xr
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from ._validate import check_int, check_real

__all__ = ["friends_of_friends", "mass_function"]

#: Bodies per chunk of the cut into slabs.
_CHUNK_BODIES = 1 << 20
#: Bodies per slab aimed at when ``slabs`` is not given.
_SLAB_BODIES = 1 << 22


@dataclass
class _SlabGroups:
    """A slab's groups worth keeping: per group its reference member (lowest id) and the
    partial sums over its owned bodies; and, for every ghost or face-touching body kept,
    which group holds it (to join groups across faces)."""

    slab: int
    ref_id: np.ndarray        # (g,) the lowest body id among the group's members here
    ref_pos: np.ndarray       # (g, 3) that member's position
    count: np.ndarray         # (g,) owned members
    mass: np.ndarray          # (g,)
    offset: np.ndarray        # (g, 3) sum of m (x - ref) over owned members (minimum image)
    momentum: np.ndarray      # (g, 3) sum of m v over owned members
    link_ids: np.ndarray      # ids of the ghosts and of owned bodies near a face
    link_group: np.ndarray    # their group (index into the arrays above)


def friends_of_friends(bodies: xr.Dataset, linking_length: float = 0.2,
                       min_members: int = 20, *, box_size: float | None = None,
                       slabs: int | None = None) -> xr.Dataset:
    """Friends-of-friends halos of a periodic box.

    Parameters
    ----------
    bodies : xarray.Dataset
        ``position(body, axis)`` in ``[0, box_size)``, ``velocity`` and ``mass``: a body set
        or a snapshot (``traj.isel(time=-1)``), in memory or lazy.
    linking_length : float
        In units of the mean interparticle spacing ``box_size / N^(1/3)`` (0.2).
    min_members : int
        Fewest bodies of a halo (20; GADGET-4 uses 32).
    box_size : float, optional
        The box's side; by default the bodies' ``box_size`` attribute.
    slabs : int, optional
        Slabs along x that the search is cut into (each at least a linking length wide);
        by default one per 2^22 bodies. The catalogue does not depend on it.

    Returns
    -------
    xarray.Dataset
        Dimension ``halo``, heaviest first (ties by ``id``): ``id`` (the lowest body id of
        the halo), ``members``, ``mass``, ``position(halo, axis)`` (centre of mass, wrapped
        into the box), ``velocity(halo, axis)`` (mass-weighted mean); attributes
        ``box_size``, ``linking_length`` (in length units and in spacings),
        ``min_members``.

    Examples
    --------
    >>> halos = nbody_dask.friends_of_friends(traj.isel(time=-1))  # doctest: +SKIP
    >>> halos.mass.plot.hist(bins=30)                             # doctest: +SKIP
    """
    if box_size is None:
        box_size = bodies.attrs.get("box_size")
        if box_size is None:
            raise ValueError("box_size is needed: the bodies have no box_size attribute")
    box = check_real("box_size", box_size, positive=True)
    b = check_real("linking_length", linking_length, positive=True)
    min_members = check_int("min_members", min_members, 1)
    n = bodies.sizes["body"]
    link = b * box / max(n, 1) ** (1 / 3)
    if link >= box / 4:
        raise ValueError(f"linking_length={linking_length!r} is {link:g} in length units: "
                         f"at least a quarter of the box ({box:g}); too few bodies or too long")
    widest = max(1, int(box // link))
    if slabs is None:
        slabs = min(widest, max(1, -(-n // _SLAB_BODIES)))
    slabs = check_int("slabs", slabs, 1)
    if slabs > 1 and slabs > widest:
        raise ValueError(f"slabs must be <= {widest} (each slab at least one linking length "
                         f"wide), got {slabs!r}")
    arrays = {name: _as_dask(bodies[name].data) for name in ("position", "velocity", "mass")}
    # the ids as they are: lazy where the bodies are (a store opened without its index),
    # never read into this process then
    ids = _as_dask(bodies["body"].variable.data).astype(np.int64).rechunk(
        (arrays["position"].chunks[0],))
    arrays["mass"] = arrays["mass"].rechunk((arrays["position"].chunks[0],))
    arrays["velocity"] = arrays["velocity"].rechunk(arrays["position"].chunks)
    cuts = [dask.delayed(_cut, nout=slabs)(p, v, m, i, slabs, box, link)
            for p, v, m, i in zip(arrays["position"].to_delayed()[:, 0],
                                  arrays["velocity"].to_delayed()[:, 0],
                                  arrays["mass"].to_delayed(), ids.to_delayed(), strict=True)]
    found = [dask.delayed(_slab_groups)(s, slabs, box, link, min_members,
                                        *[c[s] for c in cuts]) for s in range(slabs)]
    catalogue = dask.delayed(_join)(box, min_members, *found).compute()
    catalogue.attrs.update(box_size=box, linking_length=link, linking_length_spacings=b,
                           min_members=min_members)
    return catalogue


def _as_dask(array: np.ndarray | da.Array) -> da.Array:
    if isinstance(array, da.Array):
        return array
    array = np.asarray(array)
    return da.from_array(array, chunks=(_CHUNK_BODIES,) + array.shape[1:])


def _cut(position, velocity, mass, ids, slabs: int, box: float, link: float) -> list:
    """A chunk of bodies cut into its part of every slab: ``(position, velocity, mass, ids,
    owned)``, with the bodies within ``link`` of a slab's faces as its ghosts."""
    x = np.asarray(position, dtype=np.float64)
    x = np.where(x >= box, x - box, np.where(x < 0, x + box, x))
    width = box / slabs
    home = np.minimum((x[:, 0] // width).astype(np.int64), slabs - 1)
    parts = []
    for s in range(slabs):
        owned = home == s
        if slabs == 1:
            near = owned
        else:
            lo = s * width
            below = np.mod(lo - x[:, 0], box)  # distance below the slab's lower face
            above = np.mod(x[:, 0] - (lo + width), box)  # beyond its upper face
            near = owned | (below <= link) | (above <= link)
        parts.append((x[near], np.asarray(velocity)[near], np.asarray(mass)[near],
                      np.asarray(ids)[near], owned[near]))
    return parts


def _slab_groups(slab: int, slabs: int, box: float, link: float, min_members: int,
                 *parts: tuple) -> _SlabGroups:
    """One slab's groups (periodic search over its owned bodies and ghosts)."""
    x, v, m, ids, owned = (np.concatenate([p[k] for p in parts]) for k in range(5))
    n = len(ids)
    order = np.argsort(ids, kind="stable")  # body order: the same on any chunking
    x, v, m, ids, owned = x[order], v[order], m[order], ids[order], owned[order]
    if n:
        pairs = cKDTree(x, boxsize=box).query_pairs(link, output_type="ndarray")
        graph = coo_matrix((np.ones(len(pairs), dtype=np.int8), (pairs[:, 0], pairs[:, 1])),
                           shape=(n, n))
        _, label = connected_components(graph, directed=False)
    else:
        label = np.zeros(0, dtype=np.int64)
    groups = int(label.max()) + 1 if n else 0
    owned_count = np.bincount(label[owned], minlength=groups)
    ghosts = np.bincount(label[~owned], minlength=groups) > 0
    # a link across a face joins a body and a ghost in each of the two slabs: groups without
    # ghosts are whole here, and only those big enough are kept
    keep = (owned_count >= min_members) | ghosts
    # the owned bodies near a face are the neighbours' ghosts: exported with their group,
    # so the join can tie it to the neighbour's
    face = owned & _near_face(x[:, 0], slab, slabs, box, link)
    new = np.full(groups, -1, dtype=np.int64)
    new[keep] = np.arange(int(keep.sum()))
    label = new[label]
    kept = int(keep.sum())
    # reference member: the lowest id (bodies are in id order, so the first of each group)
    first = np.full(kept, -1, dtype=np.int64)
    member = np.flatnonzero(label >= 0)
    first_seen = np.unique(label[member], return_index=True)[1]
    first[:] = member[first_seen]
    ref_pos = x[first]
    sel = member[owned[member]]
    g = label[sel]
    offset = _minimum_image(x[sel] - ref_pos[g], box) * m[sel, None]
    sums = [np.zeros((kept, 3)) for _ in range(2)]
    for axis in range(3):
        sums[0][:, axis] = np.bincount(g, weights=offset[:, axis], minlength=kept)
        sums[1][:, axis] = np.bincount(g, weights=m[sel] * v[sel, axis], minlength=kept)
    linked = member[(~owned[member]) | face[member]]
    return _SlabGroups(slab=slab, ref_id=ids[first], ref_pos=ref_pos,
                       count=np.bincount(g, minlength=kept),
                       mass=np.bincount(g, weights=m[sel], minlength=kept),
                       offset=sums[0], momentum=sums[1], link_ids=ids[linked],
                       link_group=label[linked])


def _near_face(x: np.ndarray, slab: int, slabs: int, box: float, link: float) -> np.ndarray:
    """Whether coordinates ``x`` lie within ``link`` of slab ``slab``'s faces (none with one
    slab: it has no faces)."""
    if slabs == 1:
        return np.zeros(len(x), dtype=bool)
    lo, hi = slab * box / slabs, (slab + 1) * box / slabs
    return (np.mod(x - lo, box) <= link) | (np.mod(hi - x, box) <= link)


def _minimum_image(d: np.ndarray, box: float) -> np.ndarray:
    return d - box * np.round(d / box)


def _join(box: float, min_members: int, *slabs: _SlabGroups) -> xr.Dataset:
    """Join the slabs' groups that share a body (in slab order) and add their sums."""
    offsets = np.cumsum([0] + [len(s.ref_id) for s in slabs])
    total = int(offsets[-1])
    ids = np.concatenate([s.link_ids for s in slabs]) if slabs else np.zeros(0, np.int64)
    node = np.concatenate([s.link_group + offsets[k] for k, s in enumerate(slabs)]) \
        if slabs else np.zeros(0, np.int64)
    # nodes holding the same body are one group: link consecutive holders of each id
    order = np.lexsort((node, ids))
    same = ids[order][1:] == ids[order][:-1]
    a, b = node[order][:-1][same], node[order][1:][same]
    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(total, total))
    _, group = connected_components(graph, directed=False) if total else (0, np.zeros(0, int))
    field = lambda name: np.concatenate([getattr(s, name) for s in slabs])  # noqa: E731
    ref_id, ref_pos = field("ref_id"), field("ref_pos")
    count, mass = field("count"), field("mass")
    offset, momentum = field("offset"), field("momentum")
    halos = int(group.max()) + 1 if total else 0
    members = np.bincount(group, weights=count, minlength=halos).astype(np.int64)
    # each halo's reference: its node with the lowest reference id
    order = np.lexsort((ref_id, group))
    head = order[np.unique(group[order], return_index=True)[1]]
    shift = _minimum_image(ref_pos - ref_pos[head][group], box) * mass[:, None]
    moment = offset + shift
    halo_mass = np.bincount(group, weights=mass, minlength=halos)
    centre = np.stack([np.bincount(group, weights=moment[:, a], minlength=halos)
                       for a in range(3)], axis=1)
    velocity = np.stack([np.bincount(group, weights=momentum[:, a], minlength=halos)
                         for a in range(3)], axis=1)
    keep = members >= min_members
    with np.errstate(invalid="ignore", divide="ignore"):
        centre = np.mod(ref_pos[head] + centre / halo_mass[:, None], box)[keep]
        velocity = (velocity / halo_mass[:, None])[keep]
    ident, members, halo_mass = ref_id[head][keep], members[keep], halo_mass[keep]
    rank = np.lexsort((ident, -members))
    return xr.Dataset(
        {"members": ("halo", members[rank]), "mass": ("halo", halo_mass[rank]),
         "position": (("halo", "axis"), centre[rank]),
         "velocity": (("halo", "axis"), velocity[rank])},
        coords={"halo": np.arange(len(rank)), "id": ("halo", ident[rank]),
                "axis": np.array(["x", "y", "z"], dtype=object)})


def mass_function(halos: xr.Dataset, bins: int | np.ndarray = 12,
                  box_size: float | None = None) -> xr.Dataset:
    """The halo mass function ``dn / dlog10 M`` of a catalogue (per unit volume).

    ``bins``: the number of log-spaced bins between the lightest and the heaviest halo, or
    their edges. Returns ``dn_dlog10m(mass)`` with its Poisson error and the halo counts.
    """
    box = check_real("box_size", box_size if box_size is not None
                     else halos.attrs.get("box_size"), positive=True)
    mass = halos.mass.values
    if not len(mass):
        raise ValueError("the catalogue has no halos")
    if np.ndim(bins) == 0:
        bins = check_int("bins", bins, 1)
        lo, hi = math.log10(mass.min()), math.log10(mass.max())
        edges = np.logspace(lo, hi + 1e-9 * max(abs(hi), 1), bins + 1)
    else:
        edges = np.asarray(bins, dtype=np.float64)
    counts, _ = np.histogram(mass, edges)
    width = np.diff(np.log10(edges))
    centres = np.sqrt(edges[1:] * edges[:-1])
    volume = box**3
    return xr.Dataset(
        {"dn_dlog10m": ("mass", counts / width / volume),
         "error": ("mass", np.sqrt(counts) / width / volume),
         "count": ("mass", counts)},
        coords={"mass": ("mass", centres, {"long_name": "bin centre (geometric)"}),
                "mass_edges": ("edge", edges)},
        attrs={"box_size": box})
