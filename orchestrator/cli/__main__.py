"""`python -m orchestrator.cli`: the same as the `netai` command."""

import sys

from orchestrator.cli import main

sys.exit(main())
