"""GRPO with its two ranks on two Ray nodes, and recovery when the second node's rank is killed."""

import copy
from pathlib import Path

import pytest
import ray
from mlflow.tracking import MlflowClient

from mmrl.controller import ResourcePool, WorkerGroup
from mmrl.workers.hybrid import ActorRolloutRefWorker

LENGTH_REWARD = "def score(response):\n    return len(response) / 10\n"


def two_rank_run(cfg, out_dir: Path, address: str, steps: int):
    cfg = copy.deepcopy(cfg)
    plugin = out_dir.parent / "length_reward.py"
    plugin.write_text(LENGTH_REWARD)
    cfg.reward.function, cfg.reward.weights = f"{plugin}:score", {}
    cfg.resources.num_workers, cfg.resources.ray_address = 2, address
    cfg.actor.llm.strategy = "fsdp"
    cfg.trainer.out_dir, cfg.trainer.steps = str(out_dir), steps
    cfg.trainer.save_every, cfg.trainer.keep_last, cfg.trainer.eval_every = 3, 10, 100
    return cfg


def test_the_two_ranks_land_on_different_nodes(two_nodes):
    cluster, second_node = two_nodes
    group = WorkerGroup(ActorRolloutRefWorker, ResourcePool(2, cpus_per_worker=1), threads=1)
    try:
        nodes = group.node_id()
    finally:
        group.shutdown()
    head = ray.get_runtime_context().get_node_id()  # the driver is attached to the head node
    assert sorted(nodes) == sorted([head, second_node])


@pytest.mark.extra  # test_recovery.py kills and recovers on one node; `make test-extra` runs this one
def test_grpo_on_two_nodes_recovers_from_a_kill_on_the_second_node(two_nodes, tiny_config, tmp_path,
                                                                    run_with_a_kill):
    cluster, second_node = two_nodes
    cfg = two_rank_run(tiny_config, tmp_path / "run", cluster.address, steps=9)
    kill = run_with_a_kill(cfg, after_step=3, node=second_node)
    assert kill.node == second_node
    trainer = kill.trainer
    assert trainer.restarts == 1 and trainer.step_no == 9
    (point,) = MlflowClient(cfg.tracking.uri).get_metric_history(kill.run_id, "trainer/restarts")
    assert point.value == 1.0
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()
