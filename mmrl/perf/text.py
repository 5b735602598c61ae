"""The language model's forward FLOPs from its config: per position, per attended (query, key) pair, per logit row.

Only matrix products count (2 FLOPs a multiply-add), as in torch's ``FlopCounterMode``: norms, activations and
the rotary embedding are a few FLOPs a number and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextCosts:
    """The language model's forward FLOPs: ``dense`` per position (the attention projections and the MLP of all
    layers), ``pair`` per (query, key) pair (the scores and the weighted sum, all layers), ``head`` per position
    whose logits are computed (the LM head)."""

    dense: int
    pair: int
    head: int

    def forward(self, positions: float, pairs: float, logits: float) -> float:
        """FLOPs of a forward over ``positions`` positions, ``pairs`` attended pairs, logits at ``logits``."""
        return self.dense * positions + self.pair * pairs + self.head * logits


def text_costs(config: object) -> TextCosts:
    """:class:`TextCosts` of a model's language part, from its config (a ``*ForConditionalGeneration``'s, whose
    ``text_config`` it reads, or a text model's): grouped-query attention and a gated MLP, as the supported
    families' decoders are."""
    text = getattr(config, "text_config", config)
    hidden, heads = text.hidden_size, text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * text.intermediate_size
    layers = text.num_hidden_layers
    return TextCosts(dense=2 * per_layer * layers, pair=4 * heads * head_dim * layers, head=2 * hidden * text.vocab_size)
