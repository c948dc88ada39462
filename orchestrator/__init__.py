"""The orchestrator: tasks, schedulers, network state, measurement, the runner and the CLI."""

import logging as _logging

#: The project's version (setup.py reads it from here): a simulation calibration is valid for one.
__version__ = "0.1.0"


def _plain_loggers() -> None:
    """Import Mininet's log module now, then give `logging` its own logger class back.

    On import, ``mininet.log`` makes every logger created afterwards a ``MininetLogger``: level
    OUTPUT (above INFO) and a console handler of its own. The project's modules create their
    loggers when first imported, many after Mininet (lazy imports), and their INFO lines were then
    dropped from the run's log. Imported here first, Mininet's module is not run again; its own
    ``mininet`` logger keeps its class."""
    try:
        import mininet.log  # noqa: F401 -- for its side effect, undone below
    except ImportError:  # no Mininet (a simulation-only install): nothing to undo
        return
    _logging.setLoggerClass(_logging.Logger)


_plain_loggers()
