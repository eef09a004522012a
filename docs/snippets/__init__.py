"""Runnable examples the documentation pages include (pymdownx.snippets); each has a test that runs it."""
