"""Turning captured calls into rollout records."""
