"""Starting (or joining) Ray and sizing the local workers."""

from __future__ import annotations

import os

import ray

from mmrl.config import ResourcesConfig
from mmrl.controller.reuse import idle_cpus

WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore::DeprecationWarning"}


def ensure_ray(cfg: ResourcesConfig) -> None:
    """Join ``resources.ray_address``, or start a new local Ray without the dashboard (about 3 s).

    ``address="local"`` always starts a new instance: a bare ``ray.init()`` would join whatever cluster
    Ray's temp folder names (a user's running cluster, or a stale one left by a crash).
    """
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": WORKER_ENV}
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, runtime_env=runtime_env)
    else:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, runtime_env=runtime_env,
                 log_to_driver=True, configure_logging=False)


def worker_shape(cfg: ResourcesConfig, use_gpu: bool, pools: int = 1, others: int = 0) -> tuple[float, int]:
    """(CPUs per bundle, torch threads per worker) for ``pools`` pools of ``resources.num_workers`` bundles, beside
    ``others`` bundles of pools that run at the same time (the async mode's rollout pool).

    On CPU the available CPUs are split evenly over all bundles; colocated groups then share a bundle, and pools
    that run one after the other each compute with all of a worker's share.
    """
    # Idle reused workers' CPUs count as free: a pool of another shape removes them (mmrl.controller.reuse).
    # Ray lists no "CPU" while none is free: all held by idle pools, or just after a placement group's removal.
    free = ray.available_resources().get("CPU")
    cpus = float(free) + idle_cpus() if free is not None else idle_cpus() or float(os.cpu_count() or 1)
    per_worker = max(cpus / (cfg.num_workers * pools + others), 0.25) if not use_gpu else 1.0
    threads = cfg.threads_per_worker or max(1, int(cpus // (cfg.num_workers + others)))
    return per_worker, threads
