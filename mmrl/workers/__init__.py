"""SPMD workers: the hybrid actor/rollout/reference worker (and, later, critic and reward model)."""
