"""Starting (or joining) Ray and sizing the local workers."""

from __future__ import annotations

import os

import ray

from mmrl.config import ResourcesConfig

WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore::DeprecationWarning"}


def ensure_ray(cfg: ResourcesConfig) -> None:
    """Join ``resources.ray_address`` or start a local Ray without the dashboard (about 3 s)."""
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": WORKER_ENV}
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, runtime_env=runtime_env)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, runtime_env=runtime_env,
                 log_to_driver=True, configure_logging=False)


def worker_shape(cfg: ResourcesConfig, use_gpu: bool) -> tuple[float, int]:
    """(CPUs per worker, torch threads per worker) for ``resources.num_workers`` workers."""
    cpus = float(ray.available_resources().get("CPU", os.cpu_count() or 1))
    per_worker = max(cpus / cfg.num_workers, 0.5) if not use_gpu else 1.0
    threads = cfg.threads_per_worker or max(1, int(per_worker))
    return per_worker, threads
