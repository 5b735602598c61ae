"""Rollout engines: generate n responses per prompt. ``hf`` (default) and, later, ``vllm``."""
