"""The demo and its parts: the local model server, the reference agent, and the end-to-end run.

- `llmtap.demo.localmodel`: Gemma 3 270M served by llama.cpp on loopback (no key, no network).
- `llmtap.demo.agent`: the reference agent serving `POST /run` for `llmtap collect`, a multi-turn
  tool loop through the real `openai` SDK, its model calls routed under the run's
  `/ng-rollout/<id>` prefix, its tool calls reported as agent observations. Copy it to write your own.
- `llmtap.demo.run`: `llmtap demo`, the main job end to end on this machine.

Nothing is imported here, so naming one part loads only that part.
"""
