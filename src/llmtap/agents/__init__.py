"""Agents that serve `POST /run` for rollout collection (`llmtap collect`).

`llmtap.agents.simple` is the reference: a multi-turn tool loop through the real `openai` SDK,
its model calls routed under the run's `/ng-rollout/<id>` prefix, its tool calls reported as
agent observations. Copy it to write your own.
"""
