"""What the dashboard shows, read from a run's `results.db` (live while the run writes it, or after).

A *frame* is the state of the run at one time `t` on the run's clock:

- ``links``: every directed link's last load sample at or before `t` (`link_stats`): total rate,
  AI (task entries) and background rates, emulated capacity, up or down;
- ``tasks``: the tasks active at `t` (scheduled or running): their scheduler, locals, trees
  (hops of every broadcast and upload path), aggregation sites, reserved bandwidth, rounds done
  by `t` and the last of them split into broadcast, training and upload, and its accuracy;
- ``ended``: the last tasks that ended by `t` (done, failed or blocked) with their reasons, and
  ``counts`` of tasks per state at `t`.

The database is opened read-only and read through `orchestrator.results.queries` (the queries the
report and the figures use); nothing here writes. Used by `orchestrator.dashboard.server`.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import networkx as nx

from orchestrator.results import durability, queries

#: How many ended tasks a frame lists (the newest).
ENDED_SHOWN = 25


def layout(sites: list[dict[str, Any]], links: list[tuple[str, str]]) -> tuple[dict[str, tuple[float, float]], str]:
    """Positions of the sites in a 1000-wide box: from their lon/lat when every site has one
    (equirectangular, scaled by the cosine of the mean latitude), else a seeded spring layout
    (the same topology is always drawn the same way). Returns the positions and which was used."""
    names = [s["name"] for s in sites]
    geo = all(s.get("lon") is not None and s.get("lat") is not None for s in sites) and len(sites) > 1
    if geo:
        mean_lat = math.radians(sum(float(s["lat"]) for s in sites) / len(sites))
        raw = {s["name"]: (float(s["lon"]) * math.cos(mean_lat), -float(s["lat"])) for s in sites}
        how = "coordinates"
    else:
        g = nx.Graph()
        g.add_nodes_from(names)
        g.add_edges_from(links)
        pos = nx.spring_layout(g, seed=1) if len(names) > 1 else {n: (0.0, 0.0) for n in names}
        raw = {n: (float(p[0]), float(p[1])) for n, p in pos.items()}
        how = "spring layout (the topology has no coordinates)"
    xs, ys = [p[0] for p in raw.values()], [p[1] for p in raw.values()]
    span = max(max(xs) - min(xs), max(ys) - min(ys)) or 1.0
    return {n: (round((x - min(xs)) / span * 1000, 1), round((y - min(ys)) / span * 1000, 1))
            for n, (x, y) in raw.items()}, how


class RunView:
    """Frames of one run of a results database (the last run when `run_id` is None)."""

    def __init__(self, db_path: Path, run_id: int | None = None) -> None:
        self.db_path = Path(db_path)
        self.conn = queries.connect_read_only(self.db_path)
        if run_id is None:
            run_id = queries.last_run_id(self.conn)
            if run_id is None:
                raise ValueError(f"{db_path}: no run recorded")
        self.run_id = run_id
        self._tables = queries.table_names(self.conn)
        if "t_s" not in queries.columns(self.conn, "link_stats"):
            self._tables.discard("link_stats")  # schema 1's table, never written: no link load to show
        self._schedules: dict[tuple[str, int], dict[str, Any]] = {}

    def close(self) -> None:
        self.conn.close()

    def _has(self, *tables: str) -> bool:
        return all(t in self._tables for t in tables)

    # -- the run and its topology -----------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        r = queries.run_record(self.conn, self.run_id)
        if r is None:
            raise ValueError(f"{self.db_path}: no run {self.run_id}")
        env = r["environment"]
        topo = queries.topology(self.conn, self.run_id)
        model: dict[str, Any] = json.loads(topo["model_json"]) if topo else {"name": "?", "sites": [], "links": []}
        plan = json.loads(topo["plan_json"]) if topo else {}
        emulated = {(ln["a"], ln["b"]): ln.get("emulated_mbps") for ln in plan.get("links", [])}
        links = [(ln["a"], ln["b"]) for ln in model["links"]]
        pos, how = layout(model["sites"], links)
        t0, t1 = self.time_range()
        return {
            "run": {"id": self.run_id, "name": r["name"], "status": durability.status_of(r), "note": r.get("note", ""),
                    "mode": env.get("mode", "sequential"), "backend": env.get("backend"),
                    "delay_emulated": env.get("delay_emulated")},
            "topology": {
                "name": model["name"], "layout": how,
                "sites": [{"id": s["name"], "compute": bool(s.get("has_compute", True)),
                           "x": pos[s["name"]][0], "y": pos[s["name"]][1]} for s in model["sites"]],
                "links": [{"a": ln["a"], "b": ln["b"],
                           "capacity_mbps": ln.get("wavelengths", 0) * ln.get("wavelength_mbps", 0),
                           "emulated_mbps": emulated.get((ln["a"], ln["b"]))} for ln in model["links"]],
            },
            "range": [t0, t1],
        }

    def time_range(self) -> tuple[float, float]:
        """The first and last times anything was recorded (0, 0 before anything was)."""
        ts: list[float] = []
        for table in queries.TIMED_TABLES:
            if self._has(table):
                ts += [x for x in queries.time_span(self.conn, table, self.run_id) if x is not None]
        return (min(ts), max(ts)) if ts else (0.0, 0.0)

    def task_ids(self) -> set[int]:
        """Every task id the run records (whatever its scheduler and state)."""
        return queries.task_ids(self.conn, self.run_id)

    # -- frames -----------------------------------------------------------------------------------
    def frame(self, t: float | None = None) -> dict[str, Any]:
        """The run at time `t` (the latest recorded time when None)."""
        if t is None:
            t = self.time_range()[1]
        return {"t": round(t, 3), "links": self._links(t), **self._tasks(t)}

    def _links(self, t: float) -> list[dict[str, Any]]:
        if not self._has("link_stats"):
            return []
        rows = queries.link_loads_at(self.conn, self.run_id, t)
        return [{"a": r["a"], "b": r["b"], "rate_mbps": r["rate_mbps"], "ai_mbps": r["ai_mbps"],
                 "background_mbps": r["background_mbps"], "capacity_mbps": r["capacity_mbps"], "up": bool(r["up"]),
                 "sampled_s": r["t_s"]} for r in rows]

    def _schedule(self, scheduler: str, task_id: int) -> dict[str, Any] | None:
        key = (scheduler, task_id)
        if key not in self._schedules:
            row = queries.schedule(self.conn, self.run_id, scheduler, task_id)
            if row is None:
                return None  # not scheduled yet: asked again next time
            s = json.loads(row["schedule_json"])
            hops: dict[str, list[list[str]]] = {"broadcast": [], "upload": []}
            for p in s.get("paths", []):
                nodes = p.get("nodes", [])
                hops.setdefault(p.get("procedure", "broadcast"), []).extend(
                    [a, b] for a, b in itertools.pairwise(nodes))
            self._schedules[key] = {
                "global": s.get("global"), "locals": s.get("locals", []),
                "aggregation_sites": s.get("aggregation_sites", []),
                "broadcast_tree": s.get("broadcast_tree", []), "upload_tree": s.get("upload_tree", []),
                "hops": {k: sorted({tuple(h) for h in v}) for k, v in hops.items()},
                "reserved_mbps": row["reserved_mbps"]}
        return self._schedules[key]

    def _tasks(self, t: float) -> dict[str, Any]:
        if not self._has("task_events"):
            return {"tasks": [], "ended": [], "counts": {}}
        last = queries.last_task_events(self.conn, self.run_id, t)
        counts: dict[str, int] = {}
        active, ended = [], []
        for r in last:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
            if r["state"] in ("scheduled", "running"):
                active.append(r)
            elif r["state"] in ("done", "failed", "blocked"):
                ended.append(r)
        info = {(r["scheduler"], r["task_id"]): r for r in queries.task_infos(self.conn, self.run_id)}
        tasks = []
        for r in sorted(active, key=lambda x: (x["t_s"], x["scheduler"], x["task_id"])):
            key = (r["scheduler"], r["task_id"])
            task = {"key": f"{r['scheduler']}/{r['task_id']}", "scheduler": r["scheduler"], "task_id": r["task_id"],
                    "state": r["state"], "since_s": r["t_s"]}
            meta = info.get(key)
            if meta is not None:
                task.update(n_locals=meta["n_locals"], rounds=meta["rounds"], global_site=meta["global_site"],
                            demand_mbps=meta["demand_mbps"])
            task["schedule"] = self._schedule(*key)
            task.update(self._progress(r["scheduler"], r["task_id"], t))
            tasks.append(task)
        ended.sort(key=lambda x: x["t_s"], reverse=True)
        return {"tasks": tasks, "counts": counts,
                "ended": [{"key": f"{r['scheduler']}/{r['task_id']}", "scheduler": r["scheduler"],
                           "task_id": r["task_id"], "state": r["state"], "reason": r["reason"], "at_s": r["t_s"]}
                          for r in ended[:ENDED_SHOWN]]}

    def _progress(self, scheduler: str, task_id: int, t: float) -> dict[str, Any]:
        """Rounds of a task done by `t` (G's aggregation times) and the last one's figures."""
        if not self._has("node_rounds"):
            return {"rounds_done": 0, "last_round": None}
        done = queries.global_rounds_done(self.conn, self.run_id, scheduler, task_id, t)
        if not done:
            return {"rounds_done": 0, "last_round": None}
        rnd = done[-1]["round"]
        row = queries.round_figures(self.conn, self.run_id, scheduler, task_id, rnd)
        return {"rounds_done": len(done), "last_round": {"round": rnd, **row} if row else {"round": rnd}}
