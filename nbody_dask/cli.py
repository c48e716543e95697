"""The ``nbody-dask`` command line: ``run``, ``resume``, ``info``, ``ic``, ``export``, ``plot``,
``power``, ``halos``, ``bench``.

Errors from bad options or input are one line on stderr and a non-zero exit code
(2 for usage errors, 1 for everything else), never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import click

from .cli_support import (cluster_options, errors_as_messages, initial_conditions,
                          load_config, parse_params, rate_line, run_summary, same_place,
                          storage_options_option, worker_counts)

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nbody-dask")
def main() -> None:
    """Gravitational N-body simulation on Dask: direct summation or a tree for isolated
    systems, Ewald sums or TreePM in periodic and cosmological boxes."""


@main.command()
@click.option("--config", type=click.Path(dir_okay=False), callback=load_config,
              is_eager=True, expose_value=False,
              help="TOML or YAML file of option values (command-line options win).")
@click.option("--ic", default="plummer", show_default=True, metavar="KIND|FILE",
              help="Initial conditions: plummer, hernquist, uniform, kepler, cold-collapse, "
                   "merger, disk, clumps (Plummer spheres in a unit box, with --box-size 1), "
                   "or a body file (.npz, .nc, .zarr, or a trajectory, also as a URL: its last "
                   "snapshot).")
@click.option("-n", "--n", "n", type=int, default=8192, show_default=True,
              help="Number of bodies (plummer, hernquist, uniform, ...).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--eccentricity", type=float, default=0.5, show_default=True,
              help="Orbital eccentricity (kepler).")
@click.option("--steps", type=int, default=None,
              help="Number of steps [default: 200; a cosmological run: from --dt].")
@click.option("--dt", type=float, default=None,
              help="Step length [default: 1/128]; a cosmological run's largest step in ln a "
                   "[default: 0.05, unless --steps].")
@click.option("--softening", type=float, default=0.01, show_default=True,
              help="Plummer softening length.")
@click.option("--snapshot-every", type=int, default=10, show_default=True,
              help="Steps between snapshots.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default=None,
              help="Precision [default: nbody.dtype, float64].")
@click.option("--tile-size", type=int, default=None, help="Bodies per tile [default: auto].")
@click.option("--split-every", type=int, default=None,
              help="Fan-in of the tree reduction of partial forces [default: 8].")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
              help="Tile-pair kernel: auto (CUDA on workers with a GPU), cpu or cuda "
                   "[default: nbody.backend, auto].")
@click.option("--layout", type=click.Choice(["pairs", "rows"]), default=None,
              help="Tasks of a step: pairs (a task per tile pair) or rows (a tile per worker, "
                   "a task per tile on all its cores: the HPC layout) "
                   "[default: nbody.layout, pairs].")
@click.option("--method", type=click.Choice(["auto", "direct", "tree", "treepm"]), default=None,
              help="Forces: direct (exact; Ewald sums with --box-size), tree (O(N log N), "
                   "error set by --theta), treepm (periodic boxes: mesh and tree) or auto "
                   "(direct below 8,192 bodies, 512 in a box) [default: nbody.method, auto].")
@click.option("--theta", type=float, default=None,
              help="The tree's opening angle in (0, 1]: smaller is more accurate and slower "
                   "[default: nbody.theta, 0.4].")
@click.option("--leaf-size", type=int, default=None,
              help="The tree's most bodies per leaf [default: nbody.leaf-size, 64].")
@click.option("--force-error-sample", type=int, default=None, metavar="K",
              help="Record at every snapshot the force error of K sampled bodies against a "
                   "float64 direct sum (median, p99, max) [default: not recorded].")
@click.option("--box-size", type=float, default=None, metavar="L",
              help="Side of a periodic cube (bodies wrapped into [0, L), mean density "
                   "subtracted) [default: nbody.box-size, none: an isolated system].")
@click.option("--mesh-size", type=int, default=None,
              help="TreePM's mesh points per side [default: 2 cbrt(N), at least 32].")
@click.option("--mesh-slabs", type=int, default=None,
              help="TreePM's mesh slabs: 1 FFT task, or more for a distributed FFT "
                   "[default: one task up to 256 MiB of mesh].")
@click.option("--split", type=float, default=None,
              help="TreePM's force split scale in mesh cells [default: nbody.split, 2.5].")
@click.option("--cutoff", type=float, default=None,
              help="TreePM's short-range cutoff in split scales [default: nbody.cutoff, 5].")
@click.option("--cosmology", default=None, metavar="NAME|JSON",
              help="Comoving integration in a box expanding with this cosmology: an astropy "
                   "realization (Planck18, WMAP9, ...) or JSON parameters "
                   "('{\"H0\": 70, \"Om0\": 0.3}') [default: the --ic file's, if any].")
@click.option("--z-end", type=float, default=None,
              help="Redshift a cosmological run ends at [default: 0].")
@click.option("--a-end", type=float, default=None,
              help="Scale factor a cosmological run ends at (instead of --z-end).")
@click.option("--snapshot-redshifts", default=None, metavar="Z,Z,...",
              help="A cosmological run's snapshots at these redshifts too, exactly "
                   "(e.g. 3,1,0.5).")
@click.option("--timestep", type=click.Choice(["global", "individual"]), default=None,
              help="One step --dt for every body, or individual power-of-two steps "
                   "dt / 2**k per body, --dt the longest (direct, tree or treepm) "
                   "[default: nbody.timestep, global].")
@click.option("--step-criterion", type=click.Choice(["pairwise", "acceleration"]),
              default=None,
              help="Individual steps: eta times a smooth maximum of the free-fall times of a "
                   "body's pairs, or eta sqrt(softening / |a|) "
                   "[default: nbody.step-criterion, pairwise; acceleration for treepm].")
@click.option("--eta", type=float, default=None,
              help="Individual steps' accuracy parameter [default: 0.005 pairwise, 0.22 "
                   "acceleration].")
@click.option("--time-bins", type=int, default=None,
              help="Individual steps' bins: the shortest step is dt / 2**(bins - 1) "
                   "[default: nbody.time-bins, 8].")
@click.option("-G", "--G", "G", type=float, default=None,
              help="Gravitational constant [default: 1, Hénon units].")
@click.option("--store", default="run.zarr", show_default=True, metavar="PATH|URL",
              help="Zarr store to write: a path, or an object-store URL (s3://bucket/run.zarr).")
@storage_options_option
@click.option("--overwrite", is_flag=True, help="Replace an existing store.")
@click.option("--max-energy-error", type=float, default=None, metavar="BOUND",
              help="Stop at the first snapshot with |E/E0 - 1| above BOUND [default: none].")
@cluster_options
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
def run(ic, n, seed, eccentricity, steps, dt, softening, snapshot_every, dtype, tile_size,
        split_every, backend, layout, method, theta, leaf_size, force_error_sample, box_size,
        mesh_size, mesh_slabs, split, cutoff, cosmology, z_end, a_end, snapshot_redshifts,
        timestep, step_criterion, eta, time_bins, G, store, storage_options,
        overwrite, max_energy_error, cluster_kind, scheduler, scheduler_file, progress) -> None:
    """Run a simulation and write its trajectory to a Zarr store."""
    from .location import store_location

    with errors_as_messages():
        bodies = initial_conditions(ic, n, seed, eccentricity, storage_options)
        if store_location(store).is_local:  # the options were for --ic
            storage_options = None
        if cosmology is None and "cosmology" not in bodies.attrs:
            steps = 200 if steps is None else steps
            dt = 1 / 128 if dt is None else dt
        elif steps is None and dt is None:
            dt = 0.05
        if cosmology is not None and cosmology.lstrip().startswith("{"):
            cosmology = json.loads(cosmology)
        _simulate_and_report(cluster_kind, scheduler, scheduler_file, store, bodies,
                             steps=steps, dt=dt, softening=softening,
                             snapshot_every=snapshot_every, dtype=dtype, tile_size=tile_size,
                             split_every=split_every, backend=backend, layout=layout,
                             method=method, theta=theta, leaf_size=leaf_size,
                             force_error_sample=force_error_sample, G=G,
                             box_size=box_size, mesh_size=mesh_size,
                             mesh_slabs=mesh_slabs, split=split, cutoff=cutoff,
                             cosmology=cosmology, z_end=z_end, a_end=a_end,
                             snapshot_redshifts=_numbers("--snapshot-redshifts",
                                                         snapshot_redshifts),
                             timestep=timestep, step_criterion=step_criterion, eta=eta,
                             time_bins=time_bins, overwrite=overwrite,
                             progress=progress,
                             max_energy_error=max_energy_error,
                             storage_options=storage_options)


@main.command()
@click.argument("store")
@storage_options_option
@cluster_options
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
@click.option("--max-energy-error", type=float, default=None, metavar="BOUND",
              help="Stop at the first snapshot with |E/E0 - 1| above BOUND [default: none].")
def resume(store, storage_options, cluster_kind, scheduler, scheduler_file, progress,
           max_energy_error) -> None:
    """Continue the run in STORE (a path or URL) from its last committed snapshot."""
    with errors_as_messages():
        _simulate_and_report(cluster_kind, scheduler, scheduler_file, store, None,
                             resume=True, progress=progress, max_energy_error=max_energy_error,
                             storage_options=storage_options)


def _simulate_and_report(cluster_kind: str, scheduler: str | None, scheduler_file: str | None,
                         store: str, bodies: Any, **kwargs: Any) -> None:
    """Run :func:`nbody_dask.simulate` (on ``scheduler`` if given) and print a summary.

    SIGTERM (Slurm's warning before a walltime kill) or Ctrl-C ends the run cleanly: the
    snapshots in flight are committed and the exit code is 143 (128 + SIGTERM) or 130
    (128 + SIGINT), with how to resume. A second Ctrl-C stops at once (exit 130).
    """
    import nbody_dask

    from distributed import Client

    from .clusters import connect, make, shaped_layout

    if cluster_kind != "local" and (scheduler or scheduler_file):
        raise click.UsageError("--cluster cannot be combined with --scheduler/--scheduler-file")
    with contextlib.ExitStack() as stack:
        client = None
        if scheduler is not None or scheduler_file is not None:
            client = stack.enter_context(connect(scheduler, scheduler_file=scheduler_file))
        elif cluster_kind != "local":
            cluster = stack.enter_context(make(cluster_kind))
            client = stack.enter_context(Client(cluster))
            if kwargs.get("layout") is None and not kwargs.get("resume") \
                    and kwargs.get("timestep") != "individual":  # individual steps: pairs
                kwargs["layout"] = shaped_layout(cluster_kind)  # what the workers are made for
        try:
            traj = nbody_dask.simulate(bodies, store=store, client=client, **kwargs)
        except nbody_dask.SimulationInterrupted as exc:
            click.echo(f"nbody-dask: {exc}", err=True)
            sys.exit(128 + exc.signum)
        except KeyboardInterrupt:  # a second Ctrl-C: what was committed stays committed
            where = f"; `nbody-dask resume {store}` continues" if store else ""
            click.echo(f"nbody-dask: stopped at once by a second Ctrl-C{where}", err=True)
            sys.exit(130)
        click.echo(run_summary(store, traj))


@main.command()
@click.argument("store")
@storage_options_option
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Read every committed chunk and check its CRC-32C (reads the whole store).")
def info(store: str, storage_options: dict | None, verify: bool) -> None:
    """Summarise a trajectory store (a path or URL): N, snapshots, time span, conservation."""
    import nbody_dask
    from nbody_dask.storage import verify_trajectory

    with errors_as_messages():
        traj = nbody_dask.open_trajectory(store, storage_options, index=False)  # no ids here
        if verify:
            verify_trajectory(store, storage_options)
        click.echo(run_summary(store, traj))
        if verify:
            click.echo(f"verified     every chunk of {traj.sizes['time']} snapshot(s)")


@main.command()
@click.argument("source", metavar="STORE|KIND|FILE")
@storage_options_option
@click.option("--snapshot", type=int, default=-1, show_default=True,
              help="Snapshot of STORE to measure (negative: from the end).")
@click.option("-n", "--n", "n", type=int, default=65_536, show_default=True,
              help="Bodies of initial conditions KIND (plummer, disk, merger, ...).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Random seed of initial conditions KIND.")
@click.option("--method", type=click.Choice(["auto", "direct", "tree", "treepm"]),
              default=None, help="Force method [default: STORE's, else nbody.method].")
@click.option("--theta", type=float, default=None,
              help="The tree's opening angle [default: STORE's, else nbody.theta].")
@click.option("--leaf-size", type=int, default=None,
              help="The tree's most bodies per leaf [default: STORE's, else nbody.leaf-size].")
@click.option("--softening", type=float, default=None,
              help="Plummer softening [default: STORE's, else 0].")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default=None,
              help="Precision of the forces [default: STORE's, else nbody.dtype].")
@click.option("--box-size", type=float, default=None, metavar="L",
              help="Side of the periodic cube (the reference is then the Ewald sum) "
                   "[default: STORE's, else none].")
@click.option("--sample", type=int, default=1000, show_default=True,
              help="Targets of the float64 direct reference.")
def accuracy(source, storage_options, snapshot, n, seed, method, theta, leaf_size, softening,
             dtype, box_size, sample) -> None:
    """Relative force errors (median, 99th percentile, max) of a force method against a
    float64 direct sum on sampled targets: of a run's method on one of its snapshots (SOURCE
    a trajectory store), or on initial conditions (SOURCE a kind or a body file)."""
    import nbody_dask
    from nbody_dask import config
    from nbody_dask.evaluate import force_accuracy
    from nbody_dask.location import store_location
    from nbody_dask.plan import check_method, resolve_method
    from nbody_dask.storage import is_trajectory_store

    with errors_as_messages():
        settings: dict[str, Any] = {}
        if is_trajectory_store(store_location(source, storage_options)):
            traj = nbody_dask.open_trajectory(source, storage_options)
            attrs = traj.attrs
            bodies = traj.isel(time=snapshot)[["position", "velocity", "mass"]].load()
            settings = dict(method=attrs.get("method", "direct"), theta=attrs.get("theta"),
                            leaf_size=attrs.get("leaf_size"), softening=attrs["softening"],
                            dtype=attrs["dtype"], G=attrs["G"])
            stored = json.loads(attrs.get("config", "{}"))
            settings.update({k: stored[k] for k in ("box_size", "mesh_size", "mesh_slabs",
                                                    "split", "cutoff")
                             if stored.get(k) is not None and stored.get("box_size")})
        else:
            bodies = initial_conditions(source, n, seed, 0.5, storage_options)
        given = dict(method=method, theta=theta, leaf_size=leaf_size, softening=softening,
                     dtype=dtype, box_size=box_size)
        settings.update({k: v for k, v in given.items() if v is not None})
        settings.setdefault("softening", 0.0)
        errors = force_accuracy(bodies, sample=sample, **settings)
        method = resolve_method(check_method(config.get("method", settings.get("method"))),
                                bodies.sizes["body"],
                                config.get("box-size", settings.get("box_size")) is not None)
        click.echo(f"{method}: {errors}")


@main.command("ic")
@click.argument("kind", type=click.Choice(["plummer", "hernquist", "uniform", "kepler",
                                           "cold-collapse", "merger", "disk", "clumps",
                                           "cosmology"]))
@click.argument("output", type=click.Path())
@click.option("-n", "--n", "n", type=int, default=8192, show_default=True,
              help="Number of bodies (not kepler, cosmology).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("-p", "--param", "params", multiple=True, callback=parse_params,
              metavar="KEY=VALUE", help="Generator parameter, e.g. -p toomre_q=1.5 "
              "(repeatable; see the generator's docstring).")
@click.option("--n-side", type=int, default=64, show_default=True,
              help="cosmology: bodies per side of the grid.")
@click.option("--box-size", type=float, default=None, metavar="L",
              help="cosmology: side of the box in Mpc/h [default: n-side x 4 Mpc/h].")
@click.option("--z-start", type=float, default=49.0, show_default=True,
              help="cosmology: starting redshift.")
@click.option("--cosmology", "cosmology_name", default="Planck18", show_default=True,
              metavar="NAME|JSON", help="cosmology: an astropy realization or JSON parameters.")
@click.option("--fixed-amplitude", is_flag=True,
              help="cosmology: every mode at the spectrum's amplitude (no sample variance).")
@click.option("--paired", is_flag=True, help="cosmology: every phase flipped (the pair run).")
@click.option("--power", "power_name", type=click.Choice(["eisenstein-hu", "camb"]),
              default="eisenstein-hu", show_default=True,
              help="cosmology: the linear spectrum (camb: the camb extra).")
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
def ic_command(kind, output, n, seed, params, n_side, box_size, z_start, cosmology_name,
               fixed_amplitude, paired, power_name, overwrite) -> None:
    """Write initial conditions KIND to OUTPUT (.npz, .nc, .zarr or GADGET .hdf5), for
    run --ic OUTPUT. KIND cosmology: a periodic box by 2LPT (comoving Mpc/h, the cosmology
    and the start's scale factor kept in a .zarr or .nc file, so that run --ic continues it
    as a cosmological run)."""
    from .bodyfiles import save_bodies
    from .initial_conditions import generate

    with errors_as_messages():
        if kind == "cosmology":
            from .lpt import cosmological_ics

            spec = (json.loads(cosmology_name) if cosmology_name.lstrip().startswith("{")
                    else cosmology_name)
            bodies = cosmological_ics(n_side, 4.0 * n_side if box_size is None else box_size,
                                      spec, z_start=z_start, seed=seed, power=power_name,
                                      **params, fixed_amplitude=fixed_amplitude,
                                      paired=paired)
        else:
            bodies = generate(kind, n, seed, **params)
        save_bodies(bodies, output, overwrite=overwrite)
        click.echo(f"wrote {bodies.sizes['body']} bodies ({kind}) to {output}")


@main.command()
@click.argument("source")
@click.argument("output", type=click.Path())
@storage_options_option
@click.option("--snapshot", type=int, default=-1, show_default=True,
              help="Snapshot of a trajectory to export (negative from the end).")
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
def export(source, output, storage_options, snapshot, overwrite) -> None:
    """Write one snapshot of SOURCE (a trajectory or body file) to OUTPUT: GADGET/SWIFT HDF5
    (.hdf5, .h5: readable by GADGET-4, AREPO, SWIFT, pynbody, yt), .npz, .nc or .zarr."""
    from .bodyfiles import load_bodies, save_bodies

    with errors_as_messages():
        if same_place(source, output):
            raise ValueError(f"OUTPUT {output!r} is SOURCE: export writes a new file and "
                             "never replaces what it reads")
        bodies = load_bodies(source, snapshot=snapshot, storage_options=storage_options)
        save_bodies(bodies, output, overwrite=overwrite)
        at = f" at time {float(bodies['time']):g}" if "time" in bodies.coords else ""
        click.echo(f"wrote {bodies.sizes['body']} bodies{at} to {output}")


@main.command()
@click.argument("store")
@storage_options_option
@click.option("--out", "directory", type=click.Path(file_okay=False), default=None,
              help="Folder for the images [default: STORE without .zarr, plus -plots; for a "
                   "URL, its last part, in the working directory].")
@click.option("--kind", "kinds", type=click.Choice(["positions", "density", "conservation",
                                                    "lagrangian", "animation", "power"]),
              multiple=True, help="Plots to make (repeatable) [default: positions, "
                                  "conservation, lagrangian]; power: P(k) against linear "
                                  "theory (cosmological runs).")
@click.option("--snapshot", "snapshots", type=int, multiple=True,
              help="Snapshot index for the positions plot (repeatable; negative from the end).")
@click.option("--plane", type=click.Choice(["xy", "xz", "yz"]), default="xy", show_default=True)
@click.option("--view", type=(float, float), default=None, metavar="INCLINATION AZIMUTH",
              help="A rotated view for density and animation, in degrees (0 0 is xy).")
@click.option("--style", type=click.Choice(["points", "density"]), default="points",
              show_default=True, help="What the animation draws.")
@click.option("--overwrite", is_flag=True, help="Replace existing images.")
def plot(store, storage_options, directory, kinds, snapshots, plane, view, style,
         overwrite) -> None:
    """Plot a trajectory: positions, surface density, conservation, Lagrangian radii (PNG),
    animation (GIF)."""
    import nbody_dask
    from nbody_dask import plot as plots
    from nbody_dask.location import store_location

    with errors_as_messages():
        traj = nbody_dask.open_trajectory(store, storage_options)
        if directory is None:
            local = store_location(store, storage_options)
            base = local.path if local.is_local else Path(local.url.rsplit("/", 1)[-1])
            directory = str(base.with_suffix("")) + "-plots"
        paths = plots.save_figures(traj, directory,
                                   kinds or ("positions", "conservation", "lagrangian"),
                                   snapshots=snapshots or None, plane=plane, view=view,
                                   style=style, overwrite=overwrite)
        for path in paths:
            click.echo(f"wrote {path}")


@main.command()
@click.argument("store")
@storage_options_option
@click.option("--mesh-size", type=int, default=None,
              help="Mesh points a side [default: twice the bodies' cube root, at least 16].")
@click.option("--snapshot", "snapshots", type=int, multiple=True,
              help="Snapshot index (repeatable; negative from the end) [default: the last].")
@click.option("--assignment", type=click.Choice(["tsc", "cic"]), default="tsc",
              show_default=True)
@click.option("--out", "output", type=click.Path(dir_okay=False), default=None,
              help="Also write the spectra to a netCDF (.nc) or CSV (.csv) file.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file.")
def power(store, storage_options, mesh_size, snapshots, assignment, output,
          overwrite) -> None:
    """The matter power spectrum of snapshots of a periodic run in STORE: k, P(k) (shot noise
    included) and the modes of each shell, one table a snapshot."""
    import nbody_dask

    from ._validate import check_new_file
    from .power import default_mesh_size
    from .storage import open_trajectory

    with errors_as_messages():
        # no body index: it would be read here, 8 bytes a body
        traj = open_trajectory(store, storage_options=storage_options, index=False)
        if "box_size" not in traj.attrs:
            raise ValueError(f"{store!r} is not a periodic run (no box_size attribute)")
        if output is not None:
            if Path(output).suffix not in (".nc", ".csv"):
                raise ValueError(f"--out must end in .nc or .csv, got {output!r}")
            check_new_file(Path(output), overwrite)
        indices = list(snapshots) or [-1]
        count = traj.sizes["time"]
        for index in indices:
            if not -count <= index < count:
                raise ValueError(f"--snapshot must be in [{-count}, {count - 1}], got {index}")
        mesh = mesh_size or default_mesh_size(traj.sizes["body"])
        spectra = nbody_dask.power_spectrum(traj.isel(time=indices), mesh,
                                            assignment=assignment)
        for i, index in enumerate(indices):
            row = spectra.isel(time=i)
            label = (f"z = {float(row.redshift):.4g}" if "redshift" in row.coords
                     else f"time = {float(row.time):.6g}")
            click.echo(f"# snapshot {index} ({label}), mesh {mesh}, shot noise "
                       f"{float(row.shot_noise):.6g}")
            click.echo(f"# {'k':>12} {'P(k)':>14} {'modes':>8}")
            for k, p, m in zip(row.k.values, row.power.values, row.modes.values, strict=True):
                click.echo(f"{k:14.6g} {p:14.6g} {int(m):8d}")
        if output is not None:
            if output.endswith(".nc"):
                spectra.to_netcdf(output)
            else:
                spectra[["power", "modes"]].to_dataframe().to_csv(output)
            click.echo(f"wrote {output}")


@main.command()
@click.argument("store")
@storage_options_option
@click.option("--snapshot", type=int, default=-1, show_default=True,
              help="Snapshot index (negative from the end).")
@click.option("--linking-length", type=float, default=0.2, show_default=True,
              help="In mean interparticle spacings.")
@click.option("--min-members", type=int, default=20, show_default=True,
              help="Fewest bodies of a halo.")
@click.option("--out", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the catalogue to a netCDF (.nc) or CSV (.csv) file.")
@click.option("--plot", "figure", type=click.Path(dir_okay=False), default=None,
              help="Draw the halo mass function against a fit (colossus) to this PNG "
                   "(cosmological runs).")
@click.option("--overwrite", is_flag=True, help="Replace existing --out and --plot files.")
def halos(store, storage_options, snapshot, linking_length, min_members, output, figure,
          overwrite) -> None:
    """Friends-of-friends halos of a snapshot of a periodic run in STORE: how many, the
    heaviest ten, the mass function's bins."""
    import nbody_dask

    from ._validate import check_new_file
    from .halos import mass_function
    from .storage import open_trajectory

    with errors_as_messages():
        # no body index: it would be read here, 8 bytes a body
        traj = open_trajectory(store, storage_options=storage_options, index=False)
        if "box_size" not in traj.attrs:
            raise ValueError(f"{store!r} is not a periodic run (no box_size attribute)")
        count = traj.sizes["time"]
        if not -count <= snapshot < count:
            raise ValueError(f"--snapshot must be in [{-count}, {count - 1}], got {snapshot}")
        for path, suffixes in ((output, (".nc", ".csv")), (figure, (".png",))):
            if path is not None:
                if Path(path).suffix not in suffixes:
                    raise ValueError(f"{path!r} must end in {' or '.join(suffixes)}")
                check_new_file(Path(path), overwrite)
        if figure is not None and "cosmology" not in traj.attrs:
            raise ValueError("--plot compares with a cosmological fit: the run has no "
                             "cosmology")
        snap = traj.isel(time=snapshot)
        found = nbody_dask.friends_of_friends(snap, linking_length, min_members)
        where = (f"z = {float(snap.redshift):.4g}" if "redshift" in snap.coords
                 else f"time = {float(snap.time):.6g}")
        click.echo(f"{found.sizes['halo']} halos of >= {min_members} bodies at {where} "
                   f"(b = {linking_length:g}: {found.attrs['linking_length']:.4g} length units;"
                   f" masses in code units{_solar_masses(traj.attrs)})")
        if found.sizes["halo"]:
            click.echo(f"# {'id':>10} {'members':>8} {'mass':>12} {'x':>10} {'y':>10} "
                       f"{'z':>10}")
            for i in range(min(10, found.sizes["halo"])):
                h = found.isel(halo=i)
                x, y, z = h.position.values
                click.echo(f"{int(h.id):12d} {int(h.members):8d} {float(h.mass):12.5g} "
                           f"{x:10.4g} {y:10.4g} {z:10.4g}")
            hmf = mass_function(found, min(10, max(1, found.sizes["halo"] // 3)))
            click.echo("# mass function: bin centre, dn/dlog10 M, halos")
            for m, n, c in zip(hmf.mass.values, hmf.dn_dlog10m.values, hmf["count"].values,
                               strict=True):
                click.echo(f"{m:14.6g} {n:14.6g} {int(c):6d}")
        if output is not None:
            if output.endswith(".nc"):
                found.to_netcdf(output)
            else:
                import pandas as pd

                columns = {"id": found.id.values, "members": found.members.values,
                           "mass": found.mass.values}
                for v in ("position", "velocity"):
                    for a, axis in enumerate("xyz"):
                        columns[f"{v}_{axis}"] = found[v].values[:, a]
                pd.DataFrame(columns).to_csv(output, index=False)
            click.echo(f"wrote {output}")
        if figure is not None:
            from .plot import halo_mass_function

            halo_mass_function(found, traj.attrs["cosmology"], float(snap.redshift)).savefig(
                figure, dpi=120)
            click.echo(f"wrote {figure}")


def _numbers(option: str, text: str | None) -> list[float] | None:
    """A comma-separated list of numbers (None: not given)."""
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}",
                                 param_hint=option) from None


def _solar_masses(attrs: dict) -> str:
    """What one code unit of mass is, for a cosmological run (else nothing)."""
    if "cosmology" not in attrs:
        return ""
    from .cosmology import as_cosmology, mass_unit_msun_h

    return f", 1 = {mass_unit_msun_h(as_cosmology(attrs['cosmology'])):.4g} Msun/h"


@main.command()
@click.option("-n", "--n", "sizes", type=int, multiple=True, default=(16_384, 65_536),
              show_default=True, help="Numbers of bodies to run (repeat the option).")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32",
              show_default=True)
