"""The four model families on tiny random models (built once per session by ``make model``'s stage):
the family comes from the checkpoint; the one encoding path gives rollout (the hf engine) and training the
same ids, positions and log-probs on text, one-image, two-image and video prompts, and both equal a plain
reference (the model's own forward on the processor's own output, one sample at a time, no cache); the
vision pass reaches every weight of the tower; the layouts, freezing and banned tokens use the family's
modules and tokens."""

from __future__ import annotations

import copy
import typing

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import AutoConfig

from mmrl.config import ModelConfig, load_config
from mmrl.models.encoding import PromptParts, collate, encode_prompt, encode_prompts, to_chat_content, vision_token_ids
from mmrl.models.families import FAMILIES, family_named, family_of, family_of_processor
from mmrl.models.forward import PolicyForward, core_model, encode_media
from mmrl.models.loading import load_model, load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.models.packing import pack
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFRolloutEngine
from mmrl.schema import Video
from mmrl.workers.model_builder import build_model

CPU = torch.device("cpu")
NAMES = list(FAMILIES)
@pytest.fixture(scope="module", params=NAMES)
def loaded(request, family_dirs):
    name = request.param
    return name, load_model(family_dirs[name]).eval(), load_processor(family_dirs[name])


def square(rgb, side=56) -> Image.Image:
    return Image.new("RGB", (side, side), rgb)


def prompt_specs(takes_video: bool) -> list[tuple[str, list, list]]:
    red, blue = square((200, 20, 20)), square((20, 20, 200), 84)
    specs = [("Name a colour.", [], []), ("<image>What colour?", [red], []),
             ("<image><image>Which has more shapes?", [red, blue], [])]
    if takes_video:
        frames = [square(c) for c in [(200, 20, 20)] * 2 + [(20, 200, 20)] * 2]
        specs.append(("<video>Which colour appears first?", [], [Video(frames=frames, timestamps=[0, 0.5, 1, 1.5])]))
    return specs


def encoded(processor, takes_video: bool):
    return [encode_prompt(processor, [{"role": "user", "content": text}], images, videos, name=str(i))
            for i, (text, images, videos) in enumerate(prompt_specs(takes_video))]


def test_the_family_is_read_from_the_checkpoint(loaded, family_dirs):
    name, model, processor = loaded
    family = family_named(name)
    assert family_of(AutoConfig.from_pretrained(family_dirs[name])) is family
    assert family_of(core_model(model).config) is family_of_processor(processor) is family
    assert model.config.model_type == family.model_type
    with pytest.raises(ValueError, match="not a supported model family; supported: qwen2_vl"):
        family_of(AutoConfig.for_model("llama"))


def test_model_family_takes_exactly_the_registered_names():
    """The config does not import the families (they bring transformers), so its list is checked against the table."""
    assert typing.get_args(typing.get_type_hints(ModelConfig)["family"]) == tuple(FAMILIES)
    with pytest.raises(ValueError, match="model.family"):
        load_config(None, ["model.family=llava"])


