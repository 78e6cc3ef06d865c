"""Tests of `llmtap diff`: alignment, comparison, the gate, the CLI."""
