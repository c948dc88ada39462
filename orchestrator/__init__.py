"""The orchestrator: tasks, schedulers, network state, measurement, the runner and the CLI."""

#: The project's version (setup.py reads it from here): a simulation calibration is valid for one.
__version__ = "0.1.0"
