"""The one-call vision forward, the value model and the rollout engine's weight handoff."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.models.encoding import collate, encode_prompt
from mmrl.models.forward import PolicyForward, ValueModel, core_model
from mmrl.models.loading import load_model, load_processor
from mmrl.models.scoring import Scoring
from mmrl.models.weights import to_hf_names
from mmrl.parallel.sharding import full_state
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_and_processor(tiny_model_dir):
    torch.manual_seed(0)
    return load_model(tiny_model_dir), load_processor(tiny_model_dir)


def inputs_for(processor, with_image: bool) -> dict[str, torch.Tensor]:
    images = [Image.new("RGB", (56, 84), (10, 200, 30))] if with_image else []
    text = "<image>What colour?" if with_image else "Just text."
    prompt = encode_prompt(processor, [{"role": "user", "content": text}], images)
    return collate([prompt, prompt], processor.tokenizer.pad_token_id)


def score_last(policy: PolicyForward, inputs: dict[str, torch.Tensor], count: int, entropy: bool = False):
    """PolicyForward's log-probs (and entropies) of the last ``count`` input tokens, as if they were a response."""
    targets = inputs["input_ids"][:, -count:]
    return policy(inputs, targets, torch.ones(targets.shape, dtype=torch.bool), Scoring(1.0, with_entropy=entropy))


def hf_last(model, inputs: dict[str, torch.Tensor], count: int) -> torch.Tensor:
    """The same from Hugging Face's logits: the states before each of the last ``count`` tokens."""
    logits = model(**inputs, use_cache=False).logits[:, -(count + 1) : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, inputs["input_ids"][:, -count:, None]).squeeze(-1)


def test_policy_forward_equals_the_hugging_face_forward(model_and_processor):
    model, processor = model_and_processor
    for with_image in (True, False):
        inputs = inputs_for(processor, with_image)
        got, entropy = score_last(PolicyForward(model), inputs, 3)
        assert entropy is None
        assert torch.allclose(got, hf_last(model, inputs, 3), atol=1e-5), with_image


def test_dummy_vision_call_changes_nothing_but_reaches_the_tower(model_and_processor):
    """A text-only batch with always_run_vision: same log-probs, and the backward reaches the vision tower."""
    model, processor = model_and_processor
    model = copy.deepcopy(model)
    inputs = inputs_for(processor, with_image=False)
    plain, _ = score_last(PolicyForward(model), inputs, 2)
    calls = []
    hook = core_model(model).visual.register_forward_hook(lambda *_: calls.append(1))
    logp, _ = score_last(PolicyForward(model, always_run_vision=True), inputs, 2)
    hook.remove()
    assert calls == [1]
    assert torch.equal(logp, plain)
    logp.sum().backward()
    grads = [p.grad for p in core_model(model).visual.parameters()]
    assert all(g is not None and float(g.abs().max()) == 0.0 for g in grads)


def image_and_video_inputs(processor) -> dict[str, torch.Tensor]:
    """One prompt holding an image and an 8-frame video, through the processor (the video branch)."""
    content = [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "Same colour?"}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    frames = np.random.default_rng(0).integers(0, 255, size=(8, 56, 56, 3), dtype=np.uint8)
    out = processor(text=[text], images=[Image.new("RGB", (56, 84), (10, 200, 30))], videos=[frames],
                    return_tensors="pt", return_mm_token_type_ids=True)
    return dict(out)


def test_images_and_videos_share_one_vision_call(model_and_processor):
    """Counts tower calls on a prompt with an image and a video: Hugging Face's forward calls the tower
    once per modality, PolicyForward once per forward; both give the same log-probs."""
    model, processor = model_and_processor
    inputs = image_and_video_inputs(processor)
    assert inputs["video_grid_thw"].tolist() == [[4, 4, 4]] and inputs["image_grid_thw"].tolist() == [[1, 6, 4]]
    calls = []
    hook = core_model(model).visual.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        expected = hf_last(model, inputs, 3)
        hf_calls, calls[:] = len(calls), []
        got, _ = score_last(PolicyForward(model), inputs, 3)
    hook.remove()
    assert hf_calls == 2 and calls == [1]
    assert torch.allclose(got, expected, atol=1e-5)


def test_value_model_aligns_values_with_response_tokens(model_and_processor):
    model, processor = model_and_processor
    critic = ValueModel.from_policy(copy.deepcopy(model))
    inputs = inputs_for(processor, with_image=True)
    assert torch.equal(critic(inputs, 3), torch.zeros(2, 3))  # the head starts at zero
    torch.nn.init.normal_(critic.value_head.weight)
    values = critic(inputs, 3)
    hidden = critic.backbone(**{k: v for k, v in inputs.items()}, use_cache=False).last_hidden_state
    expected = critic.value_head(hidden[:, -4:-1]).squeeze(-1)  # states before each of the last 3 tokens
    assert values.shape == (2, 3) and torch.allclose(values, expected, atol=1e-5)


