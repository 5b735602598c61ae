"""mmrl: reinforcement-learning post-training of vision-language models."""

__version__ = "0.1.0"
