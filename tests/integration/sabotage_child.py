"""Child process for the verdict's sabotage tests: run ``netai experiment`` with the network port
believing the links' rates to be FACTOR times what tc shapes them to.

Usage: python sabotage_child.py FACTOR netai-args... A FACTOR below 1 makes the links faster than
the experiment defines (as a burst passing copies unshaped does): rounds beat their lower bound and
hops their floor. Above 1, slower: every hop is delayed past what the emulated network allows.
"""

from __future__ import annotations

import sys
from typing import Any

import orchestrator.emulation.network_port as network_port
from orchestrator.cli import main


def main_with_factor(factor: float, argv: list[str]) -> int:
    shaped = network_port.emulated_rate

    def believed(plan: Any) -> Any:
        rate = shaped(plan)
        return lambda a, b: rate(a, b) * factor

    network_port.emulated_rate = believed  # type: ignore[assignment]
    return main(argv)


if __name__ == "__main__":
    sys.exit(main_with_factor(float(sys.argv[1]), sys.argv[2:]))
