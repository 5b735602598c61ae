"""Automatic micro-batch budgets (mmrl.memory.budget): the sizing against hand-computed values, explicit settings
winning, and what the budgets do to the micro-batches at the demo's and at real shapes."""

from __future__ import annotations

import pytest
import torch

from mmrl.memory.budget import (AUTO_CHUNK_BYTES, CPU_CAP_BYTES, MicroBatching, ModelDims, budget_ranges, bytes_per_token,
                         choose, fixed_bytes, mem_available_bytes, memory_at_hand, sharers, token_budget,
                         training_state_bytes)
from mmrl.config import ActorConfig, Config, load_config
from mmrl.models.forward import PolicyForward
from mmrl.models.loading import load_model, load_processor
from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.workers.micro import micro_batches

CPU = torch.device("cpu")
SMALL = ModelDims(hidden=10, layers=2, intermediate=20, kv_dim=4, vocab=100, dtype_bytes=4)
# Qwen2.5-VL-3B's language model in bfloat16.
QWEN_3B = ModelDims(hidden=2048, layers=36, intermediate=11008, kv_dim=256, vocab=151936, dtype_bytes=2)
# The demo's tiny model (configs/demo.yaml: tiny_model defaults, a 384-token vocabulary), float32.
DEMO = ModelDims(hidden=128, layers=3, intermediate=512, kv_dim=64, vocab=384, dtype_bytes=4)


def test_bytes_per_token_by_hand():
    # A layer keeps 13 x 10 + 4 x 20 = 210 float32 elements per token: 840 bytes.
    # update: (2 layers + 1 transient) x 840 + 4 x 10 x 4 outside the layers = 2520 + 160.
    assert bytes_per_token(SMALL, "update") == 2680
    # checkpointed: each layer's input 2 x 10 x 4, two layers' worth (recompute + backward), the outside.
    assert bytes_per_token(SMALL, "update", checkpointing=True) == 80 + 1680 + 160
    # score: max(6 x 10, 2 x 10 + 3 x 20) = 80 elements x 4, plus the final hidden state 10 x 4.
    assert bytes_per_token(SMALL, "score") == 320 + 40
    # rollout: key + value 2 x 4 x 4 bytes in 2 + 1 layers = 96; the prefill's 320 over 4 samples; the
    # decode step's 4 x 100 float32 logits over 10 tokens of the sample.
    assert bytes_per_token(SMALL, "rollout", samples_per_prompt=4, tokens_per_sample=10) == 96 + 80 + 160


def test_narrow_dtypes_keep_the_norms_float32_copies():
    # bfloat16: 210 elements x 2 bytes, plus two norms x 10 wide x the 2 extra bytes of their float32 copies.
    bf16 = ModelDims(hidden=10, layers=2, intermediate=20, kv_dim=4, vocab=0, dtype_bytes=2)
    assert bytes_per_token(bf16, "update") == 3 * (420 + 40) + 4 * 10 * 2


