"""Run capsules: a directory per captured run holding its calls, their OpenTelemetry GenAI
projection, the workload's environment, its output and capture health, with a manifest.

Modules: `writer` (layout and safe writes), `manifest` (capsule.json, finding runs), `finalise`
(completing a capsule after its capture ends; its model-calls.jsonl records come from
`llmtap.export.genai`), `envlock`, `health` (per-process counts summed), `ulid` (run ids), `runner`
(`llmtap run`); how calls reach a capsule from the workload is `llmtap.spool`, and
`store_capsule` is the life of a capsule recorded straight through a store (`llmtap serve
--capsule`, which is `llmtap.server.capsule_mode`, and the forensic and exact replays). Nothing is imported here, so
the start-up hooks of `llmtap run` stay cheap.
"""
