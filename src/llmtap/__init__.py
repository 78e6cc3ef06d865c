"""llmtap: record every model call an AI agent or RL rollout makes, as evidence you can trust."""

from __future__ import annotations

__version__ = "0.1.0"
