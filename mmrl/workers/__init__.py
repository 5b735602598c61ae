"""SPMD workers: the hybrid actor/rollout/reference worker, the critic, the model builder and the shared update loop."""
