"""One Ray session for all integration tests (2 cores are all there is)."""

import pytest
import ray


@pytest.fixture(scope="session", autouse=True)
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    yield
    ray.shutdown()
