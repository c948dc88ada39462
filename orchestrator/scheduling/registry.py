"""The registered schedulers by name: `SCHEDULERS` (the defaults) and `EXTRA_SCHEDULERS`.

Apart from the package, so that `orchestrator.scheduling.plugins` (which resolves names against
it) and the package (which re-exports it) both import it and neither imports the other.
"""

from __future__ import annotations

from orchestrator.scheduling.base import Scheduler
from orchestrator.scheduling.ilp import Optimum
from orchestrator.scheduling.joint import Joint
from orchestrator.scheduling.mst import MST
from orchestrator.scheduling.spff import SPFF
from orchestrator.scheduling.trees import SPT, Steiner

SCHEDULERS: dict[str, type[Scheduler]] = {"spff": SPFF, "mst": MST, "steiner": Steiner, "spt": SPT, "joint": Joint}
#: Schedulers known by name but left out of the defaults (slow: an ILP per task).
EXTRA_SCHEDULERS: dict[str, type[Scheduler]] = {"optimum": Optimum}
