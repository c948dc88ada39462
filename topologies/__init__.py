"""The network model: sites, optical-like links, compute, and how they are emulated.

This package is pure data: nothing here starts a process or touches the kernel.
"""

from topologies.errors import TopologyError
from topologies.model import Link, NetworkModel, Site

__all__ = ["Link", "NetworkModel", "Site", "TopologyError"]
