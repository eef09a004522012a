"""Runnable examples the documentation pages include (pymdownx.snippets).

Each has a test that runs it.
"""
