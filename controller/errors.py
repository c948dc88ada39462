"""The requests the controller refuses, each with the HTTP status the REST layer answers with.

The core raises them and `controller.rest` maps them by `status` without knowing the cases; the
OpenFlow side (`controller.southbound.FlowSender`) raises `Unavailable` and `ControllerError` too.
"""

from __future__ import annotations


class ControllerError(Exception):
    """A request the controller refuses; `status` is the HTTP status the REST layer answers with."""

    status = 500


class BadRequest(ControllerError):
    status = 400


class NotFound(ControllerError):
    status = 404


class Conflict(ControllerError):
    status = 409


class Unprocessable(ControllerError):
    status = 422


class Unavailable(ControllerError):
    status = 503


class ShapingFailed(ControllerError):
    """tc refused a task's classes; the task was rolled back."""

    status = 500
