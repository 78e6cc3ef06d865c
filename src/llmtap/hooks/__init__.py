"""In-process capture: hooks on HTTP libraries that hand every model call to the capture pipeline.

One module per library (`httpx` also covers httpx2, `requests`, `urllib3`, `aiohttp`); the
layering guard and symmetric patching in `base`; post-import hooks in `postimport`; which
libraries are hooked in `install`; the URL registry in `registry`; the active capture in
`session`, each call in flight in `call`, where a finished call goes in `sinks` (the store; the
spool's sink is in `llmtap.spool`), the background record writer in `writer`; and `bootstrap` plus the
injected `site/sitecustomize.py` for the processes `llmtap run` starts. Nothing is imported here:
a process pays only for what its workload uses.
"""
