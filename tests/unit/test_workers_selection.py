"""Local-model selection (`workers.selection`): each policy's choice on hand-made statistics,
determinism, option and metadata validation; and the round engines of a whole task wired in
process (real learners on digits, frames encoded, checked and parsed as on the wire, no sockets):
the aggregate is exactly the weighted mean over the selected locals, an unselected local sends no
update bytes, and the default policy sends no metadata at all."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.runtime.summaries import missing_events
from orchestrator.runtime.task_runner import FLOptions, agent_configs, path_costs
from orchestrator.scheduling.schedule import OverlayEdge, Schedule
from workers.aggregate import aggregate_tensors
from workers.config import AgentConfig
from workers.events import EventLog
from workers.framing import FIXED, Buffer, FrameError, Header, chunk_layout
from workers.learning import Learner
from workers.rounds import RoundEngine
from workers.selection import (
    LocalStats,
    SelectionError,
    SelectionPolicy,
    check_meta,
    make_policy,
    parse_stats,
    resolve_policy,
)

STATS = {
    "a": LocalStats(num_examples=100, path_cost=4, round=1, update_norm=0.5, loss_before=2.0, loss_after=1.0),
    "b": LocalStats(num_examples=300, path_cost=1, round=1, update_norm=2.0, loss_before=2.0, loss_after=1.9),
    "c": LocalStats(num_examples=200, path_cost=2, round=1, update_norm=1.0, loss_before=1.5, loss_after=0.2),
    "d": LocalStats(num_examples=50, path_cost=3),  # never trained: no measurements
}


# -- policies ------------------------------------------------------------------------------------------
def test_each_policy_chooses_by_its_rule() -> None:
    assert make_policy(None).select(1, STATS) == ["a", "b", "c", "d"]
    assert make_policy({"policy": "all"}).select(3, STATS) == ["a", "b", "c", "d"]
    assert make_policy({"policy": "data_size", "k": 2}).select(1, STATS) == ["b", "c"]
    # the costliest paths are dropped: a (4) and d (3)
    assert make_policy({"policy": "network_cost", "k": 2}).select(1, STATS) == ["b", "c"]
    assert make_policy({"policy": "network_cost", "fraction": 0.75}).select(1, STATS) == ["b", "c", "d"]
    # unmeasured first (d), then the largest update norm (b)
    assert make_policy({"policy": "contribution", "k": 2}).select(1, STATS) == ["b", "d"]
    # loss reduction: c 1.3, a 1.0, b 0.1
    assert make_policy({"policy": "contribution", "k": 3, "metric": "loss_reduction"}).select(1, STATS) == \
        ["a", "c", "d"]
    chosen = make_policy({"policy": "random", "k": 2, "seed": 1}).select(1, STATS)
    assert len(chosen) == 2 and set(chosen) <= set(STATS)
    assert make_policy({"policy": "random", "k": 9}).select(1, STATS) == ["a", "b", "c", "d"]
    assert make_policy({"policy": "random", "k": 2}).select(1, {}) == []


def test_random_is_determined_by_seed_and_round() -> None:
    sites = {f"L{i}": LocalStats(num_examples=10) for i in range(12)}
    pick = lambda seed, r: make_policy({"policy": "random", "k": 4, "seed": seed}).select(r, sites)  # noqa: E731
    assert pick(1, 3) == pick(1, 3)
    assert len({tuple(pick(1, r)) for r in range(1, 11)}) > 1, "rounds draw different locals"
    assert [pick(1, r) for r in range(1, 6)] != [pick(2, r) for r in range(1, 6)], "seeds differ"
    counts = {s: sum(s in pick(7, r) for r in range(1, 301)) for s in sites}
    assert all(60 < c < 140 for c in counts.values()), counts  # uniform: 100 each on average


@pytest.mark.parametrize(("config", "message"), [
    ({"policy": "nope"}, "unknown selection policy"),
    ({"policy": "random", "n": 3}, "takes no option 'n'"),
    ({"policy": "random", "k": 0}, "k must be an integer >= 1"),
    ({"policy": "random", "k": True}, "k must be an integer >= 1"),
    ({"policy": "random", "fraction": 1.5}, "fraction must be a number > 0"),
    ({"policy": "random", "k": 2, "fraction": 0.5}, "exclude each other"),
    ({"policy": "random", "seed": -1}, "seed must be an integer >= 0"),
    ({"policy": "all", "k": 2}, "takes no option 'k'"),
    ({"policy": "contribution", "metric": "speed"}, "metric must be"),
    ({"policy": "json:dumps"}, "not a subclass"),
    ({"policy": "no_such_module_x:Policy"}, "cannot import"),
    ({"policy": 3}, "non-empty string"),
])
def test_bad_policies_and_options_are_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(SelectionError, match=message):
        make_policy(config)


def test_a_policy_class_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "my_policy.py"
    f.write_text("from workers.selection import SelectionPolicy\n\n"
                 "class Last(SelectionPolicy):\n"
                 "    name = 'last'\n"
                 "    def rank(self, round, stats):\n"
                 "        return sorted(stats, reverse=True)\n")
    cls = resolve_policy(f"{f}:Last")
    assert issubclass(cls, SelectionPolicy)
    assert make_policy({"policy": f"{f}:Last", "k": 1}).select(1, STATS) == ["d"]
    with pytest.raises(SelectionError, match="does not exist"):
        make_policy({"policy": f"{tmp_path / 'missing.py'}:Last"})


def test_the_experiment_config_checks_selection_before_anything_starts() -> None:
    ok = parse_config({"name": "x", "task": {"selection": {"policy": "random", "k": 4, "seed": 1}}})
    assert ok.task.selection == {"policy": "random", "k": 4, "seed": 1}
    assert parse_config(ok.to_dict()).task.selection == ok.task.selection
    assert "selection" not in parse_config({"name": "y"}).to_dict()["task"]
    with pytest.raises(ConfigError, match=r"task\.selection: .*k must be"):
        parse_config({"name": "x", "task": {"selection": {"policy": "random", "k": -1}}})
    with pytest.raises(ConfigError, match=r"task\.selection must be a mapping"):
        parse_config({"name": "x", "task": {"selection": "random"}})


# -- metadata ---------------------------------------------------------------------------------------------
def test_stats_and_select_metadata_are_validated() -> None:
    good = {"L1": {"num_examples": 10, "path_cost": 2.0, "round": 3, "update_norm": 0.5, "loss_before": 1.2,
                   "loss_after": 0.9}}
    assert parse_stats(good)["L1"] == LocalStats(num_examples=10, path_cost=2.0, round=3, update_norm=0.5,
                                                 loss_before=1.2, loss_after=0.9)
    assert parse_stats(json.loads(json.dumps({s: v.to_json() for s, v in STATS.items()}))) == STATS
    for bad in ({"L1": {"num_examples": -1}}, {"L1": {"num_examples": 1.5}}, {"L1": {"update_norm": float("nan")}},
                {"L1": {"update_norm": -1.0}}, {"L1": {"pickle": 1}}, {"L1": 3}, ["L1"],
                {"L1": {"num_examples": True}}, {"": {}}):
        with pytest.raises(SelectionError):
            parse_stats(bad)
    check_meta("GLOBAL", {"select": ["L1", "L2"]})
    for frame, meta in (("GLOBAL", {"select": "L1"}), ("GLOBAL", {"stats": {}}), ("UPDATE", {"select": []}),
                        ("STOP", {"stats": {}}), ("READY", [1])):
        with pytest.raises(SelectionError):
            check_meta(frame, meta)


def test_headers_carry_meta_only_when_given() -> None:
    plain = Header("UPDATE", 1, 2, "L1", num_examples=5)
    assert b"meta" not in plain.to_json()
    assert Header.from_json(plain.to_json()) == plain
    with_meta = Header("GLOBAL", 1, 2, "G", meta={"select": ["L1"]})
    assert Header.from_json(with_meta.to_json()).meta == {"select": ["L1"]}
    assert hash(with_meta) == hash(Header("GLOBAL", 1, 2, "G"))  # headers stay hashable
    with pytest.raises(FrameError, match="meta must be a JSON object"):
        Header.from_json(b'{"type":"GLOBAL","task":1,"round":1,"sender":"G","meta":[1]}')


# -- the orchestrator's part ---------------------------------------------------------------------------
TREE = {"A": "G", "B": "G", "L1": "A", "L2": "A", "L3": "B", "L4": "B"}
LOCALS = ("A", "B", "L1", "L2", "L3", "L4")


def _schedule() -> Schedule:
    return Schedule(task_id=5, scheduler="hand", global_site="G", local_sites=LOCALS, demand_mbps=1.0,
                    broadcast_parent=TREE, upload_parent=TREE,
                    edges=(OverlayEdge("upload", "L1", "A", ("s1", "s2", "s3")), OverlayEdge("upload", "A", "G",
                                                                                              ("s3", "s4"))))


def test_agent_configs_carry_the_policy_to_g_and_path_costs_to_the_locals() -> None:
    sched = _schedule()
    addrs = {n: f"10.0.0.{i + 1}" for i, n in enumerate(sched.overlay_nodes)}
    assert path_costs(sched) == {"A": 1.0, "B": 1.0, "L1": 3.0, "L2": 2.0, "L3": 2.0, "L4": 2.0}

    cfgs = agent_configs(sched, addresses=addrs, options=FLOptions(selection={"policy": "contribution", "k": 2}))
    assert cfgs["G"].selection == {"policy": "contribution", "k": 2}
    assert all(c.selection is None for n, c in cfgs.items() if n != "G")
    assert {c.selection_measures for c in cfgs.values()} == {("update_norm",)}
    assert cfgs["L1"].path_cost == 3.0
    assert AgentConfig.from_dict(json.loads(json.dumps(cfgs["G"].to_dict()))) == cfgs["G"]

    plain = agent_configs(sched, addresses=addrs, options=FLOptions())
    assert all(c.selection is None and c.selection_measures is None for c in plain.values())
    with pytest.raises(ConfigError, match="selection"):
        agent_configs(sched, addresses=addrs, options=FLOptions(selection={"policy": "random", "k": 0}))


def test_a_skipped_local_owes_no_training_events() -> None:
    sched = Schedule(task_id=5, scheduler="hand", global_site="G", local_sites=("L1",), demand_mbps=1.0,
                     broadcast_parent={"L1": "G"}, upload_parent={"L1": "G"})
    g = [{"event": e, "round": 1} for e in ("round_start", "aggregated", "round_complete")]
    l1 = [{"event": e, "round": 1} for e in ("global_received", "skipped", "aggregated", "update_sent")]
    assert missing_events(sched, {"G": g, "L1": l1}, rounds=1) == []
    assert missing_events(sched, {"G": g, "L1": l1[:1] + l1[2:]}, rounds=1) == [
        "L1: no train_start in round 1", "L1: no train_end in round 1"]


# -- the engines of a whole task, in process -----------------------------------------------------------------
class Recording(Learner):
    """A real learner that keeps what each of its trainings produced."""

    def __init__(self, cfg: AgentConfig) -> None:
        super().__init__(cfg)
        self.trained: list[tuple[dict[str, torch.Tensor], int]] = []

    def train(self) -> int:
        n = super().train()
        self.trained.append((self.state(), n))
        return n


class Wire:
    """One overlay edge in process: frames are encoded as on the wire, then checked and parsed by
    the receiving engine (`RoundEngine.receive`), as the transport's reader does."""

    def __init__(self, src: str, kind: str, dst: Callable[[], RoundEngine], sent: list[tuple[str, Header, int]]) -> None:
        self.src, self.kind, self.dst, self.sent = src, kind, dst, sent

    paced_until: float | None = None  # not paced
    started_at: float | None = None  # not said: `forward_first` is logged when written

    def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None,
             last: bool = False, ready_at: float | None = None) -> None:
        data = b"".join(bytes(p) for p in pieces)
        _magic, _version, _f, _r, hlen, plen = FIXED.unpack_from(data, 0)
        header = Header.from_json(data[FIXED.size:FIXED.size + hlen])
        payload = bytearray(data[FIXED.size + hlen:])
        assert len(payload) == plen == header.nbytes
        self.sent.append((self.src, header, len(data)))
        engine = self.dst()
        engine.receive(self.kind, self.src, header, payload)
        if on_sent is not None:
            on_sent()


