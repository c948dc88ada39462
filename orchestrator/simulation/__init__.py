"""Flow-level simulation of the tasks' rounds on SimGrid (docs/simulation.md, "Flow-level simulation").

`spec` turns a topology and scheduled tasks into a JSON spec (links, paths, task runs) and runs it
(`simulate`) in a child process (`engine`: SimGrid's engine is one per process). Nothing here
imports SimGrid at module level, so config validation and the CLI load none of it.
"""