@click.option("--steps", type=int, default=30, show_default=True,
              help="Steps of the long run; a run of 10 steps is subtracted (differential).")
@click.option("--reps", type=int, default=1, show_default=True,
              help="Repeats of each simulate() measurement (median and spread).")
@click.option("--kernel-sweep/--no-kernel-sweep", default=True, show_default=True,
              help="One-thread kernel rate over source tiles of 1k..128k bodies.")
@click.option("--strong", "strong_n", type=int, default=None,
              help="Strong scaling at this N over --workers worker processes.")
@click.option("--weak", "weak_n", type=int, default=None,
              help="Weak scaling with this N per worker over --workers worker processes.")
@click.option("--workers", default=None,
              help="Worker counts for the scaling tables, e.g. 1,2,4 [default: 1..cores].")
@click.option("--reference", type=click.Path(file_okay=False), default=None,
              help="Folder of refbench.py [default: ../shared/bench when present].")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Kernel backend of the simulate() runs.")
@click.option("--method", type=click.Choice(["direct", "tree", "auto"]), default="direct",
              show_default=True,
              help="Force method of the simulate() runs (the tree's rate is effective: N² "
                   "over the time of a step). With tree, also one force evaluation per N: "
                   "time, force errors and the ratio to pytreegrav (when installed).")
