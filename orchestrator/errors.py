"""Errors the orchestrator raises for bad user input (the CLI turns them into exit status 2)."""


class ConfigError(ValueError):
    """Bad user input: a task, a scheduler name, an experiment config. One-line message."""
