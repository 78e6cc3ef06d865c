"""How a finished call leaves a workload process under `llmtap run`, and reaches the capsule's store.

- `frame`: the spool frame's format, its encoder (run in the workload) and its decoder.
- `writer`: the per-process `SpoolWriter` and `SpoolSink`, the capture session's record sink.
- `collector`: the `llmtap run` parent's `SpoolCollector`, which turns frames into records.

Nothing is imported here: a workload process loads only `frame` and `writer`.
"""