def test_the_logit_chunk_is_a_fixed_cost():
    # Three float32 (5, 100) buffers; the automatic chunk holds AUTO_CHUNK_BYTES of float32 logits.
    assert fixed_bytes(SMALL, "update", logit_chunk_tokens=5) == 3 * 5 * 100 * 4
    assert fixed_bytes(SMALL, "score") == 3 * (AUTO_CHUNK_BYTES // 400) * 400
    value_model = ModelDims(hidden=10, layers=2, intermediate=20, kv_dim=4, vocab=0, dtype_bytes=4)
    assert fixed_bytes(value_model, "update") == 0 and fixed_bytes(SMALL, "rollout") == 0


def test_token_budget_by_hand():
    # (memory - 6000 fixed) // 2680 per token.
    assert token_budget(SMALL, 6000 + 2680 * 7 + 100, "update", logit_chunk_tokens=5) == 7
    assert token_budget(SMALL, 6000 + 1920 * 7, "update", checkpointing=True, logit_chunk_tokens=5) == 7
    # Too little memory for one token still gives a budget: every row then goes alone.
    assert token_budget(SMALL, 10, "update", logit_chunk_tokens=5) == 1


def test_a_3b_model_at_80_gb():
    """Qwen2.5-VL-3B (bf16) with 68 GB for activations: a layer keeps 2 x (13 x 2048 + 4 x 11008) + 2 x 2048 x 2
    = 149,504 bytes per token; 37 x that + 4 x 2048 x 2 = 5,548,032 bytes per token in the update. The logits'
    chunk: 220 tokens (128 MiB of float32 at V = 151,936) x 3 buffers = 401,111,040 bytes. (68e9 - that) //
    5,548,032 = 12,184 tokens. Checkpointed: 36 x 4,096 + 2 x 149,504 + 16,384 = 462,848 bytes: 146,049 tokens."""
    memory = 68 * 10**9
    assert fixed_bytes(QWEN_3B, "update") == 3 * 220 * 151936 * 4 == 401_111_040
    assert token_budget(QWEN_3B, memory, "update") == (memory - 401_111_040) // 5_548_032 == 12_184
    assert token_budget(QWEN_3B, memory, "update", checkpointing=True) == 146_049


def test_explicit_settings_win_and_auto_fills_in():
    def refuse() -> int:
        raise AssertionError("auto must not be sized when a setting is given")

    assert choose(rows=16, tokens=4096, auto=refuse) == MicroBatching(tokens=4096)  # the budget wins, as before
    assert choose(rows=16, tokens=0, auto=refuse) == MicroBatching(rows=16)
    assert choose(rows=0, tokens=0, auto=lambda: 1234) == MicroBatching(tokens=1234, auto=True)
    assert str(choose(0, 0, lambda: 1234)) == "1234 tokens (auto)" and str(MicroBatching(rows=16)) == "16 rows"
    with pytest.raises(ValueError, match="rows=-1"):
        choose(rows=-1, tokens=0, auto=refuse)


def test_auto_is_the_default_and_can_be_spelt():
    cfg = load_config(None, ["actor.micro_batch_size=auto", "critic.max_tokens_per_micro=auto",
                             "rollout.micro_batch_size=32"])
    assert (cfg.actor.micro_batch_size, cfg.critic.max_tokens_per_micro, cfg.rollout.micro_batch_size) == (0, 0, 32)
    defaults = Config()
    assert (defaults.actor.micro_batch_size, defaults.actor.max_tokens_per_micro, defaults.rollout.micro_batch_size,
            defaults.rollout.max_tokens_per_micro, defaults.reward.model.micro_batch_size) == (0, 0, 0, 0, 0)


def test_budget_ranges_by_hand():
    assert budget_ranges([3, 3, 3, 9, 1], 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert budget_ranges([], 6) == []


def test_memory_at_hand_on_cpu(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    assert mem_available_bytes(meminfo) == 20000000 * 1024
    whole, shared = memory_at_hand(CPU), memory_at_hand(CPU, processes=4)
    assert 0 < shared <= whole <= CPU_CAP_BYTES


def test_sharers():
    ppo = load_config(None, ["reward.model.path=rm", "reward.model.placement=separate"])
    assert sharers(ppo, "cuda", needs_critic=True) == 2  # the actor and the colocated critic share the GPU
    assert sharers(ppo, "cpu", needs_critic=True) == 3  # on one host every group shares the RAM
    assert sharers(load_config(None, ["resources.num_workers=2"]), "cpu", needs_critic=False) == 2


def test_training_state_bytes():
    layer = torch.nn.Linear(3, 2)  # 8 float32 parameters: a gradient and two moments each
    assert training_state_bytes(layer.parameters()) == 3 * 8 * 4


class Prompt:
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


def step_batch(prompts: int, n: int, prompt_tokens: int, response_tokens: int) -> Batch:
    """One step's rows: ``prompts`` prompts x ``n`` samples, every response ``response_tokens`` long."""
    objects = [prompt for prompt in (Prompt(prompt_tokens) for _ in range(prompts)) for _ in range(n)]
    mask = torch.ones(prompts * n, response_tokens)
    return Batch(tensors={"response_mask": mask}, objects={"prompt": objects})


def test_the_auto_budget_gives_one_micro_batch_at_the_bench_shapes():
    """64 prompts x 8 samples x 32 tokens (prompts of 40 tokens) on the demo's model with the CPU cap: the update
    and the log-prob pass each run the step's batch in one micro-batch."""
    batch = step_batch(64, 8, 40, 32)
    for kind in ("update", "score"):
        budget = token_budget(DEMO, CPU_CAP_BYTES, kind)
        assert len(micro_batches(batch, 0, budget, share_prompt=True, all_reduce=None)) == 1


def test_a_big_model_with_long_responses_gets_several_micro_batches():
    """Qwen2.5-VL-3B, 8 prompts of 1,000 tokens x 8 responses of 4,096 tokens on an 80 GB GPU's 68 GB: 12,184
    tokens per update micro-batch, so two responses each; checkpointed 146,049, so four prompts each."""
    batch = step_batch(8, 8, 1000, 4096)
    plain = micro_batches(batch, 0, token_budget(QWEN_3B, 68 * 10**9, "update"), share_prompt=True, all_reduce=None)
    assert len(plain) == 8 * 4  # per prompt: 1000 + 2 x 4096 = 9,192 tokens fit, a third response does not
    checkpointed = token_budget(QWEN_3B, 68 * 10**9, "update", checkpointing=True)
    assert len(micro_batches(batch, 0, checkpointed, share_prompt=True, all_reduce=None)) == 2


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir), load_processor(tiny_model_dir)


def test_model_dims_are_read_from_the_checkpoint(tiny):
    model, _ = tiny
    text = model.config.text_config
    dims = ModelDims.of(model)
    assert (dims.hidden, dims.layers, dims.intermediate, dims.dtype_bytes) == (64, 2, 128, 4)
    assert dims.kv_dim == text.num_key_value_heads * (64 // text.num_attention_heads)
    assert dims.vocab == text.vocab_size and ModelDims.of(PolicyForward(model).core, lm_head=False).vocab == 0


def test_the_hf_engine_follows_its_token_budget(tiny):
    """The whole step in one generate call when memory allows; a small budget groups whole prompts."""
    model, processor = tiny
    params = SamplingParams(n=8, max_new_tokens=32)
    prompts = [Prompt(40)] * 64
    roomy = HFRolloutEngine(model, processor, CPU, memory_bytes=CPU_CAP_BYTES)
    assert roomy.batching(params).auto and roomy.prompt_ranges(prompts, params) == [(0, 64)]
    tight = HFRolloutEngine(model, processor, CPU, max_tokens_per_micro=3 * 8 * (40 + 32))
    assert tight.prompt_ranges(prompts, params)[:2] == [(0, 3), (3, 6)]
    by_rows = HFRolloutEngine(model, processor, CPU, micro_batch_size=16)  # 2 prompts of 8 samples per call
    assert by_rows.prompt_ranges(prompts, params)[:2] == [(0, 2), (2, 4)]


def test_the_updater_sizes_an_auto_budget_and_keeps_a_setting(tiny):
    from mmrl.algos.actor_loss import ActorLoss
    from mmrl.models.encoding import vision_token_ids
    from mmrl.parallel.sharding import shard_parts
    from mmrl.workers.actor import LogProbSpec, PolicyUpdater

    model, processor = tiny
    spec = LogProbSpec(processor.tokenizer.pad_token_id, vision_token_ids(processor), 1.0, 64)

    def updater(cfg: ActorConfig) -> PolicyUpdater:
        layout = shard_parts(PolicyForward(model), cfg.vision, cfg.llm, 1, CPU)
        return PolicyUpdater(layout, cfg, ActorLoss("ppo_clip"), spec, CPU, lambda t: t)

    auto = updater(ActorConfig()).micro
    memory = memory_at_hand(CPU) - training_state_bytes(model.parameters())  # MemAvailable moves a little
    expected = token_budget(ModelDims.of(model), memory, "update")
    assert auto.auto and abs(auto.tokens - expected) <= 0.05 * expected
    assert updater(ActorConfig(micro_batch_size=5)).micro == MicroBatching(rows=5)
    assert updater(ActorConfig(micro_batch_size=5, max_tokens_per_micro=300)).micro == MicroBatching(tokens=300)
