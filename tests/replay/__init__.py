"""Tests of replay request matching."""
