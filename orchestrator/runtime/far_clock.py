"""Site servers on another machine: their clock mapped onto the run's, their events brought back.

A far server's events are on its machine's monotonic clock (`workers.events.now`), which has
nothing to do with this machine's. `measure_offset` asks the server's ``hello`` a few times over
its control channel and keeps the sample with the shortest round trip: offset = the server's clock
less the midpoint of that round trip here, uncertainty = half the round trip.

`EventMirror` copies each far role's events file, whole lines at a time, over the same channel
(the ``read`` op) to the same path under this machine's log root, with each line's ``t`` less the
server's offset: every reader here (`EventTail`, the summaries, the recorder) then sees times on
this machine's clock and needs no change. The offset is measured when the server connects and
re-checked every `RECHECK_S` while roles run there; a new measurement that differs from the one in
use by more than both uncertainties together is logged and used for the lines read from then on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger("netai.compute")

#: How often a far server's clock offset is measured again while roles run there.
RECHECK_S = 30.0
#: Samples per measurement (the one with the shortest round trip is kept).
SAMPLES = 5


def measure_offset(hello: Callable[[], Mapping[str, Any]], samples: int = SAMPLES) -> tuple[float, float]:
    """(offset, uncertainty) in seconds of the clock ``hello()`` replies with (its ``clock``) against
    this machine's monotonic clock (see the module docstring).

    Raises
    ------
    ValueError
        A reply without a numeric ``clock`` (a server of an older protocol).
    """
    best: tuple[float, float] | None = None
    for _ in range(max(1, samples)):
        t0 = time.monotonic()
        reply = hello()
        t1 = time.monotonic()
        clock = reply.get("clock")
        if not isinstance(clock, (int, float)) or isinstance(clock, bool):
            raise ValueError(f"the server's hello has no clock: {sorted(reply)}")
        if best is None or t1 - t0 < best[1]:
            best = (float(clock) - (t0 + t1) / 2, t1 - t0)
    assert best is not None
    return best[0], best[1] / 2


def mapped_line(line: str, offset: float) -> str:
    """One events line with its ``t`` moved onto this machine's clock (less `offset`); a line that is
    not a JSON object with a numeric ``t`` is kept as it is (the readers skip what they cannot parse)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return line
    if isinstance(rec, dict) and isinstance(rec.get("t"), (int, float)):
        rec["t"] = rec["t"] - offset
        return json.dumps(rec, separators=(",", ":"))
    return line


@dataclass
class _File:
    site: str
    rel: str
    local: Path
    read: int = 0


class EventMirror:
    """The events of roles on far servers, copied here with their times mapped (module docstring).

    `read(site, rel, offset)` sends a ``read`` request to the site's server; `hello(site)` a
    ``hello``. Both raise what the manager's requests raise (a lost server)."""

    def __init__(self, read: Callable[[str, str, int], Mapping[str, Any]],
                 hello: Callable[[str], Mapping[str, Any]]) -> None:
        self.read, self.hello = read, hello
        #: Site -> (offset, uncertainty) in use, and when it was measured (monotonic).
        self.offsets: dict[str, tuple[float, float]] = {}
        self.measured: dict[str, float] = {}
        self.files: dict[Path, _File] = {}

    def measure(self, site: str) -> tuple[float, float]:
        """Measure `site`'s offset (at connect, and again by `sync`); the one in use afterwards."""
        new = measure_offset(lambda: self.hello(site))
        old = self.offsets.get(site)
        self.measured[site] = time.monotonic()
        if old is None or abs(new[0] - old[0]) > new[1] + old[1]:
            if old is not None:
                LOG.warning("the clock of %r's server moved: offset %+.4f s -> %+.4f s (+/- %.4f)", site, old[0],
                            new[0], new[1])
            self.offsets[site] = new
        return self.offsets[site]

    def add(self, site: str, rel: str, local: Path) -> None:
        """Mirror the role events file `rel` (relative to the server's log root) of `site` at `local`."""
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text("")
        self.files[local] = _File(site, rel, local)

    def sync(self, sites: Iterable[str]) -> None:
        """Copy what the files of `sites` gained since the last call (every line written so far)."""
        wanted = set(sites)
        for site in wanted & set(self.offsets):
            if time.monotonic() - self.measured.get(site, 0.0) > RECHECK_S:
                self.measure(site)
        for f in self.files.values():
            if f.site not in wanted:
                continue
            while True:
                reply = self.read(f.site, f.rel, f.read)
                size = int(reply.get("size", 0))
                if size <= 0:
                    break
                offset = self.offsets.get(f.site, (0.0, 0.0))[0]
                lines = [mapped_line(x, offset) for x in str(reply.get("data", "")).splitlines()]
                with open(f.local, "a", encoding="utf-8") as out:
                    out.write("".join(x + "\n" for x in lines))
                f.read += size
