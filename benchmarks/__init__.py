"""Benchmarks and diagnostics: what mmrl costs (time, memory, bytes) and whether its GPU paths hold; never a
stage of a training run. Each module runs as ``python -m benchmarks.<module>``; the Makefile's targets call
them.

===============  ============================================================================================
module           what it is (make target)
===============  ============================================================================================
``peer``         mmrl against TRL's GRPOTrainer on the same GRPO work (``make bench-peer``; ``bench`` first)
``layouts``      step time, peak memory and data moved per worker layout (``make bench``)
``engines``      rollout throughput of the hf and vLLM engines (``make bench``)
``media``        video data prep throughput, and an RL step on images against video (``make bench``)
``agent_turns``  what an agent episode's next turn costs to encode and generate (``make bench``)
``scale``        peak memory and step time at real widths and vocabulary, against TRL (``make bench-scale``)
``gpu_check``    the GPU checks and short runs of every family on CUDA (``make gpu-check``)
``common``       the bench model and data, a probed worker group, one full RL step, a table
``flags``        a benchmark's own command-line flags beside a stage's ``--config`` and overrides
``probes``       workers with probes (what a rank holds, call counts, scripted deaths), for tests too
===============  ============================================================================================

A benchmark asserts nothing about speed: it prints tables (docs/performance.md says what each measures).
"""
