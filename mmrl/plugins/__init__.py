"""User code run in isolated worker processes: reward functions and agent tools alike.

=============  ==============================================================================================
module         concept
=============  ==============================================================================================
``spec``       a plugin spec's ``path/to/file.py:function`` form: checking it, making it absolute, loading it;
               the installed plugins of an entry-point group
``outcome``    what one call produced (:class:`~mmrl.plugins.outcome.Outcome`): a value or a failure by kind
``limits``     the limits a pool enforces from the parent process: call and load timeouts, memory, starts
``pool``       :class:`~mmrl.plugins.pool.PluginPool`: worker processes that run specs' functions on samples,
               a call that hangs, crashes or eats memory costing only its samples
``process``    one worker process seen from the parent: started, ready, its memory, its exit, killed
``worker``     the loop inside a worker process: load a spec with the pool's runner, call it, report
``safe_text``  text a plugin (or a judge) returned made safe to tokenise and print: valid Unicode, no control
               characters or terminal escapes, no special-token strings
=============  ==============================================================================================

A pool is given a *runner*, a module that says what its kind of plugin is and how it is called
(:mod:`mmrl.plugins.pool` lists what a runner defines): :mod:`rewards.runner` for reward functions,
:mod:`mmrl.agent.worker` for agent tools. The names a spec may also be (registered rewards, built-in tools)
are each kind's own table: :mod:`rewards.registry`, :mod:`mmrl.agent.registry`.

This package imports neither torch nor the rest of the library: worker processes import it first.
"""
