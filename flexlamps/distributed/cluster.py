"""Connect to a Ray cluster (or start one on this machine) and size the engine workers.

`--ray` alone uses `$RAY_ADDRESS` when set and otherwise starts a private cluster on this
machine, shut down when the command ends; `--ray local` always starts one; `--ray auto` joins a
cluster started with `ray start` here; `--ray HOST:PORT` / `ray://HOST:PORT` joins that one.
An address is checked with a plain TCP connect first: Ray itself retries an unreachable
address for minutes.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Iterator

from flexlamps.cache_folder import default_offload_dir

INSTALL_HINT = "pip install 'flexlamps[ray]' (or: pip install ray)"
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # results and shards are small; Ray's default takes 30% of RAM
CONNECT_TIMEOUT_S = 5.0


class DistributedError(RuntimeError):
    """A scale-out failure the user can act on; the message says what to do."""


class RayUnavailableError(DistributedError):
    """Ray is not installed, or the cluster cannot be reached or cannot hold the workers."""


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise RayUnavailableError(f"--ray needs Ray, which is not installed ({e}); {INSTALL_HINT}") from None
    return ray


@dataclass(frozen=True)
class WorkerSlots:
    num_workers: int
    actor_options: dict[str, Any] = field(default_factory=dict)  # ray.remote resources of one worker
    on_gpu: bool = False


def plan_workers(resources: dict[str, float], requested: int | None, threads: int) -> WorkerSlots:
    """One worker per GPU when the cluster has GPUs, else one per `threads` CPUs; `requested`
    (--ray-workers) overrides the count but must fit."""
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    if gpus:
        n = requested or gpus
        if n > gpus:
            raise RayUnavailableError(f"--ray-workers {n}: the cluster has {gpus} GPUs, one per worker")
        return WorkerSlots(n, {"num_gpus": 1, "num_cpus": min(threads, max(1, cpus // n))}, on_gpu=True)
    n = requested or cpus // threads
    if n < 1 or n * threads > cpus:
        raise RayUnavailableError(f"{n or 1} workers x {threads} threads need {(n or 1) * threads} CPUs; "
                                  f"the cluster has {cpus}. Lower --ray-workers or --threads.")
    return WorkerSlots(n, {"num_cpus": threads})


def worker_offload_dir(offload_dir: str | None, rank: int) -> str | None:
    """Workers sharing a machine must not share an offload folder: each gets a subfolder (of the
    cache folder's offload/ when none is given)."""
    return os.path.join(default_offload_dir() if offload_dir is None else offload_dir, f"ray-worker-{rank}")


def _host_port(address: str) -> tuple[str, int]:
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RayUnavailableError(f"--ray {address!r}: give HOST:PORT (the head's GCS port, 6379 by default), "
                                  "ray://HOST:PORT, auto (a cluster started here with `ray start`), or nothing "
                                  "(a private cluster on this machine)")
    return host, int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise RayUnavailableError(f"cannot reach a Ray cluster at {address} ({e.strerror or e}); start one there "
                                  "with `ray start --head`, or run with --ray alone for a cluster on this "
                                  "machine") from None


def _start_local(ray, num_cpus: int | None) -> None:
    ray.init(address="local", num_cpus=num_cpus, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
             include_dashboard=False, logging_level="ERROR", log_to_driver=False)


def _join(ray, address: str) -> None:
    if address != "auto":
        check_reachable(address)
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except ConnectionError as e:
        raise RayUnavailableError(f"cannot join a Ray cluster at {address}: {e}") from None


@contextlib.contextmanager
def ray_cluster(address: str | None, num_workers: int | None, threads: int) -> Iterator[WorkerSlots]:
    """Connect (reusing a connection the caller already made), yield the worker sizing, and
    disconnect at the end, which also stops a cluster started here."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        address = address or os.environ.get("RAY_ADDRESS") or "local"
        if address == "local":
            _start_local(ray, num_workers * threads if num_workers else None)
        else:
            _join(ray, address)
    try:
        yield plan_workers(ray.cluster_resources(), num_workers, threads)
    finally:
        if started:
            ray.shutdown()
