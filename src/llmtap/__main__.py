"""`python -m llmtap` runs the `llmtap` command."""

from .cli import main

main()
