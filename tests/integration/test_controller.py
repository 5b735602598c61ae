"""Resource pools shared by worker groups (real Ray placement groups), and the embedded local Ray."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ray

from mmrl.controller import ResourcePool, Worker, WorkerGroup


def test_a_shared_pool_outlives_the_first_group_to_shut_down():
    pool = ResourcePool(1, cpus_per_worker=0.5, name="shared")
    actor_like = WorkerGroup(Worker, pool, share=0.5)
    critic_like = WorkerGroup(Worker, pool, share=0.5)
    placement = pool.placement_group()
    critic_like.shutdown()
    assert ray.util.placement_group_table(placement)["state"] == "CREATED"
    (peak,) = actor_like.peak_memory_gb()  # the remaining group still runs on the pool
    assert peak > 0
    late = WorkerGroup(Worker, pool, share=0.5)  # and the pool still places new ranks
    late.shutdown()
    actor_like.shutdown()
    assert ray.util.placement_group_table(placement)["state"] == "REMOVED"
    actor_like.shutdown()  # a second shutdown changes nothing


def test_the_embedded_ray_ignores_a_stale_cluster_file():
    """Ray's temp folder names a dead cluster: a bare ray.init() would try to join it and fail."""
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    (short / "ray").mkdir()
    (short / "ray" / "ray_current_cluster").write_text("127.0.0.1:6399")
    code = ("import ray\n"
            "from mmrl.config import ResourcesConfig\n"
            "from mmrl.controller.session import ensure_ray\n"
            "ensure_ray(ResourcesConfig())\n"
            "print('cpus', ray.cluster_resources().get('CPU'))\n"
            "ray.shutdown()\n")
    env = {**os.environ, "RAY_TMPDIR": str(short)}
    try:
        started = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert started.returncode == 0, started.stderr[-2000:]
    assert f"cpus {float(os.cpu_count())}" in started.stdout
