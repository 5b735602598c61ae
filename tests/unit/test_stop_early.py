"""trainer.stop_val_acc: which evaluations stop a run (the run itself: tests/integration/test_checkpoints.py)."""

import pytest

from mmrl.config import TrainerConfig
from mmrl.trainer.evaluation import stops_early


@pytest.mark.parametrize(("threshold", "step", "val_acc", "stops"), [
    (0.0, 5, 1.0, False),   # off
    (0.95, 5, 0.94, False),  # below
    (0.95, 5, 0.95, True),   # reached
    (0.95, 5, 1.0, True),
    (0.95, 10, 1.0, False),  # the last step ends the run anyway: not an early stop
])
def test_a_run_stops_early_only_below_its_last_step_at_or_above_the_threshold(threshold, step, val_acc, stops, capsys):
    cfg = TrainerConfig(steps=10, stop_val_acc=threshold)
    assert stops_early(cfg, step, val_acc) is stops
    assert ("stopping at step 5 of 10" in capsys.readouterr().out) is stops
