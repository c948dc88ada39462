"""Packaging for netai-testbed: a Mininet testbed for scheduling network and
computing resources for distributed AI (federated learning) tasks."""

import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'^__version__ = "([^"]+)"', (Path(__file__).parent / "orchestrator" / "__init__.py").read_text(),
                    re.M).group(1)

setup(
    name="netai-testbed",
    version=VERSION,
    description=(
        "Emulate a multi-hop optical-like network in Mininet and run real federated-learning "
        "tasks on scheduler-chosen trees with in-path aggregation."
    ),
    python_requires=">=3.10",
    packages=find_packages(include=["topologies*", "controller*", "workers*", "orchestrator*"]),
    package_data={"topologies": ["data/*.yaml"], "workers": ["docker/*"], "orchestrator": ["dashboard/static/*"]},
    install_requires=[
        "networkx>=3.1",
        "topohub>=1.5",
        "PyYAML>=6.0",
        "numpy>=1.24",
        # report.html: the run's report.md converted by Python-Markdown (orchestrator/results/report_html.py)
        "markdown>=3.5",
    ],
    extras_require={
        # The emulation and the controller: os-ken is Ryu's maintained fork (see PLATFORM.md).
        "net": ["os-ken==3.1.1", "WebOb>=1.8", "Routes>=2.5"],
        # The FL workers: the torch pin keeps pip on the CPU wheel.
        "fl": ["torch==2.13.0", "safetensors>=0.4", "scikit-learn>=1.3", "xxhash>=3.4"],
        # highspy: the exact optimum (an ILP solved by HiGHS); paramiko: the Docker SDK's ssh:// transport.
        "experiment": ["matplotlib>=3.7", "rich>=13", "docker>=7.1", "prometheus_client>=0.20", "highspy>=1.7",
                       "paramiko>=3.4"],
        "test": ["pytest>=7", "hypothesis>=6", "ruff>=0.4", "mypy>=1.8", "types-PyYAML", "types-requests",
                 "types-Markdown",
                 # drives Debian's chromium (chromium-driver) in the dashboard's browser tests
                 "selenium>=4.20"],
        # `make docs`: the documentation site (mkdocs.yml), its API reference from the docstrings.
        "docs": ["mkdocs==1.6.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11"],
    },
    entry_points={"console_scripts": ["netai = orchestrator.cli:main"]},
)
