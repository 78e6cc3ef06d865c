"""`python -m llmtap` runs the `llmtap` command (with the same fast path for `llmtap run`)."""

from .cli import console_main

console_main()
