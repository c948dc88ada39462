"""The network model: sites, optical-like links, compute, and how they are emulated.

This package is pure data: nothing here starts a process or touches the kernel.
"""

from typing import Any

from topologies.errors import TopologyError

__all__ = ["Link", "NetworkModel", "Site", "TopologyError"]


def __getattr__(name: str) -> Any:
    """The model's classes, imported as first asked for: the controller reads plans
    (`topologies.plan`) without the model, nor networkx, which the model imports."""
    if name in ("Link", "NetworkModel", "Site"):
        from topologies import model

        return getattr(model, name)
    raise AttributeError(f"module 'topologies' has no attribute {name!r}")
