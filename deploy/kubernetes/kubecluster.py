"""Run a simulation on Kubernetes from Python with the dask-kubernetes operator's KubeCluster.

Run it from somewhere that can reach the cluster's API (``KUBECONFIG``) and that mounts the
store volume at the same path as the workers: a notebook pod with ``nbody-store`` at /data,
say (the workers write their own chunks of the store)::

    python deploy/kubernetes/kubecluster.py --image registry.example.org/nbody-dask:0.1.0 \
        --workers 4 --cpu 8 --memory 8Gi --volume-claim nbody-store --store /data/run.zarr

``--gpu-workers 2 --gpu-image ...`` adds a worker group of GPU pods (dask cuda worker) whose
tasks run the CUDA kernel. Without a reachable cluster it stops at once with a one-line error.
"""

from __future__ import annotations

import argparse
import sys

from distributed import Client

import nbody_dask
from nbody_dask import clusters, k8s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="image from deploy/kubernetes/Dockerfile")
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--workers", type=int, default=2, help="CPU worker pods")
    parser.add_argument("--cpu", type=int, default=2, help="cores per worker pod")
    parser.add_argument("--memory", default="4Gi", help="memory per worker pod")
    parser.add_argument("--gpu-workers", type=int, default=0, help="GPU worker pods")
    parser.add_argument("--gpu-image", default=None, help="image built with EXTRAS=kubernetes,gpu")
    parser.add_argument("--volume-claim", default=None, help="RWX PVC mounted at /data")
    parser.add_argument("--n", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--store", default="/data/run.zarr")
    args = parser.parse_args(argv)

    try:
        cluster = clusters.kubernetes(
            image=args.image, n_workers=args.workers, worker_cpu=args.cpu,
            worker_memory=args.memory, volume_claim=args.volume_claim,
            namespace=args.namespace)
    except (ValueError, RuntimeError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with cluster, Client(cluster) as client:
        if args.gpu_workers:
            group = k8s.worker_group_spec(
                cluster.name, "gpu", image=args.gpu_image or args.image,
                n_workers=args.gpu_workers, volume_claim=args.volume_claim)
            cluster.add_worker_group("gpu", custom_spec=group["spec"]["worker"])
        client.wait_for_workers(args.workers + args.gpu_workers, timeout=600)
        print("dashboard:", client.dashboard_link)
        # CPU pods are shaped for the rows (HPC) layout; GPU workers need a task per tile pair
        layout = "pairs" if args.gpu_workers else clusters.shaped_layout("kubernetes")
        trajectory = nbody_dask.simulate(
            nbody_dask.plummer(args.n, seed=0), steps=args.steps, dt=1e-3, softening=0.01,
            dtype="float32", store=args.store, snapshot_every=10, layout=layout,
            client=client)
        print(trajectory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
