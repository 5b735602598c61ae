"""Memory flat in the vocabulary: at V = 151,936, raising the update's micro-batch from 8 to 64 responses of 64
tokens raises the worker's peak memory by far less than one float32 (56, 64, V) tensor (2.03 GiB).

The actor's own update path (:class:`~mmrl.workers.actor.PolicyUpdater` over a one-rank layout) runs on a tiny
Qwen2.5-VL whose vocabulary is padded to the real size; its widths are tiny, so that what could grow with the
micro-batch is the vocabulary's share (the logits), not the decoder's activations. Memory is the worker's own
measurement (:mod:`mmrl.memory.peaks`: on CPU the peak RSS of the process in a window opened after a trim).
The gradient sum and clip after the backward hold no copy of the gradients either.
"""

import sys
from pathlib import Path

import pytest
import torch

from mmrl.algos.actor_loss import ActorLoss
from mmrl.config import ActorConfig, Config, TinyModelConfig
from mmrl.models.encoding import encode_prompt, vision_token_ids
from mmrl.models.families.qwen2_5_vl import QWEN2_5_VL
from mmrl.models.forward import PolicyForward
from mmrl.models.logprobs import policy_log_softmax
from mmrl.parallel.sharding import shard_parts
from mmrl.memory.peaks import GIB, peak_gb, reset_peak
from mmrl.protocol import Batch
from mmrl.workers.actor import LogProbSpec, PolicyUpdater
from pipelines.model import task_corpus

CPU = torch.device("cpu")
VOCAB = 151_936
LENGTH = 64
SAMPLES = 8  # per prompt
BOUND_GIB = (64 - 8) * LENGTH * VOCAB * 4 / GIB  # one float32 (56, 64, V) tensor: 2.03 GiB
FAR_BELOW = BOUND_GIB / 8  # "far less": an eighth of it (0.25 GiB)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux-only")


def window_gib(fn) -> float:
    """GiB the peak RSS rose above the live memory while ``fn()`` ran (the window opens after a trim)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("/proc/self/clear_refs cannot be written here: the peak cannot be reset")
    start = reset_peak(CPU, trim=True)
    fn()
    return peak_gb(CPU) - start


@pytest.fixture(scope="module")
def policy():
    """A tiny Qwen2.5-VL (hidden 32, one layer) with its vocabulary padded to V, and its processor."""
    spec = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                           vision_depth=1, vision_hidden_size=16, vision_heads=2)
    model, processor = QWEN2_5_VL.build_tiny(task_corpus(Config()), spec, seed=0)
    model.resize_token_embeddings(VOCAB, mean_resizing=False)
    assert model.get_output_embeddings().weight.shape[0] == VOCAB
    return model, processor


def batch_of(processor, responses: int, seed: int) -> Batch:
    """``responses`` // 8 text prompts x 8 samples of LENGTH random tokens (none of them a vision token)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [encode_prompt(processor, [{"role": "user", "content": f"What colour is shape {i}?"}], [])
               for i in range(max(1, responses // SAMPLES))]
    ids = torch.randint(max(vision_token_ids(processor)) + 1, VOCAB, (responses, LENGTH), generator=generator)
    mask = torch.ones(responses, LENGTH)
    return Batch(tensors={"responses": ids, "response_mask": mask,
                          "advantages": torch.randn(responses, 1, generator=generator) * mask},
                 objects={"prompt": [prompts[i // SAMPLES] for i in range(responses)]})


def test_a_64_response_micro_batch_costs_far_less_than_its_logits_over_an_8_response_one(policy):
    """One updater whose micro-batch holds a whole batch: the peak of an update of 64 responses less that of
    an update of 8 stays under an eighth of one float32 (56, 64, V) tensor. The window itself sees an eighth of
    that tensor (so the bound is not met by a measurement that sees nothing)."""
    model, processor = policy
    cfg = ActorConfig(lr=1e-3, warmup_steps=0, num_mini_batches=1, ppo_epochs=1, micro_batch_size=64)
    spec = LogProbSpec(processor.tokenizer.pad_token_id, vision_token_ids(processor), 1.0, 64, share_prompt=True)
    layout = shard_parts(PolicyForward(model), cfg.vision, cfg.llm, 1, CPU)
    updater = PolicyUpdater(layout, cfg, ActorLoss("ppo_clip"), spec, CPU, lambda t: t)
    small, large = batch_of(processor, 8, seed=1), batch_of(processor, 64, seed=2)
    updater.update(batch_of(processor, 1, seed=0))  # allocates the gradients and AdamW's state
    assert updater.micro.rows == 64 and not updater.micro.tokens  # one micro-batch per update below

    at_8 = window_gib(lambda: updater.update(small))
    at_64 = window_gib(lambda: updater.update(large))
    growth = at_64 - at_8
    print(f"peak above live: {at_8:.3f} GiB at 8 responses, {at_64:.3f} GiB at 64: +{growth:.3f} GiB "
          f"(bound {BOUND_GIB:.2f} GiB)")
    assert growth < FAR_BELOW, f"+{growth:.3f} GiB from 8 to 64 responses; the bound is {FAR_BELOW:.3f} GiB"

    probe_elements = int(FAR_BELOW * GIB) // 4
    seen = window_gib(lambda: torch.ones(probe_elements))  # written: every page resident
    assert seen > 0.9 * FAR_BELOW


@pytest.mark.extra
def test_the_bound_is_meaningful_the_plain_log_softmax_exceeds_it(policy):
    """The plain path (the head's logits for every token, then log-softmax over the vocabulary, as mmrl scored
    tokens before chunking) grows by more than the bound from 8 to 64 responses, forward alone (about 5 GiB)."""
    model, processor = policy
    head = model.get_output_embeddings()
    banned = vision_token_ids(processor)

    def plain(responses: int) -> None:
        hidden = torch.randn(responses, LENGTH, head.weight.shape[1])
        targets = torch.randint(VOCAB, (responses, LENGTH, 1))
        with torch.no_grad():
            policy_log_softmax(head(hidden), banned, 1.0).gather(-1, targets)

    growth = window_gib(lambda: plain(64)) - window_gib(lambda: plain(8))
    assert growth > BOUND_GIB


def test_the_gradient_sum_and_clip_hold_no_copy_of_the_gradients():
    """sum_replicated_grads and clip_grad_norm on a 128 MiB gradient and small ones: each gradient is summed (two
    ranks holding the same gradient: twice it), the norm is the float64 norm (to 1e-6: the small gradients' norms are
    float32's) and the clip scales by max / norm,
    and the peak rises by less than 0.15 GiB (a flat copy of the gradients and float64 squares of the large one
    would be 0.6 GiB)."""
    from mmrl.parallel.grads import clip_grad_norm, sum_replicated_grads

    generator = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in [(3, 5), (32 * 2**20,), (7,), (1000, 40)]]
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator)
    summed = [2 * p.grad for p in params]
    norm = float(sum((g.double() ** 2).sum() for g in summed)) ** 0.5

    def sum_and_clip() -> float:
        sum_replicated_grads(params, lambda t: t.mul_(2))  # in place, as a sum over two equal ranks
        return clip_grad_norm(params, max_norm=1.0)

    results = []
    growth = window_gib(lambda: results.append(sum_and_clip()))
    assert results[0] == pytest.approx(norm, rel=1e-6)
    for p, expected in zip(params, summed):
        torch.testing.assert_close(p.grad, expected * (1.0 / (norm + 1e-6)), rtol=1e-6, atol=0)
    assert growth < 0.15, f"+{growth:.3f} GiB"
