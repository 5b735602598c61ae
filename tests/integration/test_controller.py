"""Resource pools shared by worker groups (real Ray placement groups)."""

import ray

from mmrl.controller import ResourcePool, Worker, WorkerGroup


def test_a_shared_pool_outlives_the_first_group_to_shut_down():
    pool = ResourcePool(1, cpus_per_worker=0.5, name="shared")
    actor_like = WorkerGroup(Worker, pool, share=0.5)
    critic_like = WorkerGroup(Worker, pool, share=0.5)
    placement = pool.placement_group()
    critic_like.shutdown()
    assert ray.util.placement_group_table(placement)["state"] == "CREATED"
    (rss,) = actor_like.peak_rss_mb()  # the remaining group still runs on the pool
    assert rss > 0
    late = WorkerGroup(Worker, pool, share=0.5)  # and the pool still places new ranks
    late.shutdown()
    actor_like.shutdown()
    assert ray.util.placement_group_table(placement)["state"] == "REMOVED"
    actor_like.shutdown()  # a second shutdown changes nothing
