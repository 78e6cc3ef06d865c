"""Rollout collection: send task rows to an agent's `POST /run`, write one attached row per rollout.

    run.py    the collection: dispatch, retries, resume, attaching each answer (read its docstring)
    tasks.py  the plan: the input's task rows and the rollout attempts they make
    files.py  the output rows and the attempt log
"""

from llmtap.rollouts.collect.files import COLLECT_ERROR_KEY, attempts_path_for
from llmtap.rollouts.collect.run import CollectError, CollectReport, collect_rollouts, collect_rollouts_async

__all__ = [
    "COLLECT_ERROR_KEY",
    "CollectError",
    "CollectReport",
    "attempts_path_for",
    "collect_rollouts",
    "collect_rollouts_async",
]
