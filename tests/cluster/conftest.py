"""A two-node Ray cluster (one CPU per node) started inside the test session, on this machine."""

import pytest
import ray
from ray.cluster_utils import Cluster


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker_node = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
             log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster, worker_node.node_id
    ray.shutdown()
    cluster.shutdown()
