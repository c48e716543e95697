"""What the ``nbody-dask`` commands share: option files and option parsing, the storage and
cluster options, one-line errors, the summary of a run, and the lines ``bench`` prints."""

from __future__ import annotations

import contextlib
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import numpy as np
import yaml

from . import methods

__all__ = ["initial_conditions", "load_config", "storage_options_option", "cluster_options",
           "parse_params", "same_place", "worker_counts", "rate_line", "run_summary",
           "errors_as_messages"]


def initial_conditions(ic: str, n: int, seed: int, eccentricity: float,
                        storage_options: dict | None = None):
    """Bodies from a generator name, or from a file or an object-store trajectory URL (see
    :mod:`nbody_dask.bodyfiles`)."""
    from .bodyfiles import load_bodies
    from .initial_conditions import GENERATORS, generate
    from .location import store_location

    if ic in GENERATORS:
        params = {"eccentricity": eccentricity} if ic == "kepler" else {}
        return generate(ic, n, seed, **params)
    if "://" in ic and not store_location(ic).is_local:
        return load_bodies(ic, storage_options=storage_options)
    if not Path(ic).exists():
        raise click.BadParameter(f"{ic!r} is neither one of {', '.join(GENERATORS)} nor an "
                                 "existing file", param_hint="--ic")
    return load_bodies(ic)


def load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Read a TOML or YAML file of option defaults (keys as the long option names)."""
    if value is None:
        return None
    path = Path(value)
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (OSError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"cannot read {value!r}: {exc}") from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"{value!r} must hold a table of options")
    known = {p.name for p in ctx.command.params}
    options = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(options) - known)
    if unknown:
        raise click.BadParameter(f"unknown option(s) in {value!r}: {', '.join(unknown)}")
    params = {p.name: p for p in ctx.command.params}
    for name, item in options.items():
        problem = _config_type_problem(params[name], item)
        if problem:
            raise click.BadParameter(f"{name.replace('_', '-')} in {value!r} must be "
                                     f"{problem}, got {item!r}")
    ctx.default_map = {**(ctx.default_map or {}), **options}
    return value


def _config_type_problem(param: click.Parameter, value: Any) -> str | None:
    """What a config file value for ``param`` must be, if ``value`` is not that (no coercion:
    ``steps = 2.7`` or ``steps: true`` is an error, not 2 or 1 steps)."""
    if getattr(param, "multiple", False):
        if not isinstance(value, list):
            return "a list"
        problems = [_scalar_problem(param.type, item) for item in value]
        return next((f"a list of {p}" for p in problems if p), None)
    if isinstance(param, click.Option) and param.is_flag:
        return None if isinstance(value, bool) else "true or false"
    return _scalar_problem(param.type, value)


def _scalar_problem(kind: click.ParamType, value: Any) -> str | None:
    """What one value of click type ``kind`` must be, if ``value`` is not that."""
    if isinstance(kind, click.types.IntParamType):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else "an integer"
    if isinstance(kind, click.types.FloatParamType):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "a number"
    if isinstance(value, (list, dict, bool)):
        return "a single value"
    return None


def _read_storage_options(_ctx, _param, value: str | None) -> dict[str, Any] | None:
    """--storage-options: a JSON (or YAML flow) mapping for an object store's file system."""
    if value is None:
        return None
    try:
        options = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0]
        raise click.BadParameter(f"cannot read {value!r}: {problem}") from None
    if not isinstance(options, dict):
        raise click.BadParameter(f"expected a JSON object such as '{{\"anon\": true}}', "
                                 f"got {value!r}")
    return options


def storage_options_option(command):
    """--storage-options for commands that read or write a store given as a URL."""
    return click.option(
        "--storage-options", type=str, default=None, callback=_read_storage_options,
        metavar="JSON",
        help="Options of an object store's file system (fsspec), for a store or trajectory "
             "given as a URL, "
             "e.g. '{\"client_kwargs\": {\"endpoint_url\": \"http://minio:9000\"}}'; "
             "credentials may come from the environment instead (AWS_ACCESS_KEY_ID...).")(command)


def cluster_options(command):
    """--cluster, --scheduler, --scheduler-file: where the run's workers come from."""
    command = click.option(
        "--cluster", "cluster_kind", type=click.Choice(["local", "slurm", "cuda", "kubernetes"]),
        default="local", show_default=True,
        help="Kind of cluster to start (slurm: dask-jobqueue, configured by jobqueue.yaml; "
             "cuda: dask-cuda; kubernetes: the dask-kubernetes operator).")(command)
    command = click.option(
        "--scheduler-file", type=click.Path(dir_okay=False), default=None,
        help="Scheduler file of a running cluster (as written by dask scheduler).")(command)
    return click.option(
        "--scheduler", default=None, metavar="ADDRESS",
        help="Address of a running Dask scheduler [default: start a local cluster].")(command)


