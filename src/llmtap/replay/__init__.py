"""Replay: answering a workload's model calls from a recording.

`matching` keys each recorded call by a canonical projection of its request and finds the
recorded call a new request should get, or a miss naming the closest call and what differs.
Every replay entrance (in-process hooks, `llmtap serve --replay`, the pytest plugin) uses it.
Nothing is imported here, so importing a submodule stays cheap.
"""