def run_connected(cfgs: dict[str, AgentConfig], engines: dict[str, RoundEngine]) -> None:
    """Tell every engine its connections are up, run them all on threads to the end, check they
    all ended with status 0."""
    for n, c in cfgs.items():
        e = engines[n]
        for p in c.broadcast_children:
            e.post("connected", p.site, 0.0, 1, "broadcast")
        if c.upload_parent is not None:
            e.post("connected", c.upload_parent.site, 0.0, 1, "upload")
        if c.broadcast_parent is not None:
            e.post("accepted", "broadcast", c.broadcast_parent.site)
        for p in c.upload_children:
            e.post("accepted", "upload", p.site)
    status: dict[str, int] = {}
    threads = [threading.Thread(target=lambda n=n: status.__setitem__(n, engines[n].run()), daemon=True)
               for n in cfgs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert status == dict.fromkeys(cfgs, 0), status


def _run_task(selection: dict[str, Any] | None, rounds: int) -> tuple[dict[str, RoundEngine], dict[str, Recording],
                                                                       list[tuple[str, Header, int]],
                                                                       dict[str, list[dict[str, Any]]]]:
    sched = _schedule()
    addrs = {n: f"127.0.0.{i + 1}" for i, n in enumerate(sched.overlay_nodes)}
    cfgs = agent_configs(sched, addresses=addrs, options=FLOptions(rounds=rounds, local_epochs=1, max_chunk_bytes=4096,
                                                                   selection=selection, child_timeout_s=60))
    engines: dict[str, RoundEngine] = {}
    learners = {n: Recording(c) for n, c in cfgs.items()}
    streams = {n: io.StringIO() for n in cfgs}
    sent: list[tuple[str, Header, int]] = []
    layout = chunk_layout(learners["G"].template, cfgs["G"].max_chunk_bytes)
    for n, c in cfgs.items():
        engines[n] = RoundEngine(
            c, learners[n], layout, EventLog(c, streams[n]),
            broadcast_out={p.site: Wire(n, "broadcast", lambda p=p: engines[p.site], sent)
                           for p in c.broadcast_children},
            upload_out=None if c.upload_parent is None else Wire(
                n, "upload", lambda up=c.upload_parent: engines[up.site], sent))
    run_connected(cfgs, engines)
    events = {n: [json.loads(x) for x in s.getvalue().splitlines()] for n, s in streams.items()}
    return engines, learners, sent, events


def test_the_aggregate_is_the_exact_mean_over_the_selected_locals_and_the_others_send_no_update() -> None:
    engines, learners, sent, events = _run_task({"policy": "random", "k": 3, "seed": 4}, rounds=3)

    chosen = {e["round"]: e["sites"] for e in events["G"] if e["event"] == "selected"}
    assert sorted(chosen) == [1, 2, 3] and all(len(s) == 3 for s in chosen.values())
    assert chosen == {r: make_policy({"policy": "random", "k": 3, "seed": 4}).select(r, dict.fromkeys(
        LOCALS, LocalStats())) for r in (1, 2, 3)}
    for site in LOCALS:
        trained = [e["round"] for e in events[site] if e["event"] == "train_end"]
        skipped = [e["round"] for e in events[site] if e["event"] == "skipped"]
        assert trained == [r for r in (1, 2, 3) if site in chosen[r]]
        assert skipped == [r for r in (1, 2, 3) if site not in chosen[r]]
    # G's model after round 3 is the flat FedAvg of the round-3 updates of the selected locals
    last = [learners[s].trained[-1] for s in chosen[3]]
    want = aggregate_tensors(last)
    got = learners["G"].model.state_dict()
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    done = [e for e in events["G"] if e["event"] == "round_complete"]
    assert done[-1]["num_examples"] == sum(n for _, n in last)
    # an unselected leaf sends UPDATE chunks with no examples and no bytes of tensors
    for r in (1, 2, 3):
        for leaf in ("L1", "L2", "L3", "L4"):
            ups = [h for src, h, _ in sent if src == leaf and h.type == "UPDATE" and h.round == r]
            assert [h.chunk for h in ups] == list(range(len(engines["G"].layout)))
            if leaf in chosen[r]:
                assert all(h.num_examples > 0 and h.nbytes > 0 for h in ups)
            else:
                assert all(h.num_examples == 0 and h.nbytes == 0 for h in ups)
    # the statistics reached G: every local's examples and path cost, the round it last trained in
    # (random measures nothing more)
    stats = engines["G"].local_stats
    assert set(stats) == set(LOCALS) and stats["L1"].path_cost == 3.0
    assert all(stats[s].num_examples == learners[s].num_examples for s in LOCALS)
    for s in LOCALS:
        rounds_trained = [r for r in (1, 2, 3) if s in chosen[r]]
        assert stats[s].round == (rounds_trained[-1] if rounds_trained else 0)
        assert stats[s].update_norm is None and stats[s].loss_before is None
    # fewer bytes go up than without selection
    up_bytes = {e["round"]: 0 for e in events["G"] if e["event"] == "round_start"}
    for site in LOCALS:
        for e in events[site]:
            if e["event"] == "aggregated":
                up_bytes[e["round"]] += e["nbytes"]
    assert up_bytes[1] == sum(size for src, h, size in sent if h.type == "UPDATE" and h.round == 1)


def test_the_default_policy_sends_no_metadata_and_every_local_trains() -> None:
    _engines, learners, sent, events = _run_task(None, rounds=1)

    assert not any(h.meta is not None for _src, h, _size in sent)
    assert all(len(learners[s].trained) == 1 for s in LOCALS)
    assert not any(e["event"] in ("selected", "skipped") for evs in events.values() for e in evs)
    want = aggregate_tensors([learners[s].trained[-1] for s in LOCALS])
    got = learners["G"].model.state_dict()
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)


