"""The agent loop's parts: the policy calls tools (crop, zoom, a calculator, a user's own) between its turns.

=================  ============================================================================================
module             concept
=================  ============================================================================================
``schemas``        a tool's JSON schema: the :func:`tool` decorator that declares it, and its checks
``builtin``        the built-in tools: ``crop`` and ``zoom_in`` (a box on an image of the episode, in the
                   coordinates the model saw) and ``calculator``
``registry``       a tool spec (a built-in name, an installed plugin, ``path/to/file.py:function``) -> the function
``images``         a tool's image made into what the model sees: first frame, upright, RGB, a shape processors take
``outputs``        what a call gives back (:class:`~mmrl.agent.outputs.ToolOutput`), its limits and checks
``worker``         what a tool worker process does with a call (the runner of :mod:`mmrl.plugins.pool`)
``executor``       running a turn's calls, isolated in worker processes, a hung tool costing one timeout a step
``calls``          a policy turn's calls, read in the family's format (:mod:`mmrl.models.tool_calls`), checked
``table``          the tools of a run by name: their specs, schemas and argument validators
``stats``          counts of calls by tool and of errors and repairs by kind, as metrics
``chat``           the tools in the system prompt and a tool turn in the family's chat format, encoded
``episode``        one episode: its turns (the policy's, the tools' as holes), its context, limits and cuts
``context``        an episode's context, its media read through from the prompt's encoding and the tool turns'
``loop``           the agent loop: every unfinished episode's turn generated at once, then all their calls
``regions``        whether a call looked at the right place (a row's ground-truth box)
=================  ============================================================================================

This package's ``__init__`` stays light: tool worker processes import :mod:`mmrl.agent.worker` through it.
"""

from __future__ import annotations

from mmrl.agent.schemas import tool

__all__ = ["tool"]
