"""A demonstrated episode (a data row whose messages go on after the question: the assistant's calls, the tools'
turns, the answer) encoded as the agent loop encodes the episodes it runs, for supervised training.

The row's messages up to its first assistant message are the prompt, encoded with the tools in the system
message (:meth:`mmrl.agent.rollout.AgentRollout.messages`' form). After it, each assistant message is a policy
turn (its text's tokens and the end-of-turn token, the tokens the policy is trained to produce) and each run of
``tool`` messages is one tool turn, encoded by :meth:`mmrl.agent.chat.ChatFormat.encode_turn` from the tool
outputs it states (a message's ``<image>`` placeholders take the row's next images): a hole, context only. So
SFT and RL see a tool turn as the same tokens, positions and pixels.

An assistant message can be context too (OpenAI's fine-tuning ``weight: 0``): the row's ``extra`` lists such
messages' indices in ``context_messages``; they are encoded as policy turns but not trained on (the zoom task's
demonstrations that teach reading the zoomed image without teaching where to zoom).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
from PIL import Image

from mmrl.agent.chat import ChatFormat
from mmrl.agent.episode import Episode
from mmrl.agent.outputs import ToolOutput
from mmrl.models.encoding import EncodedPrompt, encode_prompt
from mmrl.schema import IMAGE_PLACEHOLDER, count_placeholders


def is_demonstration(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether a row's messages hold a demonstrated episode (an assistant message)."""
    return any(m["role"] == "assistant" for m in messages)


def encode_demonstration(chat: ChatFormat, tools: Sequence[dict[str, Any]], messages: Sequence[dict[str, Any]],
                         images: Sequence[Image.Image], name: str = "", context: Collection[int] = ()) -> Episode:
    """The demonstrated episode of one row: ``messages`` (the question, then assistant and ``tool`` messages),
    ``images`` (the question's, then each tool message's in order), ``tools`` the run's tool definitions,
    ``context`` the indices of the assistant messages that are context only (not trained on).

    Returns the Episode (its ``scoring_context()`` and ``response()`` are what the trainer scores). Raises
    ValueError naming the row when it does not end with an assistant message, when its placeholders and
    images disagree, or when ``context`` names a message that is not one of its assistant turns.
    """
    split = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"demonstration {name}: its last message is a {messages[-1]['role']!r} one; a demonstrated "
                         "episode ends with the assistant's answer")
    assistant = {i for i, m in enumerate(messages) if m["role"] == "assistant"}
    if not set(context) <= assistant:
        raise ValueError(f"demonstration {name}: context_messages {sorted(context)} must index its assistant messages "
                         f"{sorted(assistant)}")
    question = list(messages[:split])
    count = count_placeholders(question, IMAGE_PLACEHOLDER)
    needed = count + count_placeholders(messages[split:], IMAGE_PLACEHOLDER)
    if needed != len(images):
        raise ValueError(f"demonstration {name}: {needed} {IMAGE_PLACEHOLDER} placeholders but {len(images)} images; "
                         "give one image per placeholder, the question's first, then each tool message's")
    prompt = encode_prompt(chat.processor, chat.with_tools(chat.in_format(question), tools), images[:count], name=name)
    episode = Episode(prompt, list(images[:count]), chat.model_image_sizes(prompt))
    tokenizer = chat.processor.tokenizer
    rest, pending = iter(images[count:]), []
    for index, message in [*enumerate(messages[split:], split), (len(messages), None)]:
        if message is not None and message["role"] == "tool":
            content = message["content"]
            shown = [next(rest) for _ in range(content.count(IMAGE_PLACEHOLDER))]
            pending.append(ToolOutput(text=content.replace(IMAGE_PLACEHOLDER, ""), images=tuple(shown)))
            continue
        if pending:
            turn = chat.encode_turn(pending, name=name)
            episode.add_tool_turn(turn, [], chat.model_image_sizes(turn))
            pending = []
        if message is None:
            break
        if message["role"] != "assistant":
            raise ValueError(f"demonstration {name}: a {message['role']!r} message after the question; only "
                             "assistant and tool messages may follow it")
        ids = tokenizer(message["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor(ids, dtype=torch.long)
        episode.add_policy_turn(ids, torch.zeros(len(ids)), message["content"], [], trained=index not in context)
    episode.finish()
    return episode


def demonstration_batch(episodes: Sequence[Episode], pad_id: int) -> tuple[list[EncodedPrompt], dict[str, torch.Tensor]]:
    """Scoring contexts and the padded (B, R) responses, response_mask and policy_mask of demonstrated episodes
    (the loss is over the policy's tokens)."""
    from mmrl.agent.loop import response_batch

    batch = response_batch(episodes, pad_id)
    return [e.scoring_context() for e in episodes], {k: batch[k] for k in ("responses", "response_mask", "policy_mask")}
