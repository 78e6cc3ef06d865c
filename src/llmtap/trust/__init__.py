"""Trust: what makes a capsule worth sharing without trusting the person who shares it.

Secret scanning and redaction with proof, validation, and signed evidence bundles that a third
party checks offline. Nothing is imported here; each module is imported by the command that needs it.
"""
