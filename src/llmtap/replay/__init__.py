"""Replay: answering a workload's model calls from a recording.

`matching` keys each recorded call by a canonical projection of its request and finds the
recorded call a new request should get, or a miss naming the closest call and what differs.
Every replay entrance uses it: the in-process hooks (`live`, answers built by `answers` and
`responses`, the network `guard`; `mocked` runs a workload so, `intervention` replaces one
answer), `llmtap serve --replay` (`serve`), the pytest plugin (`pytest_plugin`), and the modes
that run no workload (`modes` for forensic, `exact`). `report` writes what a replay did.
Nothing is imported here, so importing a submodule stays cheap.
"""
