"""`python -m orchestrator.cli`: the same as the `netai` command."""

import sys

try:
    from orchestrator.cli import main
except KeyboardInterrupt:  # Ctrl-C before `main` could take it over: nothing was started
    print("netai: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
