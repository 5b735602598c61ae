"""A byte-level BPE tokenizer trained on a corpus: what a family's tiny model (:meth:`Family.build_tiny`) speaks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def train_tokenizer(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str], *, eos: str, pad: str,
                    chat_template: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE over ``texts`` with ``special_tokens`` (ids 0.. in order), left padding and
    ``chat_template``."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=eos,
        pad_token=pad,
        additional_special_tokens=[t for t in special_tokens if t != pad],
        padding_side="left",
    )
    tokenizer.chat_template = chat_template
    return tokenizer
