"""Capture at a model server: the ASGI middleware and the `llmtap serve` proxy."""
