"""Errors raised for bad topology input."""


class TopologyError(ValueError):
    """A topology could not be loaded or failed validation.

    The message is one line that names the offending file, site or link.
    """