@click.option("--theta", type=float, default=None,
              help="The tree's opening angle [default: nbody.theta, 0.4].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the results to this JSON file.")
def bench(sizes, dtype, steps, reps, kernel_sweep, strong_n, weak_n, workers, reference,
          backend, method, theta, json_path) -> None:
    """Measure kernels, simulate() and scaling, with ratios to the C reference."""
    import json
    import os
    import platform

    from . import benchmark

    with errors_as_messages():
        refbench = benchmark.find_reference(reference)
        if reference and refbench is None:
            raise click.ClickException(f"no refbench.py in {reference!r}")
        cores = os.cpu_count() or 1
        counts = worker_counts(workers, cores)
        results = []
        ref_kernel = "plain_f64" if dtype == "float64" else "avx512_j"

        def with_reference(result: dict, n: int, threads: int) -> dict:
            if refbench is not None:
                result["reference"] = benchmark.reference_rate(refbench, n, threads, ref_kernel)
            results.append(result)
            return result

        if backend == "cuda":
            from .kernels import cuda

            if not cuda.available():
                raise click.ClickException(
                    "--backend cuda needs a CUDA GPU in this process, and numba.cuda finds "
                    "none here (no device or driver); use --backend cpu or auto")
            for kernel in benchmark.cuda_variants(262_144, dtype=dtype):
                results.append(kernel)
                click.echo(rate_line(f"CUDA kernel, 262144 x 262144, block {kernel['block']}, "
                                      f"{kernel['per_thread']} targets/thread, tiles on the "
                                      "device", kernel))
        elif kernel_sweep:
            for symmetric in (False, True):
                for k in benchmark.kernel_sweep(dtype=dtype, symmetric=symmetric):
                    with_reference(k, 65_536, 1)
                    name = "symmetric kernel" if symmetric else "kernel"
                    click.echo(rate_line(f"{name}, 1 thread, {k['n_targets']} x "
                                          f"{k['n_sources']}", k))
        for n in sizes:
            run = benchmark.simulate_rate(n, steps=steps, dtype=dtype, backend=backend,
                                          reps=reps, method=method)
            with_reference(run, n, run["threads"])
            spread = (f" [{run['seconds_per_step_min'] * 1e3:.0f}.."
                      f"{run['seconds_per_step_max'] * 1e3:.0f}]" if reps > 1 else "")
            click.echo(rate_line(f"simulate N={n}, {run['method']}, {run['backend']}, "
                                  f"tile {run['tile_size']}, "
                                  f"{run['threads']} threads, "
                                  f"{run['seconds_per_step'] * 1e3:.0f}{spread} ms/step", run))
            if method == "tree":
                _bench_tree_evaluation(n, theta, dtype, results)
        evaluations = [r for r in results if r.get("kind") == "evaluation"]
        if len(evaluations) > 1:
            small, large = evaluations[0], evaluations[-1]
            growth = (large["seconds"] / large["n"]) / (small["seconds"] / small["n"])
            log_growth = math.log(large["n"]) / math.log(small["n"])
            click.echo(f"tree: cost per body x{growth:.2f} from N={small['n']} to "
                       f"N={large['n']} (log N alone: x{log_growth:.2f})")
        for kind, n in (("strong", strong_n), ("weak", weak_n)):
            if n:
                rows = benchmark.scaling(kind, n, counts, steps=steps, dtype=dtype)
                for row in rows:
                    with_reference(row, row["n"], row["workers"])
                click.echo(benchmark.scaling_table(rows))
        if json_path:
            payload = {"dtype": dtype, "cpu_count": cores, "machine": platform.processor()
                       or platform.machine(), "python": platform.python_version(),
                       "results": results}
            Path(json_path).write_text(json.dumps(payload, indent=2))


