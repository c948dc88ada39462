"""The task state machine: the only place that says which state may follow which.

::

    pending -> scheduled -> running -> done
       |           |          |  \\-> failed
       |           |          \\-> running   (a move: new paths, new roles, same task; or a note)
       |           \\-> failed   (its paths or roles could not be started)
       \\-> blocked             (no feasible placement)

``done``, ``failed`` and ``blocked`` are final. A move keeps the task ``running``: it is recorded
as a move (the ``moves`` table), not as a state.
"""

from __future__ import annotations

from typing import Final

PENDING: Final = "pending"
SCHEDULED: Final = "scheduled"
RUNNING: Final = "running"
DONE: Final = "done"
FAILED: Final = "failed"
BLOCKED: Final = "blocked"

#: state -> the states that may follow it.
TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    PENDING: frozenset({SCHEDULED, BLOCKED}),
    SCHEDULED: frozenset({RUNNING, FAILED}),
    RUNNING: frozenset({RUNNING, DONE, FAILED}),
    DONE: frozenset(),
    FAILED: frozenset(),
    BLOCKED: frozenset(),
}
FINAL: Final = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


class TransitionError(RuntimeError):
    """A state change the machine does not allow (a bug in a driver or the core, never bad input)."""


def check_transition(current: str | None, new: str) -> None:
    """Raise `TransitionError` unless `new` may follow `current` (None: the task is new).

    Raises
    ------
    TransitionError
        If `new` is not a state, or may not follow `current`.
    """
    if new not in TRANSITIONS:
        raise TransitionError(f"unknown task state {new!r}")
    if current is None:
        if new != PENDING:
            raise TransitionError(f"a new task starts pending, not {new}")
        return
    if new not in TRANSITIONS[current]:
        raise TransitionError(f"a task may not go from {current} to {new}")
