"""The controller's REST app on os-ken's WSGI server, switches faked: ``python -m tests.unit.rest_server``.

Serves `controller.rest.RestApi` over `controller.compat.hub.WSGIServer` (the server the app uses)
on 127.0.0.1, on a free port that it prints as its first line of output, until it is killed. The
core runs the triangle plan with every switch connected to `tests.unit.controller_fakes.FakeSwitches`.
Used by the REST fuzzing tests (tests/unit/test_fuzz_rest.py), which talk to it over real sockets.
"""

from __future__ import annotations

import sys

from controller.compat import hub
from controller.core import ControllerCore
from controller.rest import RestApi
from tests.unit.controller_fakes import FakeSwitches
from topologies.loaders import load
from topologies.plan import EmulationPlan

HOST = "127.0.0.1"


def main() -> int:
    plan = EmulationPlan.from_model(load("triangle"))
    fake = FakeSwitches(plan)
    core = ControllerCore(plan, fake)
    fake.connect_all()
    for sw in plan.switches:
        fake.install(sw.dpid, core.expected_entries(sw.dpid))
        core.switch_connected(sw.dpid)
    server = hub.WSGIServer((HOST, 0), RestApi(core))
    print(server.server.getsockname()[1], flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
