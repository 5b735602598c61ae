"""The run's sections: the RL loop (``trainer``), evaluation, resources, tracking and the demo's bar."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmrl.config_fields import num


@dataclass(kw_only=True)
class TrainerConfig:
    init: str = "outputs/sft/checkpoint"
    """Checkpoint the RL run starts from."""
    out_dir: str = "outputs/rl"
    """Where the final checkpoint (``<out_dir>/checkpoint``) is written."""
    steps: int = num(100, ge=1)
    prompts_per_step: int = num(16, ge=1)
    eval_every: int = num(25, ge=0)
    """Evaluate on the val split every this many steps (0: only at the end)."""
    val_size: int = num(128, ge=1)
    """Val prompts per evaluation."""
    stop_val_acc: float = num(0.0, ge=0, le=1)
    """Stop the run after an evaluation whose val accuracy (``val/acc``) reaches this, checkpointed and exported
    as at its last step (0: run every step). The lr schedule stays the one of ``steps``; a resumed run that
    had stopped trains no further."""
    experiment: str = "mmrl"
    """MLflow experiment name."""
    run_name: str = ""
    save_every: int = num(50, ge=0)
    """Write a resumable checkpoint (``<out_dir>/step_<N>/``) every this many steps; the last step is
    always saved. 0: only the last step."""
    profile_steps: list[int] = field(default_factory=list)
    """Steps whose work on the actor group's ranks torch's profiler records: each rank's Chrome trace
    (``trace_rank<r>.json.gz``, for chrome://tracing or Perfetto) and its top operators (``ops_rank<r>.txt``) under
    ``<out_dir>/profile/step_<N>/``, logged as MLflow artifacts (``profile/step_<N>/``) with the step's phase
    shares. A profiled step runs slower than the others: its timing is the profiler's too."""
    keep_last: int = num(2, ge=1)
    """Resumable checkpoints kept; older ones are deleted once a newer one is complete."""
    resume: str = "auto"
    """``auto``: continue from the newest complete checkpoint in ``out_dir`` if there is one; ``never``:
    start from ``init``; or the path of a ``step_<N>`` checkpoint folder."""
    max_restarts: int = num(3, ge=0)
    """Times a run rebuilds its workers from the newest checkpoint after a worker died or hung."""
    step_timeout_s: float = num(1800.0, gt=0)
    """A call to the workers (and any collective inside it) that takes longer counts as a hung worker."""
    skip_solved_after: int = num(0, ge=0)
    """Skip a prompt whose last this many groups had every sample right (0: off; :mod:`mmrl.trainer.pass_rates`)."""
    unsolved_revisit_rate: float = num(1.0, ge=0, le=1)
    """Draw a prompt never solved so far (every sample of every group wrong) with this probability (1: off)."""
    guide_unsolved: bool = False
    """A group whose every sample is wrong gets its row's known-good response (``extra["guide"]``, else the answer
    in the trained format; with agent rollouts a whole episode, its policy turns the guide's, its tool turns the
    real tools') in place of its last sample (LUFFY-style off-policy guidance, importance weight 1 with respect to
    the policy before the update: :mod:`mmrl.trainer.guidance`). Off by default until measured."""
    mode: Literal["sync", "async"] = "sync"
    """The trainer's rollout source (:mod:`mmrl.trainer.sources`). sync: generate, score, update, one after the
    other on the trainer's workers (the hybrid engine). async: a rollout pool (``rollout.num_workers``) generates
    the next batches while the trainer updates, with weights at most ``max_staleness`` versions old."""
    max_staleness: int = num(1, ge=0)
    """async: the most weight versions a trained sample may be behind the trainer (0: exactly the sync run)."""
    stale_policy: Literal["wait", "drop"] = "wait"
    """async: wait (the default): at most ``max_staleness + 1`` batches are in flight, so no sample is ever too
    old and none is wasted; the rollout pool waits for weights when it is that far ahead. drop: one more batch
    is in flight, so the rollout pool never waits, and a batch older than ``max_staleness`` is dropped
    (``async/dropped_groups``)."""
    max_skipped_steps: int = num(3, ge=0)
    """Steps in a row whose update may be skipped for a non-finite reward, advantage, loss or gradient;
    one more stops the run with an error."""


@dataclass(kw_only=True)
class EvalConfig:
    checkpoint: str = "outputs/rl/checkpoint"
    split: str = "test"
    batch_size: int = num(64, ge=1)
    max_new_tokens: int = num(16, ge=1)
    """Response length limit of every evaluation: the RL run's validation, SFT's and ``make eval``
    (``rollout.max_new_tokens`` limits the training rollouts only)."""
    run_name: str = ""


@dataclass(kw_only=True)
class ResourcesConfig:
    num_workers: int = num(1, ge=1)
    """Workers in the actor/rollout/reference group (data-parallel ranks)."""
    threads_per_worker: int = num(0, ge=0)
    """torch threads per worker; 0 means the machine's cores divided by the number of workers."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto`` takes a GPU when one is visible."""
    ray_address: str = ""
    """An existing Ray cluster's address; empty starts a local Ray."""
    reuse_workers: bool = False
    """Keep the worker processes of a finished run (or of groups a recovery rebuilds) idle, and start later
    worker groups in them instead of in new processes (saves each rank's start: seconds of CPU for Python,
    torch and transformers). A process is reused only after its worker was torn down cleanly (process group
    and DTensor caches gone, memory freed, RNGs, threads and environment as at its start); never after a
    failure, and never after it ran vLLM. On CPU an idle process holds no Ray resources and serves a later
    group of any shape on its node (at most ``mmrl.controller.reuse.MAX_IDLE_PER_NODE`` wait per node); on GPU
    it keeps its bundle until a pool of another shape needs it. Idle processes hold memory until
    ``mmrl.controller.reuse.release_idle_workers()`` or the driver's end, so it is off by default: turn it on
    where one driver process runs many short runs (tests, sweeps, notebooks)."""


@dataclass(kw_only=True)
class TrackingConfig:
    uri: str = ""
    """MLflow tracking URI; empty means $MLFLOW_TRACKING_URI, else a sqlite file under outputs/."""
    sqlite_path: str = "outputs/mlflow.db"
    """The default store's sqlite file."""
    artifact_dir: str = "outputs/mlartifacts"
    """Where the default store keeps run artifacts (curves, rollout tables)."""
    system_metrics: bool = True
    """Log MLflow's system metrics (CPU, memory, disk, network; GPU when one is visible and pynvml is installed)."""
    system_metrics_interval_s: float = num(10.0, gt=0)
    """Seconds between two samples of the system metrics."""
    mfu: bool = True
    """Measure each actor rank's matmul peak when the RL run starts (about a second on a CPU) and log each phase's
    ``perf/mfu/<phase>`` and ``perf/tflop/<phase>`` against it (:mod:`mmrl.trainer.perf`); off: neither."""
    log_model: bool = True
    """Log the RL run's final policy as an MLflow model (``policy``: the Hugging Face folder in a pyfunc model
    whose ``predict`` gives greedy answers; :mod:`mmrl.trainer.policy_model`)."""
    register_model: str = ""
    """When set, the logged policy is also registered under this name in the model registry."""
    trace_episodes: int = num(0, ge=0)
    """Samples of each RL step logged as MLflow traces of the run (:mod:`mmrl.trainer.traces`: one trace per
    episode, a span per turn and tool call, the images as attachments); 0: none."""


@dataclass(kw_only=True)
class BarConfig:
    """The bar a demo config must meet (``make demo`` prints PASS or FAIL against it; ``make results`` records it).
    A demo's accuracies are greedy, on the test split; 0 leaves that bar unset."""

    rl_acc: float = num(0.0, ge=0, le=1)
    """The accuracy the RL checkpoint must reach."""
    gain: float = num(0.0, ge=-1, le=1)
    """The least gain of the RL checkpoint over the SFT start (``rl_acc - sft_acc``)."""
    rl_minutes: float = num(0.0, ge=0)
    """The most minutes the RL stage may take (the demo summary's own time; 0: no time bar)."""


