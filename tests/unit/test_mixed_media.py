"""Text-only, image, multi-image and video prompts in one batch: the positions, ids and log-probs used for
rollout equal those used for training (the one encoding path), and the mrope position patch by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.models.encoding import collate, encode_prompt, vision_token_ids
from mmrl.models.forward import PolicyForward, core_model
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.patches.qwen_mrope import ORIGINAL, sequence_positions
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.schema import Video

CPU = torch.device("cpu")


def clip(colours: list[tuple[int, int, int]]) -> Video:
    frames = [Image.new("RGB", (56, 56), c) for c in colours]
    return Video(frames=frames, timestamps=[0.5 * i for i in range(len(frames))])


@pytest.fixture(scope="module")
def model_and_prompts(tiny_model_dir):
    model, processor = load_model(tiny_model_dir), load_processor(tiny_model_dir)
    red, blue = Image.new("RGB", (56, 84), (200, 20, 20)), Image.new("RGB", (56, 56), (20, 20, 200))
    video = clip([(200, 20, 20)] * 2 + [(20, 200, 20)] * 2)
    specs = [
        ("Name a colour.", [], []),
        ("<image>What colour?", [red], []),
        ("<image><image>Which has more shapes?", [red, blue], []),
        ("<video>Which colour appears first?", [], [video]),
        ("<image>then<video>Same colour?", [blue], [clip([(20, 20, 200)] * 4)]),
    ]
    prompts = [encode_prompt(processor, [{"role": "user", "content": text}], images, videos, name=str(i))
               for i, (text, images, videos) in enumerate(specs)]
    return model, processor, prompts


def test_the_prompts_carry_what_each_medium_needs(model_and_prompts):
    _, _, prompts = model_and_prompts
    assert [p.image_grid_thw.shape[0] if p.image_grid_thw is not None else 0 for p in prompts] == [0, 1, 2, 0, 1]
    assert [p.video_grid_thw.tolist() if p.video_grid_thw is not None else None for p in prompts][3:] == [
        [[2, 4, 4]], [[2, 4, 4]]]
    assert prompts[3].second_per_grid_ts.tolist() == [1.0]  # 2 frames per temporal step at 2 fps
    types = prompts[4].mm_token_type_ids.tolist()
    assert types.count(1) == 4 and types.count(2) == 8 and types.index(1) < types.index(2)


def test_rollout_and_training_see_the_same_ids_positions_and_log_probs(model_and_prompts):
    model, processor, prompts = model_and_prompts
    tok = processor.tokenizer
    torch.manual_seed(0)
    out = HFRolloutEngine(model, processor, CPU).generate(prompts, SamplingParams(n=2, max_new_tokens=6))
    samples = [p for p in prompts for _ in range(2)]
    logp, _ = response_logprobs(PolicyForward(model), samples, out.responses, out.response_mask,
                                pad_token_id=tok.pad_token_id, banned_ids=vision_token_ids(processor), temperature=1.0,
                                device=CPU)
    assert float(((logp.detach() - out.log_probs).abs() * out.response_mask).max()) < 1e-4

    # The positions generation starts from equal the prompt part of the training forward's positions.
    core = core_model(model)
    gen_inputs = collate(samples, tok.pad_token_id)
    train_inputs = collate(samples, tok.pad_token_id, out.responses, out.response_mask)
    keys = ("mm_token_type_ids", "image_grid_thw", "video_grid_thw", "second_per_grid_ts", "attention_mask")
    gen_pos, _ = core.get_rope_index(gen_inputs["input_ids"], **{k: gen_inputs.get(k) for k in keys})
    train_pos, _ = core.get_rope_index(train_inputs["input_ids"], **{k: train_inputs.get(k) for k in keys})
    width = gen_inputs["input_ids"].shape[1]
    assert torch.equal(gen_pos, train_pos[:, :, :width])
    assert torch.equal(gen_inputs["input_ids"], train_inputs["input_ids"][:, :width])


def test_mrope_positions_by_hand():
    """text x3, an image (grid 1x4x4, merge 2 -> 2x2), text x2, a video (grid 2x4x4, 1 s per step, 2
    tokens per second -> time step 2), text x1."""
    types = [0, 0, 0] + [1] * 4 + [0, 0] + [2] * 8 + [0]
    grids = {1: iter([[1, 4, 4]]), 2: iter([[2, 4, 4]])}
    got = sequence_positions(types, grids, iter([1.0]), merge=2, tokens_per_second=2.0)
    image = [[3, 3, 3], [3, 3, 4], [3, 4, 3], [3, 4, 4]]
    video = [[t, h, w] for t in (7, 9) for h in (7, 8) for w in (7, 8)]
    expected = [[0] * 3, [1] * 3, [2] * 3, *image, [5] * 3, [6] * 3, *video, [10] * 3]
    assert got.T.tolist() == expected


def test_the_patch_changes_nothing_for_images_and_fixes_the_text_after_a_video(model_and_prompts):
    """transformers 5.19's own method puts the text after a video at max(h, w) / merge past the video's
    start, where Qwen and vLLM continue after the video's last position."""
    model, processor, prompts = model_and_prompts
    core = core_model(model)
    original = ORIGINAL[type(core)]
    keys = ("mm_token_type_ids", "image_grid_thw", "video_grid_thw", "second_per_grid_ts", "attention_mask")
    for index, same in ((2, True), (3, False)):
        inputs = collate([prompts[index]], processor.tokenizer.pad_token_id)
        args = {k: inputs.get(k) for k in keys}
        ours, _ = core.get_rope_index(inputs["input_ids"], **args)
        theirs, _ = original(core, inputs["input_ids"], **args)
        assert torch.equal(ours, theirs) is same
    video_end = inputs["mm_token_type_ids"][0].tolist().index(2) + 8
    assert int(ours[0, 0, video_end]) == int(ours[:, 0, :video_end].max()) + 1
