"""Prometheus metrics of a run (text format, `prometheus_client`), served at the dashboard's /metrics.

Every scrape reads the run's latest frame (`RunView.frame`), so the figures are those the
dashboard draws:

- ``netai_link_rate_mbps{src,dst}``, ``netai_link_ai_mbps``, ``netai_link_background_mbps``,
  ``netai_link_capacity_mbps``, ``netai_link_up``: each directed link's last load sample (emulated
  Mbit/s);
- ``netai_tasks{state}``: tasks per state;
- ``netai_task_rounds_done{scheduler,task}``, ``netai_task_last_round_latency_seconds``,
  ``netai_task_last_round_accuracy``: the running tasks;
- ``netai_task_flow_bytes_total{install}`` (live runs with a controller): bytes counted by each
  installed task's flow entries, summed over switches (the label is the id its flows carry).

Scrape it from a Prometheus on the same machine (the server listens on 127.0.0.1 only).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry


class RunCollector:
    """A custom collector over one `Dashboard`'s run."""

    def __init__(self, dashboard: Any) -> None:
        self.dashboard = dashboard

    def collect(self) -> Iterator[Any]:
        frame = self.dashboard.with_view(lambda v: v.frame(None))
        link_metrics = {
            "rate_mbps": GaugeMetricFamily("netai_link_rate_mbps", "Rate sent on a directed link (emulated Mbit/s)",
                                           labels=["src", "dst"]),
            "ai_mbps": GaugeMetricFamily("netai_link_ai_mbps", "Rate of task (AI) flows on a directed link",
                                         labels=["src", "dst"]),
            "background_mbps": GaugeMetricFamily("netai_link_background_mbps",
                                                 "Rate of background flows on a directed link", labels=["src", "dst"]),
            "capacity_mbps": GaugeMetricFamily("netai_link_capacity_mbps", "Emulated (shaped) rate of a directed link",
                                               labels=["src", "dst"]),
            "up": GaugeMetricFamily("netai_link_up", "1 if the link is up", labels=["src", "dst"]),
        }
        for ln in frame["links"]:
            for key, fam in link_metrics.items():
                fam.add_metric([ln["a"], ln["b"]], float(ln[key]))
        yield from link_metrics.values()
        states = GaugeMetricFamily("netai_tasks", "Tasks per state", labels=["state"])
        for state, n in sorted(frame["counts"].items()):
            states.add_metric([state], n)
        yield states
        rounds = GaugeMetricFamily("netai_task_rounds_done", "Rounds a running task has completed",
                                   labels=["scheduler", "task"])
        latency = GaugeMetricFamily("netai_task_last_round_latency_seconds", "Latency of a running task's last round",
                                    labels=["scheduler", "task"])
        accuracy = GaugeMetricFamily("netai_task_last_round_accuracy", "Accuracy after a running task's last round",
                                     labels=["scheduler", "task"])
        for t in frame["tasks"]:
            labels = [t["scheduler"], str(t["task_id"])]
            rounds.add_metric(labels, t["rounds_done"])
            last = t.get("last_round") or {}
            if last.get("latency_s") is not None:
                latency.add_metric(labels, last["latency_s"])
            if last.get("accuracy") is not None:
                accuracy.add_metric(labels, last["accuracy"])
        yield from (rounds, latency, accuracy)
        client = self.dashboard.controller
        if client is not None:
            flow_bytes = CounterMetricFamily("netai_task_flow_bytes", "Bytes counted by an installed task's flow "
                                             "entries, summed over switches", labels=["install"])
            totals: dict[int, int] = {}
            try:
                for f in client.flows():
                    if f.get("task") is not None:
                        totals[int(f["task"])] = totals.get(int(f["task"]), 0) + int(f.get("bytes", 0))
            except Exception:  # noqa: BLE001 -- the controller is gone or busy: no flow counters this scrape
                totals = {}
            for install, nbytes in sorted(totals.items()):
                flow_bytes.add_metric([str(install)], nbytes)
            yield flow_bytes


def render(dashboard: Any) -> tuple[bytes, str]:
    """The metrics page of `dashboard`'s run and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(dashboard))
    return generate_latest(registry), CONTENT_TYPE_LATEST