def test_owned_rollout_weights_arrive_then_are_freed(model_and_processor):
    model, processor = model_and_processor
    skeleton = copy.deepcopy(model)
    engine = HFRolloutEngine(skeleton, processor, CPU, owns_weights=True)
    engine.release()
    assert sum(p.numel() for p in skeleton.parameters()) == 0
    prompt = encode_prompt(processor, [{"role": "user", "content": "Just text."}], [])
    params = SamplingParams(n=2, max_new_tokens=5, temperature=1e-3)
    count = engine.update_weights(to_hf_names(full_state(PolicyForward(model))))
    assert count == len(dict(model.named_parameters()))
    torch.manual_seed(0)
    got = engine.generate([prompt], params)
    engine.release()
    assert sum(p.numel() for p in skeleton.parameters()) == 0
    torch.manual_seed(0)
    expected = HFRolloutEngine(model, processor, CPU).generate([prompt], params)
    assert torch.equal(got.responses, expected.responses)


def test_update_weights_names_a_wrong_or_missing_tensor(model_and_processor):
    model, processor = model_and_processor
    engine = HFRolloutEngine(copy.deepcopy(model), processor, CPU, owns_weights=True)
    named = list(to_hf_names(full_state(PolicyForward(model))))
    with pytest.raises(ValueError, match="has no parameter 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))])
    name, tensor = named[0]
    with pytest.raises(ValueError, match=name):
        engine.update_weights([(name, tensor[:1])])
    with pytest.raises(ValueError, match="were not given"):
        engine.update_weights(named[:-1])


def test_shared_media_runs_each_distinct_prompt_once_with_the_same_logits_and_gradients(model_and_processor):
    """The n samples of a prompt share one object; collate(share_media=True) sends its pixels once. On a batch
    mixing two images, an image + a video and text, repeated and interleaved, the log-probs and entropies equal
    the unshared forward's to 1e-5 and the gradients to 1e-6 (abs) / 1e-4 (rel)."""
    from mmrl.schema import Video

    model, processor = model_and_processor
    colours = [(200, 30, 30), (30, 30, 200), (30, 200, 30), (200, 200, 30)]
    two = encode_prompt(processor, [{"role": "user", "content": "<image><image>Same?"}],
                        [Image.new("RGB", (56, 56), colours[0]), Image.new("RGB", (84, 56), colours[1])])
    clip = Video([Image.new("RGB", (56, 56), c) for c in colours], [0.0, 0.5, 1.0, 1.5])
    mixed = encode_prompt(processor, [{"role": "user", "content": "<image><video>First colour?"}],
                          [Image.new("RGB", (56, 84), colours[2])], [clip])
    text = encode_prompt(processor, [{"role": "user", "content": "Name a colour."}], [])
    prompts = [two, text, mixed, two, mixed, text, two]
    words = processor.tokenizer("<answer>red</answer>", add_special_tokens=False)["input_ids"][:4]
    responses = torch.tensor([words] * len(prompts))
    mask = torch.ones(len(prompts), 4)
    pad = processor.tokenizer.pad_token_id
    plain, shared = (collate(prompts, pad, responses, mask, share_media=s) for s in (False, True))
    assert shared["pixel_values"].shape[0] == (two.pixel_values.shape[0] + mixed.pixel_values.shape[0])
    assert plain["pixel_values"].shape[0] == 3 * two.pixel_values.shape[0] + 2 * mixed.pixel_values.shape[0]
    assert shared["image_distinct_index"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert torch.equal(shared["image_grid_thw"], plain["image_grid_thw"])  # the positions' grids stay per sample
    results = []
    for inputs in (plain, shared):
        trained = copy.deepcopy(model)
        logp, entropy = PolicyForward(trained)(inputs, responses, mask > 0, Scoring(0.9, with_entropy=True))
        (logp.sum() + entropy.sum()).backward()
        results.append((torch.stack([logp, entropy]).detach(),
                        {n: p.grad.clone() for n, p in trained.named_parameters() if p.grad is not None}))
    (scores_a, grads_a), (scores_b, grads_b) = results
    torch.testing.assert_close(scores_b, scores_a, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys() and any("visual" in n for n in grads_a)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-6, rtol=1e-4, msg=name)
