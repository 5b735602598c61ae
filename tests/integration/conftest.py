"""One Ray session for all integration tests (2 cores are all there is), the one-prompt-at-a-time
generation reference that the engines are checked against, and the tiny model whose turns end (agent runs)."""

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import ray
import torch

from mmrl.models.encoding import collate, encode_prompt, vision_token_ids
from mmrl.models.forward import ValueModel
from mmrl.models.loading import load_model, load_processor, save_checkpoint


@pytest.fixture(scope="session", autouse=True)
def ray_session():
    # address="local": a new instance even when Ray's temp folder names another cluster (a stale file, a user's).
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    yield
    ray.shutdown()


def greedy_one_at_a_time(checkpoint, prompts: Sequence[tuple[list[dict], list]], max_new_tokens: int) -> list[str]:
    """Greedy responses to (messages, PIL images) prompts, one at a time, with plain transformers generate
    (no batching, no engine); each response ends at its eos token, which it keeps."""
    model, processor = load_model(checkpoint).eval(), load_processor(checkpoint)
    tok = processor.tokenizer
    texts = []
    for messages, images in prompts:
        prompt = encode_prompt(processor, messages, images)
        with torch.no_grad():
            out = model.generate(**collate([prompt], tok.pad_token_id), do_sample=False, max_new_tokens=max_new_tokens,
                                 suppress_tokens=vision_token_ids(processor), eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        tokens = out[0, len(prompt):].tolist()
        if tok.eos_token_id in tokens:
            tokens = tokens[: tokens.index(tok.eos_token_id) + 1]
        texts.append(tok.decode(tokens, skip_special_tokens=False))
    return texts


def build_random_reward_model(policy_dir: Path, out: Path) -> Path:
    """The policy at ``policy_dir`` as a reward model (its backbone, so its tokenizer) with a random, non-zero head,
    saved at ``out``."""
    model = load_model(policy_dir)
    root = ValueModel.from_policy(model)
    torch.manual_seed(0)
    torch.nn.init.normal_(root.value_head.weight, std=0.5)
    path = save_checkpoint(model, load_processor(policy_dir), out)
    root.save_head(path)
    return path


@pytest.fixture(scope="session")
def random_reward_model() -> Callable[[Path, Path], Path]:
    return build_random_reward_model


@pytest.fixture
def reference_greedy() -> Callable[..., list[str]]:
    return greedy_one_at_a_time


@pytest.fixture(scope="session")
def turn_ending_model_dir(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its end-of-turn token's head row along its typical final state: its turns end
    after a few tokens (a random model's rarely end at all), so that agent episodes go on after tool turns."""
    model, processor = load_model(str(vllm_model_dir)), load_processor(str(vllm_model_dir))
    prompt = encode_prompt(processor, [{"role": "user", "content": "What colour is it?"}], [])
    with torch.no_grad():
        states = model(**collate([prompt], processor.tokenizer.pad_token_id), output_hidden_states=True)
        final = states.hidden_states[-1][0].mean(0)
        model.lm_head.weight[processor.tokenizer.eos_token_id] = 2.0 * final / final.norm()
    out = tmp_path_factory.mktemp("turn_ending")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
