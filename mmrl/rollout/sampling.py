"""How an engine samples: the parameters of one generation call. A leaf: the algorithms' collection hooks name it
without importing the engines."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingParams:
    n: int = 1
    """Samples per prompt."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0: no top-k cut."""
    max_new_tokens: int = 16
    greedy: bool = False
    """Take the most likely token (temperature, top_p and top_k then unused)."""
