"""Stub: being built (issue 18)."""
