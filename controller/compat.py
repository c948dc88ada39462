"""The one import shim between the SDN app and its framework: Ryu if present, else os-ken.

The app is written against the Ryu API; os-ken (Ryu's maintained fork, `os-ken==3.1.1`) renames
the package (`ryu` -> `os_ken`) and the app base class (`RyuApp` -> `OSKenApp`). Everything the
app needs from the framework is re-exported here under Ryu's names, so the app loads under
`ryu-manager` and `osken-manager` alike.

This module must not import anything from the project, and nothing else in the project may
import `ryu` or `os_ken` directly.
"""

from __future__ import annotations

from typing import Any

try:  # pragma: no cover - Ryu does not run on Python >= 3.10, kept for older stacks
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import (
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from ryu.lib import hub
    from ryu.ofproto import ofproto_v1_3

    BaseApp: Any = app_manager.RyuApp
    FRAMEWORK = "ryu"
except ImportError:
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import (
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from os_ken.lib import hub
    from os_ken.ofproto import ofproto_v1_3

    BaseApp = app_manager.OSKenApp
    FRAMEWORK = "os_ken"

__all__ = [
    "CONFIG_DISPATCHER",
    "DEAD_DISPATCHER",
    "FRAMEWORK",
    "MAIN_DISPATCHER",
    "BaseApp",
    "app_manager",
    "hub",
    "ofp_event",
    "ofproto_v1_3",
    "set_ev_cls",
]
