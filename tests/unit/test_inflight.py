"""In-flight weight updates in the hf engine (mmrl.rollout.inflight): a generation switched to new weights at token k
draws exactly what a plain reference draws when it switches there; each token's log-prob and version are those of
the weights that drew it; an episode's cache kept with older weights is not continued."""

from __future__ import annotations

import copy

import pytest
import torch
from PIL import Image

from mmrl.models.encoding import collate, encode_prompt, vision_token_ids
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import policy_log_softmax
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.rollout.inflight import InFlightUpdates
from mmrl.rollout.kept import KeptContext
from mmrl.rollout.sampling import SamplingParams

CPU = torch.device("cpu")
TOKENS = 10


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    torch.manual_seed(0)
    old, processor = load_model(tiny_model_dir).eval(), load_processor(tiny_model_dir)
    new = copy.deepcopy(old)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(0.5 * torch.randn_like(param) * (param.std() if param.numel() > 1 else 1.0))
    prompts = [
        encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the shape?"}],
                      [Image.new("RGB", (56, 84), (200, 30, 30))]),
        encode_prompt(processor, [{"role": "user", "content": "Name one."}], []),
    ]
    return old, new, processor, prompts


class Switch:
    """Polled between tokens: loads ``new`` into the engine at the ``at``-th poll (before token ``at``)."""

    def __init__(self, engine: HFRolloutEngine, new: torch.nn.Module, at: int) -> None:
        self.engine, self.new, self.at = engine, new, at
        self.polls, self.held = 0, 0

    def poll(self) -> bool:
        self.polls += 1
        if self.polls != self.at:
            return False
        self.engine.update_weights((k, v.detach().clone()) for k, v in self.new.named_parameters())
        self.held = 1
        return True

    def updates(self) -> InFlightUpdates:
        return InFlightUpdates(self.poll, lambda: self.held, every=1)


def engine_on(old: torch.nn.Module, processor) -> HFRolloutEngine:
    return HFRolloutEngine(copy.deepcopy(old), processor, CPU, owns_weights=True, micro_batch_size=64)


def reference_log_probs(models, processor, prompt, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """tokens (L,) -> (L, V): token j's distribution under models[j], each from a forward of the whole prefix (no
    cache)."""
    tok = processor.tokenizer
    rows = []
    for j, model in enumerate(models):
        inputs = collate([prompt], tok.pad_token_id, tokens[None, :j], torch.ones(1, j))
        logits = model(**inputs).logits[0, -1]
        rows.append(policy_log_softmax(logits, vision_token_ids(processor), temperature))
    return torch.stack(rows)


@pytest.mark.parametrize("at", [1, 4])
def test_a_greedy_generation_switched_at_token_k_draws_what_a_reference_switching_there_draws(setup, at):
    old, new, processor, prompts = setup
    engine = engine_on(old, processor)
    switch = Switch(engine, new, at)
    engine.updates = switch.updates()
    params = SamplingParams(n=2, max_new_tokens=TOKENS, greedy=True)
    out = engine.generate(prompts, params)
    assert switch.held == 1
    models = [old] * at + [new] * (TOKENS - at)
    for row, prompt in enumerate(p for p in prompts for _ in range(2)):
        length = int(out.response_mask[row].sum())
        with torch.no_grad():
            expected = reference_log_probs(models[:length], processor, prompt, out.responses[row, :length], 1.0)
        assert torch.equal(out.responses[row, :length], expected.argmax(-1))
        drawn = expected.gather(-1, out.responses[row, :length, None]).squeeze(-1)
        torch.testing.assert_close(out.log_probs[row, :length], drawn, atol=1e-4, rtol=0)
        assert out.versions[row].tolist() == ([0] * at + [1] * (TOKENS - at))[:TOKENS]


def test_sampled_tokens_carry_the_log_probs_of_the_version_that_drew_them(setup):
    """Sampled at temperature 0.8: tokens before the switch scored by the old weights, after it by the new, within
    1e-4; the same draw without a switch differs after it (the switch changed the distribution)."""
    old, new, processor, prompts = setup
    at = 3
    engine = engine_on(old, processor)
    engine.updates = Switch(engine, new, at).updates()
    params = SamplingParams(n=3, max_new_tokens=TOKENS, temperature=0.8)
    torch.manual_seed(5)
    out = engine.generate(prompts[:1], params)
    models = [old] * at + [new] * (TOKENS - at)
    for row in range(3):
        length = int(out.response_mask[row].sum())
        with torch.no_grad():
            expected = reference_log_probs(models[:length], processor, prompts[0], out.responses[row, :length], 0.8)
        drawn = expected.gather(-1, out.responses[row, :length, None]).squeeze(-1)
        torch.testing.assert_close(out.log_probs[row, :length], drawn, atol=1e-4, rtol=0)
    with torch.no_grad():
        unswitched = reference_log_probs([old] * TOKENS, processor, prompts[0], out.responses[0], 0.8)
    old_logp = unswitched.gather(-1, out.responses[0, :, None]).squeeze(-1)
    assert (old_logp[at:] - out.log_probs[0, at:]).abs().max() > 1e-2


def test_a_turn_kept_with_older_weights_is_prefilled_whole_on_the_new_ones(setup):
    """An episode's next turn after a weight load: a cache kept with the old weights is not continued (its keys here
    are junk that would fail a continuation); the turn equals a greedy generation from the whole context."""
    old, new, processor, prompts = setup
    engine = engine_on(old, processor)
    engine.update_weights((k, v.detach().clone()) for k, v in new.named_parameters())
    stale = KeptContext([torch.zeros(1, 3, 1)], [torch.zeros(1, 3, 1)], weights=engine.loads - 1)
    params = SamplingParams(n=1, max_new_tokens=TOKENS, greedy=True)
    contexts = [prompts[1], prompts[0]]
    turn = engine.continue_generate(contexts, contexts, [stale, stale], params)
    whole = engine.generate(contexts, params)
    assert torch.equal(turn.responses, whole.responses) and turn.texts == whole.texts