def _bench_tree_evaluation(n: int, theta: float | None, dtype: str, results: list) -> None:
    """One tree evaluation at ``n`` and, when installed, pytreegrav's: echoed and kept."""
    from . import benchmark, config

    ours = benchmark.force_evaluation(n, theta=theta, dtype=dtype)
    results.append(ours)
    click.echo(f"one evaluation N={n}, tree theta={config.get('theta', theta)}: "
               f"{ours['seconds']:.3f} s, force error median {ours['median']:.2e}, "
               f"p99 {ours['p99']:.2e}, max {ours['max']:.2e}")
    theirs = benchmark.pytreegrav_evaluation(n)
    if theirs is None:
        click.echo("  pytreegrav is not installed (pip install 'nbody-dask[bench]'): no ratio")
        return
    results.append(theirs)
    ratio = ours["seconds"] / theirs["seconds"]
    ours["ratio_to_pytreegrav"] = ratio
    click.echo(f"  pytreegrav theta={theirs['theta']}: {theirs['seconds']:.3f} s, median "
               f"{theirs['median']:.2e}, p99 {theirs['p99']:.2e}; ratio {ratio:.2f}x "
               f"({'no worse' if ours['median'] <= theirs['median'] else 'worse'} median)")


if __name__ == "__main__":  # pragma: no cover
    main()
