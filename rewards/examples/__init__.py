"""Example reward plugin files, loaded by path, e.g. ``"rewards/examples/length_penalty.py:score"``."""
