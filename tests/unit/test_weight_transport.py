"""The async mode's weight transport: refused where it is only a seam; the store keeps the newest version. (The
object store's hand-off runs in every async run of tests/integration/test_async.py.)"""

import pytest

from mmrl.config import load_config
from mmrl.run_config import prepare_run_config
from mmrl.trainer.weight_transport import WeightStore, build_transport


def test_the_nccl_transport_is_a_seam_refused_at_config_load():
    with pytest.raises(NotImplementedError, match="weight_transport=nccl"):
        prepare_run_config(load_config(None, ["trainer.mode=async", "rollout.weight_transport=nccl"]))
    with pytest.raises(NotImplementedError, match="a seam, not built"):
        build_transport("nccl")


def test_the_store_keeps_the_newest_version():
    store = WeightStore()
    store.publish(2, ["b"])
    store.publish(1, ["a"])  # late: ignored
    assert store.latest() == (2, ["b"])
