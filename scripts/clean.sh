#!/usr/bin/env bash
# Remove what crashed netai runs left (their processes, OVS bridges and veths), and nothing else.
# `make clean` runs `netai clean` when the venv exists, else this (the cleaner needs only the
# standard library). Run as root; serialise with other Mininet users:
#   flock /tmp/netai-mininet.lock bash scripts/clean.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m orchestrator.emulation.cleanup
