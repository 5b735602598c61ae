"""Resource pools shared by worker groups (real Ray placement groups), the reuse of warm worker processes, and
the embedded local Ray."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray

from mmrl.controller import ResourcePool, Worker, WorkerFailure, WorkerGroup


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


def on_ranks(group: WorkerGroup, fn) -> list:
    """``fn(host)`` run inside each rank's process (``fn`` a lambda: pickled by value)."""
    return ray.get([host.__ray_call__.remote(fn) for host in group.workers], timeout=60)


def pids(group: WorkerGroup) -> list[int]:
    return on_ranks(group, lambda host: os.getpid())


def reusable_group(cpus: float = 0.5, threads: int = 1, timeout_s: float = 1800.0) -> WorkerGroup:
    return WorkerGroup(Worker, ResourcePool(1, cpus_per_worker=cpus, name="reused", reuse=True), threads=threads,
                       device="cpu", timeout_s=timeout_s)


def gone(pid: int, within_s: float = 30.0) -> bool:
    """Whether process ``pid`` ended (or is a zombie) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status")
        if not status.exists() or "State:\tZ" in status.read_text():
            return True
        time.sleep(0.2)
    return False


def test_a_healthy_group_s_process_serves_the_next_group_of_its_shape_as_a_fresh_one_would():
    import torch

    first = reusable_group()
    (pid,) = pids(first)
    fresh = on_ranks(first, lambda host: (torch.rand(3).tolist(), torch.get_num_threads(), sorted(os.environ)))
    on_ranks(first, lambda host: (os.environ.update(MMRL_LEFTOVER="1"), torch.set_num_threads(2),
                                  torch.set_default_dtype(torch.float64)))
    on_ranks(first, lambda host: __import__("mmrl.parallel.sharding", fromlist=["_MESHES"])._MESHES.update(x=1))
    first.shutdown()
    second = reusable_group()
    assert pids(second) == [pid]
    # the first draws of torch's generator, the threads and the environment of a fresh process
    assert on_ranks(second, lambda host: (torch.rand(3).tolist(), torch.get_num_threads(), sorted(os.environ))) \
        == fresh
    assert on_ranks(second, lambda host: torch.get_default_dtype()) == [torch.float32]
    assert on_ranks(second, lambda host: __import__("mmrl.parallel.sharding", fromlist=["_MESHES"])._MESHES) == [{}]
    # a new process group (on a new port), which the group's collectives use
    assert second.peak_memory_gb()[0] > 0
    assert on_ranks(second, lambda host: __import__("torch.distributed").distributed.get_world_size()) == [1]
    second.shutdown()


def free_cpus_after(action) -> float:
    """Ray's free CPUs once ``action()`` ran and a placement group it removed gave its CPUs back."""
    action()
    time.sleep(1.0)
    return ray.available_resources().get("CPU", 0.0)


def test_an_idle_cpu_process_holds_no_resources_and_serves_a_group_of_any_shape():
    free = free_cpus_after(lambda: None)  # a previous test's placement group may still be giving CPUs back
    first = reusable_group(threads=1)
    (pid,) = pids(first)
    assert free_cpus_after(first.shutdown) == pytest.approx(free)  # idle, it holds no CPU
    wider = WorkerGroup(Worker, ResourcePool(2, cpus_per_worker=0.25, name="wider", reuse=True), threads=0,
                        device="cpu")
    assert pid in pids(wider)  # two ranks of a quarter CPU each: the idle process is one of them
    assert wider.torch_threads() == [1, 1]  # threads=0: as many as its CPUs, at least one
    wider_pids = set(pids(wider))
    wider.shutdown()
    assert wider_pids <= pids_of_idle()
    more_threads = reusable_group(cpus=1.0, threads=2)  # a whole CPU, two threads: one of them again
    assert pids(more_threads)[0] in wider_pids and more_threads.torch_threads() == [2]
    more_threads.shutdown()


def pids_of_idle() -> set[int]:
    from mmrl.controller.reuse import idle_hosts

    return set(ray.get([host.__ray_call__.remote(lambda host: os.getpid()) for host in idle_hosts()], timeout=60))


def test_idle_processes_past_the_cap_are_killed_the_longest_idle_first(monkeypatch):
    from mmrl.controller import reuse

    monkeypatch.setattr(reuse, "MAX_IDLE_PER_NODE", 1)
    first, second = reusable_group(cpus=0.25), reusable_group(cpus=0.25)
    (pid_1,), (pid_2,) = pids(first), pids(second)
    first.shutdown()
    second.shutdown()
    assert gone(pid_1) and pids_of_idle() == {pid_2}


def test_a_failed_process_is_never_reused():
    hung = reusable_group(timeout_s=3.0)
    (pid,) = pids(hung)
    os.kill(pid, signal.SIGSTOP)
    with pytest.raises(WorkerFailure, match="did not finish within 3 s"):
        hung.torch_threads()
    hung.shutdown()
    after_vllm = reusable_group(timeout_s=3.0)
    (pid_2,) = pids(after_vllm)
    assert pid_2 != pid and gone(pid)
    # a process that imported vLLM (here: a stand-in module of that name) is never reused either
    on_ranks(after_vllm, lambda host: sys.modules.setdefault("vllm", type(sys)("vllm")))
    after_vllm.shutdown()
    last = reusable_group(timeout_s=3.0)
    assert pids(last) != [pid_2] and gone(pid_2)
    last.shutdown()


def test_a_process_that_changes_rank_shards_for_its_new_rank():
    """DTensor caches shardings by mesh, and meshes compare equal across ranks: a reused process must not
    keep the mesh (and so the coordinate) of the rank it held before."""
    def shard_report(host) -> tuple[int, tuple, tuple]:
        """(rank, the local shard's shape, the shape DTensor reports for this rank) of a (1, 64) weight that FSDP2
        shards over the group: rank 0 holds the row, rank 1 an empty shard."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        layer = torch.nn.Linear(64, 1, bias=False)
        fully_shard(layer, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        weight = layer.weight
        reported, _ = compute_local_shape_and_global_offset(weight.shape, weight.device_mesh, weight.placements)
        return dist.get_rank(), tuple(weight.to_local().shape), tuple(reported)

    def pair():
        return WorkerGroup(Worker, ResourcePool(2, cpus_per_worker=0.25, name="pair", reuse=True), threads=1,
                           device="cpu")

    first = pair()
    before = pids(first)
    assert on_ranks(first, shard_report) == [(0, (1, 64), (1, 64)), (1, (0, 64), (0, 64))]
    first.shutdown()
    second = pair()
    assert pids(second) == before[::-1]  # each process now holds the other rank
    assert on_ranks(second, shard_report) == [(0, (1, 64), (1, 64)), (1, (0, 64), (0, 64))]
    second.shutdown()