def reference_logprobs(model, processor, specs, prompts, responses, mask) -> torch.Tensor:
    """Each sample alone through the model's own forward on the processor's own output (its own vision call
    and positions), the response appended: log-probs (B, R) at temperature 1 with the vision tokens banned."""
    banned = vision_token_ids(processor)
    out = torch.zeros(responses.shape)
    for row in range(len(responses)):
        text, images, videos = specs[row // 2]
        chat = family_of_processor(processor).chat_text(processor, to_chat_content([{"role": "user", "content": text}]))
        media = {"images": [images]} if images else {}
        if videos:
            from mmrl.models.encoding import frames_array, video_metadata

            media = {"videos": [[frames_array(v) for v in videos]] if family_of_processor(processor).name == "smolvlm"
                     else [frames_array(v) for v in videos], "video_metadata": [video_metadata(v) for v in videos],
                     "do_sample_frames": False}
        native = processor(text=[chat], return_tensors="pt", return_mm_token_type_ids=True, **media)
        length = int(mask[row].sum())
        ids = native["input_ids"][0]
        assert ids.tolist() == prompts[row // 2].input_ids.tolist()  # the one encoding path's ids are the processor's
        tokens = responses[row, :length]
        native["input_ids"] = torch.cat([ids, tokens])[None]
        native["attention_mask"] = torch.ones_like(native["input_ids"])
        native["mm_token_type_ids"] = F.pad(native["mm_token_type_ids"], (0, length))
        native.pop("pixel_attention_mask", None)
        with torch.no_grad():
            logits = model(**native).logits[0, len(ids) - 1 : len(ids) + length - 1].float()
        logits[:, banned] = float("-inf")
        out[row, :length] = logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    return out


def test_rollout_and_training_see_the_same_ids_positions_and_log_probs(loaded):
    name, model, processor = loaded
    family = family_named(name)
    tok = processor.tokenizer
    prompts = encoded(processor, family.takes_video)
    torch.manual_seed(0)
    out = HFRolloutEngine(model, processor, CPU).generate(prompts, SamplingParams(n=2, max_new_tokens=6))
    rows = [p for p in prompts for _ in range(2)]
    mask = out.response_mask
    policy = PolicyForward(model)
    # Positions: the sampler's (prefill + one step per token), the unpacked training row's and the packed row's.
    core = core_model(model)
    prefill = family.positions(core, collate(rows, tok.pad_token_id))
    train_batch = collate(rows, tok.pad_token_id, out.responses, mask)
    trained = family.positions(core, train_batch)
    packed = pack(core, rows, out.responses, mask, tok.pad_token_id)
    packed_pos = packed["position_ids"] if family.position_axes > 1 else packed["position_ids"][None]
    layout = packed["packed_layout"]
    width = prefill.shape[-1]
    for row, prompt in enumerate(rows):
        real = int(mask[row].sum())
        sampled = torch.cat([prefill[:, row, width - len(prompt):],
                             prefill[:, row].amax(-1, keepdim=True) + 1 + torch.arange(real)], dim=1)
        assert torch.equal(trained[:, row, width - len(prompt): width + real], sampled)
        flat = torch.cat([layout.prompt_index[layout.response_group[row], : len(prompt)],
                          layout.response_index[row, :real]])
        assert torch.equal(packed_pos[:, 0, flat], sampled)
    expected = reference_logprobs(model, processor, prompt_specs(family.takes_video), prompts, out.responses, mask)
    torch.testing.assert_close(out.log_probs * mask, expected * mask, atol=1e-4, rtol=0)
    for share in (False, True):
        logp, _ = response_logprobs(policy, rows, out.responses, mask, pad_token_id=tok.pad_token_id,
                                    banned_ids=vision_token_ids(processor), temperature=1.0, device=CPU,
                                    share_prompt=share)
        torch.testing.assert_close(logp.detach(), out.log_probs * mask, atol=1e-4, rtol=0)


def test_agent_episodes_with_a_tool_image_score_as_they_were_sampled(loaded):
    """A family's agent episodes (a zoom call scripted into every turn, the real zoom tool inline, its image
    encoded by the family's chat format) scored by the trainer's batched pass give the engine's log-probs."""
    from mmrl.agent.calls import ToolCall
    from mmrl.agent.chat import ChatFormat
    from mmrl.agent.episode import EpisodeLimits
    from mmrl.agent.executor import ToolExecutor
    from mmrl.agent.loop import AgentLoop, response_batch
    from mmrl.agent.outputs import ToolLimits
    from mmrl.agent.table import build_tool_table

    name, model, processor = loaded
    chat = ChatFormat(processor)
    # Its end-of-turn row along its typical final state, strong enough that turns end after a few tokens whatever
    # the draws (held on seeds 0-3 for every family).
    model = copy.deepcopy(model)
    with torch.no_grad():
        probe = encode_prompt(processor, [{"role": "user", "content": "What colour?"}], [])
        final = model(**collate([probe], processor.tokenizer.pad_token_id), output_hidden_states=True
                      ).hidden_states[-1][0].mean(0)
        head = model.get_output_embeddings().weight
        head[processor.tokenizer.eos_token_id] = 4.0 * final / final.norm()
    with ToolExecutor(isolation="inline") as executor:
        table = build_tool_table(["zoom_in"], executor)
        table.parse = lambda text: [ToolCall("zoom_in", {"bbox_2d": [0, 0, 28, 28]})]
        messages = chat.with_tools([{"role": "user", "content": "<image>What colour is the corner?"}],
                                   table.definitions())
        prompt = encode_prompt(processor, messages, [square((200, 30, 30), 112)], name="p")
        loop = AgentLoop(HFRolloutEngine(model, processor, CPU), chat, table, executor,
                         limits=EpisodeLimits(max_turns=2, max_tokens=4000, max_new_tokens=8),
                         tool_limits=ToolLimits(max_pixels=56 * 56))
        torch.manual_seed(0)
        episodes, _ = loop.run([prompt], SamplingParams(n=4, max_new_tokens=8))
    # Some episodes called the tool, got its image back and took a second turn after it.
    assert any(len(e.calls) == 1 and len(e.images) == 2 and len(e.turns) == 3 for e in episodes), (
        name, [(len(e.calls), len(e.images), len(e.turns)) for e in episodes])
    batch = response_batch(episodes, processor.tokenizer.pad_token_id)
    logp, _ = response_logprobs(PolicyForward(model), [e.scoring_context() for e in episodes], batch["responses"],
                                batch["response_mask"], pad_token_id=processor.tokenizer.pad_token_id,
                                banned_ids=vision_token_ids(processor), temperature=1.0, device=CPU,
                                policy_mask=batch["policy_mask"])
    at = batch["policy_mask"] > 0
    torch.testing.assert_close(logp.detach()[at], batch["rollout_log_probs"][at], atol=1e-4, rtol=0)


def test_prompts_encoded_together_equal_each_encoded_alone(loaded):
    """The processor run once on several prompts (images of other sizes, two images, none; a video where the family
    takes one) gives each prompt exactly the fields of the processor run on it alone."""
    name, _, processor = loaded
    family = family_of_processor(processor)
    parts = [PromptParts([{"role": "user", "content": "<image>What colour?"}], [square((200, 30, 30))], name="a"),
             PromptParts([{"role": "user", "content": "Name one."}], name="b"),
             PromptParts([{"role": "user", "content": "<image><image>Which is larger?"}],
                         [square((30, 30, 200), 112), Image.new("RGB", (84, 56), (30, 200, 30))], name="c")]
    if family.takes_video:
        clip = Video([square(c) for c in ((200, 30, 30), (30, 30, 200))], [0.0, 0.5])
        parts.insert(1, PromptParts([{"role": "user", "content": "<video>First?"}], videos=[clip], name="v"))
    together = encode_prompts(processor, parts)
    for part, prompt in zip(parts, together, strict=True):
        text = family.chat_text(processor, to_chat_content(part.messages))
        alone = family.encode(processor, text, part.images, part.videos)
        for key, value in alone.items():
            if value is None:
                assert getattr(prompt, key) is None, (name, part.name, key)
            else:
                assert torch.equal(getattr(prompt, key), value), (name, part.name, key)
        assert prompt.template_ids == processor.tokenizer(text)["input_ids"] and prompt.name == part.name


def test_the_vision_pass_reaches_every_tower_weight(loaded):
    """With media, and on a text-only micro-batch with the dummy pass (what a sharded tower needs)."""
    name, model, processor = loaded
    family = family_named(name)
    core = core_model(model)
    tower = family.vision(core)
    prompts = encoded(processor, False)
    pad = processor.tokenizer.pad_token_id
    for rows, always in ((prompts[1:], False), (prompts[:1], True)):
        model.zero_grad()
        media, anchor = encode_media(core, collate(rows, pad), always)
        assert (anchor is None) == bool(media)
        responses = torch.full((len(rows), 2), pad)
        logp, _ = response_logprobs(PolicyForward(model, always_run_vision=always), rows, responses,
                                    torch.ones(len(rows), 2), pad_token_id=pad, banned_ids=[], temperature=1.0,
                                    device=CPU)
        logp.sum().backward()
        if anchor is not None:
            assert float(anchor) == 0.0
        missing = [n for n, p in tower.named_parameters() if p.grad is None]
        assert not missing, f"{name}: no gradient reached {missing[:3]}"
    model.zero_grad()


def test_the_layouts_and_freezing_use_the_familys_modules(loaded, family_dirs):
    name, model, processor = loaded
    family = family_named(name)
    core = core_model(model)
    tower_params = {id(p) for p in family.vision(core).parameters()}
    assert len(family.decoder_layers(core)) == 2 and len(family.vision_blocks(core)) >= 1
    assert all(id(p) in tower_params for block in family.vision_blocks(core) for p in block.parameters())
    assert not tower_params & {id(p) for layer in family.decoder_layers(core) for p in layer.parameters()}
    assert family.text_hidden_size(core) == 64
    cfg = load_config(None, [f"model.path={family_dirs[name]}", "actor.vision.freeze=true"])
    actor = build_model(cfg, "actor", str(family_dirs[name]), device=CPU, distributed=False)
    frozen = {id(p) for p in family.vision(actor.root.core).parameters()}
    assert frozen and all(not p.requires_grad for p in family.vision(actor.root.core).parameters())
    assert {id(p) for p in actor.trainable()} == {id(p) for p in actor.root.parameters()} - frozen


def test_the_vision_tokens_are_banned(loaded):
    name, model, processor = loaded
    banned = vision_token_ids(processor)
    assert model.config.image_token_id in banned
    assert processor.tokenizer.eos_token_id not in banned and processor.tokenizer.pad_token_id not in banned
    specials = set(processor.tokenizer.all_special_ids)
    assert set(banned) <= specials


def test_a_smolvlm_prompt_with_an_image_and_a_video_is_refused(family_dirs):
    processor = load_processor(family_dirs["smolvlm"])
    video = Video(frames=[square((0, 0, 0))] * 2, timestamps=[0, 0.5])
    with pytest.raises(ValueError, match="images or one video, not both"):
        encode_prompt(processor, [{"role": "user", "content": "<image><video>Same?"}], [square((0, 0, 0))], [video])


def test_vllm_is_not_given_a_video_its_smolvlm_cannot_take(family_dirs):
    """vLLM's SmolVLM (Idefics3) implementation takes images only: a video prompt is refused by name, before
    any engine runs; an image prompt goes with its source images."""
    processor = load_processor(family_dirs["smolvlm"])
    family = family_of_processor(processor)
    frames = [square((200, 20, 20))] * 2
    video = encode_prompt(processor, [{"role": "user", "content": "<video>Colour?"}], [],
                          [Video(frames=frames, timestamps=[0, 0.5])], name="clip")
    with pytest.raises(ValueError, match="prompt clip: vLLM's smolvlm takes no video input"):
        family.engine_media(video)
    image = encode_prompt(processor, [{"role": "user", "content": "<image>Colour?"}], frames[:1])
    assert family.engine_media(image) == {"image": frames[:1]}
    assert image.template_ids == processor.tokenizer(processor.apply_chat_template(
        to_chat_content([{"role": "user", "content": "<image>Colour?"}]), add_generation_prompt=True,
        tokenize=False))["input_ids"]
    assert image.template_ids.count(processor.image_token_id) == 1 < int((image.input_ids == processor.image_token_id).sum())
