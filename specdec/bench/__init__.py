"""Benchmark inputs: the built-in prompt set and prompt-file loaders."""
