"""Memory: the automatic micro-batch token budgets sized from the model and the memory at hand (:mod:`.budget`),
and the peak memory each rank measures per step (:mod:`.peaks`)."""
