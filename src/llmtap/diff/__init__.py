"""Diff: what changed between two runs, and a CI gate on it.

`sources` opens each side (a run capsule, a capture directory, or collect/attach output rows),
`calls` reads each call for comparison and details a changed pair, `alignment` pairs calls
inside a rollout by a sequence alignment over per-call signatures, `comparison` classifies each
pair and sums the run, `gate` turns the comparison into
regression reasons, `render` prints it (rich text, JSON, GitHub annotations). `llmtap diff A B`
(`cli/diff.py`) strings them together. Nothing is imported here.
"""
