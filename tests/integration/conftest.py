"""One Ray session for all integration tests (2 cores are all there is), and the one-prompt-at-a-time
generation reference that the engines are checked against."""

from collections.abc import Callable, Sequence

import pytest
import ray
import torch

from mmrl.models.encoding import collate, encode_prompt, vision_token_ids
from mmrl.models.loading import load_model, load_processor


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


@pytest.fixture
def reference_greedy() -> Callable[..., list[str]]:
    return greedy_one_at_a_time
