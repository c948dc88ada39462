"""The orchestrator: tasks, schedulers, network state, measurement, the runner and the CLI."""
