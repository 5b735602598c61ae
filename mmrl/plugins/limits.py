"""The limits a :class:`~mmrl.plugins.pool.PluginPool` enforces, all from the parent process.

Each pool is given two: ``timeout_s`` per call (a call past it, plus :data:`GRACE_S`, gets its worker
SIGKILLed) and ``max_memory_mb`` of resident memory per worker (past it, the worker is killed). The rest are
fixed here. The parent enforces every one of them, from another process, so they hold even when a plugin never
releases the GIL.
"""

POLL_S = 0.02  # how often the parent checks deadlines and memory while a call runs
START_TIMEOUT_S = 60.0  # for a fresh worker to report ready
LOAD_TIMEOUT_S = 60.0  # at least, for a worker to load a spec (a plugin's imports are not the plugin's call)
MAX_START_FAILURES = 3  # workers in a row that die or hang before ready: the environment is broken
GRACE_S = 0.25  # past timeout_s before a call is killed: an async function's own timeout reports first