def parse_params(_ctx, _param, values: tuple[str, ...]) -> dict[str, Any]:
    params = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        try:
            params[key.strip().replace("-", "_")] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise click.BadParameter(f"cannot read the value of {item!r}: {problem}") from None
    return params


def same_place(first: str, second: str) -> bool:
    """True if two paths or URLs name the same file or store."""
    def place(text: str) -> str:
        if "://" in text and not text.lower().startswith("file://"):
            return text.rstrip("/").lower()
        from .location import store_location

        return str(store_location(text).path.resolve())
    return place(first) == place(second)


def worker_counts(spec: str | None, cores: int) -> tuple[int, ...]:
    if spec is None:
        return tuple(range(1, cores + 1))
    try:
        counts = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {spec!r}",
                                 param_hint="--workers") from None
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"worker counts must be >= 1, got {spec!r}",
                                 param_hint="--workers")
    return counts


def rate_line(label: str, result: dict) -> str:
    rate = result["gint_s"]
    rate = rate["median"] if isinstance(rate, dict) else rate
    line = f"{label}: {rate:.2f} Gint/s ({20 * rate:.0f} GFLOPS)"
    ref = result.get("reference")
    if ref:
        ref_rate = ref["gint_s"]["median"]
        line += (f", reference {ref['kernel']} {ref['threads']} thr {ref_rate:.2f} Gint/s, "
                 f"ratio {rate / ref_rate:.2f}")
    return line


def run_summary(store: str, traj: Any) -> str:
    attrs = traj.attrs
    n_snap = traj.sizes["time"]
    lines = [
        f"store        {store}",
        f"bodies       {traj.sizes['body']}  ({attrs['dtype']}, G = {attrs['G']}, "
        f"softening = {attrs['softening']})",
        f"forces       {_method_line(attrs)}",
        f"snapshots    {n_snap} committed",  # open_trajectory shows committed ones only
    ]
    if n_snap:
        steps = traj.step.values
        times = traj.time.values
        energy = traj.total_energy.values
        lines += [
            f"steps        {int(steps[0])} .. {int(steps[-1])}  (dt = {attrs['dt']}, "
            f"{attrs['integrator']})",
            f"time         {times[0]:.6g} .. {times[-1]:.6g}",
            f"energy       E0 = {energy[0]:.10g}, max |E/E0 - 1| = "
            f"{np.max(np.abs(energy / energy[0] - 1)) if energy[0] else float('nan'):.3e}",
            f"momentum     max |P| = {np.abs(traj.momentum.values).max():.3e}",
        ]
        if "cosmology" in attrs:  # an expanding box: the time is a, energy not conserved
            name = json.loads(attrs["cosmology"]).get("name") or "custom"
            lines[-3:-1] = [f"scale factor {times[0]:.6g} .. {times[-1]:.6g}  (z = "
                            f"{1 / times[0] - 1:.4g} .. {1 / times[-1] - 1:.4g}; comoving, "
                            f"{name})"]
        if "time_bin" in traj:  # individual time steps: where the work went
            work = float(traj.force_evaluations.values[1:].sum()) / traj.sizes["body"]
            lines.append(f"time steps   individual ({attrs['step_criterion']}, eta = "
                         f"{attrs['eta']}, {attrs['time_bins']} bins): {work:.1f} force "
                         f"evaluations per body, shortest bin used "
                         f"{int(traj.time_bin.values.max())}")
        if "force_error" in traj:
            median, p99, largest = traj.force_error.values.max(axis=0)
            lines.append(f"force error  worst snapshot: median {median:.2e}, p99 {p99:.2e}, "
                         f"max {largest:.2e} ({attrs['force_error_sample']} sampled bodies)")
    return "\n".join(lines)


def _method_line(attrs: dict) -> str:
    """The force method of a store and the parameters it declares: ``tree (theta = 0.4,
    leaf_size = 64)``, ``direct``."""
    name = attrs.get("method", "direct")
    shown = [f"{p} = {attrs[p]}" for p in methods.get(name).parameters if p in attrs]
    return f"{name} ({', '.join(shown)})" if shown else name


@contextlib.contextmanager
def errors_as_messages() -> Iterator[None]:
    """Turn the library's input errors into click's one-line messages (exit code 1)."""
    try:
        yield
    except (ValueError, TypeError, OSError, ImportError, RuntimeError, ArithmeticError,
            MemoryError) as exc:
        raise click.ClickException(str(exc)) from None
