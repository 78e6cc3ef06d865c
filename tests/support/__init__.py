"""Real parts the tests stand on: loopback servers, the replay and fault upstreams.

`replay` serves the recorded exchanges byte for byte, `faults` fails the ways real upstreams
fail, `servers` hosts them on loopback. The local model server lives in `llmtap.demo.localmodel`,
because the README demo uses it too.
"""