def test_contribution_measures_travel_up_and_steer_the_choice() -> None:
    engines, _learners, sent, events = _run_task({"policy": "contribution", "k": 2, "metric": "loss_reduction"},
                                                 rounds=4)

    chosen = {e["round"]: e["sites"] for e in events["G"] if e["event"] == "selected"}
    # every local is measured once first (in name order), then the largest loss reductions win
    assert chosen[1] == ["A", "B"] and chosen[2] == ["L1", "L2"] and chosen[3] == ["L3", "L4"]
    stats = engines["G"].local_stats
    assert all(stats[s].loss_before is not None and stats[s].loss_after is not None for s in LOCALS)
    assert all(stats[s].update_norm is None for s in LOCALS)
    assert len(chosen[4]) == 2
    ready = [h for _src, h, _size in sent if h.type == "READY"]
    assert all(h.meta is not None and "stats" in h.meta for h in ready)


# -- results and report ------------------------------------------------------------------------------------
def test_the_report_compares_policies_by_accuracy_latency_and_update_bytes(tmp_path: Path) -> None:
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.report import write_report
    from orchestrator.results.stats import selection_curves
    from orchestrator.results.summary_figures import draw_figures

    db = ResultsDB(tmp_path / "results.db")
    runs = {}
    for policy, chosen, per_round in (("all", [], 6000), ("random", ["L1", "L3"], 2000)):
        run_id = runs[policy] = db.start_run(policy, {}, {"mode": "sequential"})
        for task in (1, 2):
            for r in (1, 2):
                db.record_round(run_id, "mst", task, r, latency_s=0.1 * r + 0.01 * task, broadcast_s=0.0,
                                train_s=0.0, upload_s=0.0, accuracy=0.5 + 0.1 * r + 0.01 * task, lower_bound_s=None)
                db.record_round_selection(run_id, "mst", task, r, policy=policy, selected=chosen,
                                          upload_bytes=per_round)
    assert db.query("SELECT selected_json FROM round_selection WHERE run_id = ? AND round = 1",
                    (runs["random"],))[0]["selected_json"] == '["L1", "L3"]'

    curves = selection_curves(db)
    # round 2: cumulative latency 0.1 + 0.2 + mean(0.01, 0.02) * 2, bytes 2 rounds, accuracy mean
    assert curves["run 2: random, mst"][1] == pytest.approx((0.33, 0.004, 0.715))
    assert curves["run 1: all, mst"][0] == pytest.approx((0.115, 0.006, 0.615))
    report = write_report(db, runs["random"], tmp_path).read_text()
    assert "## Local-model selection" in report
    assert "| 2 | random | mst | 4 | 2.0 | 165.0 | 0.002 | 0.715 |" in report
    assert "| 1 | all | mst | 4 | - | 165.0 | 0.006 | 0.715 |" in report
    figure = {f.name: f for f in draw_figures(db, runs["random"], tmp_path)}["selection_accuracy"]
    assert figure.ok and (tmp_path / "selection_accuracy.svg").read_text().lstrip().startswith("<?xml")
    db.close()


def test_g_refuses_a_policy_that_chooses_outside_its_candidates(tmp_path: Path) -> None:
    f = tmp_path / "rogue.py"
    f.write_text("from workers.selection import SelectionPolicy\n\n"
                 "class Rogue(SelectionPolicy):\n"
                 "    def select(self, round, stats):\n"
                 "        return ['nobody']\n")
    cfg = agent_configs(_schedule(), addresses=dict.fromkeys(_schedule().overlay_nodes, "127.0.0.1"),
                        options=FLOptions(selection={"policy": f"{f}:Rogue"}))["G"]

    class NoModel:
        def __init__(self) -> None:
            self.template: dict[str, torch.Tensor] = {}

    engine = RoundEngine(cfg, NoModel(), (), EventLog(cfg, io.StringIO()),  # type: ignore[arg-type]
                         broadcast_out={}, upload_out=None)
    engine.local_stats = {"L1": LocalStats(num_examples=1)}
    with pytest.raises(SelectionError, match="must choose a non-empty subset of \\['L1'\\]"):
        engine._choose(1)
