"""What the simulation is given and how it is run: `SimParams`, `TaskRun`, `build_spec`, `simulate`.

The model's parameters (`SimParams`; the experiment config's `simulation` section):

- link rates: each directed link's capacity (``rates: capacity``) or the rate the emulation shapes
  it to (``rates: emulated``: capacity x the plan's `bw_scale`, for comparison with emulated runs),
  times `tcp_efficiency` (the share of the line rate TCP payload gets: headers, ACKs, slow start);
- propagation: each path's fiber delay (`NetworkModel.path_delay_ms`) plus `per_hop_latency_ms`
  per link crossed (switching and queueing), unless ``propagation: false`` (as an emulation without
  netem);
- ACKs (``ack_share`` > 0; off by default, `netai calibrate` sets `ACK_SHARE`): each segment also
  sends that share of its bytes along its path reversed, so that transfers going opposite ways over
  the same links share them with each other's ACKs;
- per-chunk work: `alpha_s` per chunk at each sender (framing, digest, hand-off), default the
  emulation's own `orchestrator.runtime.timing.ALPHA_S`, done chunk after chunk alongside the
  transmission of the chunks before (`orchestrator.simulation.engine`, "Transfers");
- frames: a copy is the emulation's chunk frames, headers included (`build_spec`'s `frames`); with
  ``segment_mss`` (a twin of paced copies) each frame crosses as TCP segments of its own, each
  with its headers, so that a frame's short last segment costs what it costs on the wire;
- segments: ``max_segments`` (0: none) bounds the number of pieces a transfer is simulated in: a
  transfer of k chunks is cut into ceil(k / q) segments of q = ceil(k / max_segments) chunks, each
  carrying its chunks' bytes and q x `alpha_s` of work (see `orchestrator.simulation.engine`);
- CPU (``cpu_cores`` > 0; off by default): the emulation runs every site's processes and the
  software switch on the same few cores, so its transfers also wait for CPU. Each transmission of
  a segment of b bytes and q chunks over h links needs b x `cpu_s_per_byte` + q x `cpu_s_per_chunk`
  seconds of the workers' CPU (in the sender's and the receiver's processes, one core each; the
  transmissions in flight sharing the processes and `cpu_cores` cores max-min) and
  b x h x `cpu_s_per_byte_hop` seconds of the switch's (on the machine's cores, shared max-min), alongside the
  transmission; a segment has left once its bytes and both works are done;
- training: ``seconds_per_round + seconds_per_example * local_epochs * examples`` at each local,
  its examples being its near-equal share of `train_examples` (the iid split), over the site's speed; with the CPU
  model, that many CPU seconds of one host core are also worked off on the site's process and the
  machine's cores, shared with the other trainings and transfers, and training ends at the later of
  the two (the emulation trains for real and holds its update until the modelled end, or overruns).

Lanes: a node's copies to broadcast children whose paths share a link go one after another, each
whole before the next, as the emulation's agents send them (`lanes_of`).

Chunk size: the emulation's choice, `orchestrator.runtime.timing.optimal_chunk_bytes` of the
task's deepest chain and bottleneck rate (the same as `task_timing`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.runtime.timing import ALPHA_S, optimal_chunk_bytes
from orchestrator.scheduling.cost import ACK_WIRE_PER_PAYLOAD, TCP_MSS, TCP_PAYLOAD_SHARE, RateFn
from orchestrator.scheduling.schedule import Schedule
from orchestrator.simulation.background import SimBackground
from topologies.model import NetworkModel

RATES = ("capacity", "emulated")
#: Default seconds of local training per example and epoch (an MLP of two hidden layers of 800 on
#: one core, batch 32: a placeholder until a profile of the model is measured).
DEFAULT_SECONDS_PER_EXAMPLE = 2e-4
#: Wire bytes per payload byte, derived: a 1514-byte Ethernet frame carries 1448 bytes of TCP payload
#: (MTU 1500, TCP timestamps: `TCP_PAYLOAD_SHARE`), and the ACKs coming back.
#: `netai calibrate` measures it (the emulated carried bytes over the simulated payload bytes).
WIRE_BYTES_FACTOR = round(1 / TCP_PAYLOAD_SHARE + ACK_WIRE_PER_PAYLOAD, 4)
#: ACK bytes on a transfer's reverse links per byte of payload, in the links' payload units (their
#: rate is the payload's, x `tcp_efficiency`): the ACKs' wire bytes at the payload share of MTU 1500.
ACK_SHARE = round(ACK_WIRE_PER_PAYLOAD * TCP_PAYLOAD_SHARE, 4)
#: The model's revision, stored with each calibration (`calibration.Calibration.model`): parameters
#: fitted under one revision are not used under another. 1: each chunk's per-chunk work added to its
#: transmission; 2 (2026-11-27): that work overlaps the transmission of the chunks before
#: (`orchestrator.simulation.engine`, "Transfers"), so the per-hop latency fitted under 1 is off;
#: 3 (2026-11-28): a twin models the emulation's shaper burst and TCP's payload share
#: (`twin_simulation`), so what was fitted or validated under 2 without them is off; 4 (2026-11-29):
#: the twin's burst is htb's at the link's line rate, not at its payload rate (4 % more at K = 16-32);
#: 5 (2026-11-29): a copy is its real chunk frames (`frames`), and a paced copy's frames cross as
#: their own TCP segments (``segment_mss``), the last of each frame short; 6 (2026-12-01): a paced
#: copy's carried bytes count the ACKs of its frames, one for every two segments and one for a
#: frame's odd last one (`frames.wire_bytes_factor`), not one for every two full segments.
MODEL_REVISION = 6
#: Training examples of the default dataset (scikit-learn's digits, 1797 examples, 20 % held out).
DEFAULT_TRAIN_EXAMPLES = 1437


@dataclass(frozen=True)
class SimParams:
    """The model's parameters (see the module docstring); an experiment config's ``simulation``
    section gives them (`orchestrator.experiment.config.SimulationConfig`)."""

    #: ``capacity``: the topology's link capacities; ``emulated``: the rates the emulation shapes
    #: (capacity x bw_scale from `emulation.max_link_mbps`), to compare with emulated runs.
    rates: str = "capacity"
    #: Share of a link's rate TCP payload gets.
    tcp_efficiency: float = 1.0
    #: Latency added per link crossed, on top of the fiber delay (switching, queueing).
    per_hop_latency_ms: float = 0.0
    #: Fiber delay on (false: as an emulation without netem).
    propagation: bool = True
    #: Per-chunk work at each sender, seconds (default: the emulation's timing.ALPHA_S).
    alpha_s: float = ALPHA_S
    #: Local training: seconds per example and epoch, seconds per round whatever its examples (the
    #: fixed part), epochs, and the dataset's training examples (split near-equally among the locals).
    seconds_per_example: float = DEFAULT_SECONDS_PER_EXAMPLE
    seconds_per_round: float = 0.0
    local_epochs: int = 2
    train_examples: int = DEFAULT_TRAIN_EXAMPLES
    #: Training runs at each site's speed (its ``cpu``, at most one core: one training thread), as the
    #: emulation's modelled compute does (`workers.compute`); False: every site at one core.
    site_speed: bool = False
    #: A fixed chunk size in bytes (0: the emulation's choice, `optimal_chunk_bytes`).
    chunk_bytes: int = 0
    #: Segments (0: off): each chunk frame crosses the links as its own TCP segments of at most this
    #: many payload bytes, each with `SEGMENT_HEADER_BYTES` on the wire, so a frame's last, short
    #: segment costs a whole header, as a paced copy's do (`workers.pacing` cuts every frame it sends
    #: into segments of the connection's MSS). Off: every payload byte costs the flat
    #: `tcp_efficiency` share of the rate, as TCP streaming frames back to back gives.
    segment_mss: int = 0
    #: At most this many segments per transfer: chunks merged into segments (faster, with a
    #: pipeline-fill error bounded in docs/simulation.md, "Flow-level simulation"); 0: one per chunk.
    max_segments: int = 0
    #: The CPU model (0 cores: off): the cores every site's processes share; the workers' CPU
    #: seconds per byte and per chunk of a transfer (framing, socket, check, aggregation, hand-offs),
    #: in its sender's and receiver's processes; the switch's per byte and link hop.
    cpu_cores: int = 0
    cpu_s_per_byte: float = 0.0
    cpu_s_per_chunk: float = 0.0
    cpu_s_per_byte_hop: float = 0.0
    #: ACKs on the reverse links (`ACK_SHARE`; 0: not modelled): each segment also sends this
    #: share of its bytes along its path reversed, so that a transfer and one the other way on the
    #: same links share them with each other's ACKs, as TCP's do; a segment has left once both went.
    ack_share: float = 0.0
    #: Bytes on the wire per byte of model sent, for carried bytes (the emulation counts frames:
    #: Ethernet, IP and TCP headers, the ACKs on the reverse links, the chunks' own headers).
    wire_bytes_factor: float = WIRE_BYTES_FACTOR
    #: With the CPU model: the host's real training CPU per second of the profile's (the emulation's
    #: training thread runs at SCHED_IDLE beside the site server's threads; `netai calibrate`
    #: measures it from the trainings' overruns where the task's own trainings leave cores idle).
    train_cpu_factor: float = 1.0
    #: The emulation's shaper burst at this time dilation (`orchestrator.simulation.shaper`: what htb
    #: passes ahead of a link's rate after an idle gap); 0: not modelled. A twin of an emulated run
    #: sets its K.
    shaper_burst_k: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TaskRun:
    """One scheduled task to simulate: its schedule, model size and rounds, under a label (key)."""

    key: str
    schedule: Schedule
    model_bytes: int
    rounds: int


def train_seconds(schedule: Schedule, params: SimParams, model: NetworkModel | None = None) -> dict[str, float]:
    """Training time of each local: its near-equal share of the examples (the iid split), at its
    site's speed with `params.site_speed` (`workers.compute.modelled_s`'s formula)."""
    n = len(schedule.local_sites)
    base, extra = divmod(params.train_examples, n)

    def speed(site: str) -> float:
        return min(1.0, model.site(site).cpu) if params.site_speed and model is not None else 1.0

    return {s: (params.seconds_per_round + params.seconds_per_example * params.local_epochs
                * (base + (1 if i < extra else 0))) / speed(s) for i, s in enumerate(schedule.local_sites)}


def chunk_bytes(schedule: Schedule, model_bytes: int, rate: RateFn, params: SimParams) -> int:
    """The task's chunk size: fixed by `params`, or the emulation's choice (`optimal_chunk_bytes`)."""
    if params.chunk_bytes:
        return min(params.chunk_bytes, model_bytes)
    links = [link for e in schedule.edges for link in e.links()]
    bottleneck = min((rate(u, v) for u, v in links), default=1000.0)
    stages = max(schedule.depth("broadcast"), schedule.depth("upload")) + 1
    return optimal_chunk_bytes(model_bytes, stages, bottleneck)  # as the emulation: ALPHA_S, whatever `alpha_s`


def twin_simulation(*, propagation: bool, time_dilation: float = 1.0, paced: bool = False) -> dict[str, Any]:
    """The ``simulation`` section of a simulated twin of an emulated run at time dilation K: the
    emulated rates at the share of them TCP payload gets (derived, as `netai calibrate` sets it:
    1448 of 1514 bytes a frame), propagation as that emulation had it, its shaper's burst at K
    (``shaper_burst_k``; none where its senders `paced` their copies, `workers.pacing`: a paced
    copy finds htb's bucket full and passes no faster than the link; a paced copy's frames also cross as
    segments of their own, ``segment_mss``), and the per-chunk work the emulation pays
    in its network's time: its agents' `ALPHA_S` of real time per chunk is `ALPHA_S` / K of its
    recorded (emulated) time. The chunk size stays the emulation's (`chunk_bytes`: `ALPHA_S` at
    the emulated rates, whatever K)."""
    if time_dilation < 1:
        raise ValueError(f"a time dilation is >= 1, got {time_dilation!r}")
    out: dict[str, Any] = {"rates": "emulated", "propagation": propagation,
                           "shaper_burst_k": 0.0 if paced else time_dilation,
                           "tcp_efficiency": round(TCP_PAYLOAD_SHARE, 4)}
    if paced:
        out["segment_mss"] = TCP_MSS
    if time_dilation > 1:
        out["alpha_s"] = ALPHA_S / time_dilation
    return out


def lanes_of(schedule: Schedule) -> dict[str, list[list[str]]]:
    """Each node's broadcast lanes, as the emulation's agents get them (`task_runner.broadcast_lanes`:
    children whose copies share a link, sent one after another, each whole before the next)."""
    from orchestrator.runtime.task_runner import broadcast_lanes

    senders = sorted({e.src for e in schedule.edges_of("broadcast")})
    return {n: [list(lane) for lane in lanes] for n in senders if (lanes := broadcast_lanes(schedule, n))}


def path_delay_s(model: NetworkModel, path: Sequence[str], params: SimParams) -> float:
    """Propagation of a path: fiber delay (if `params.propagation`) plus the per-hop latency."""
    hops = len(path) - 1
    fiber = model.path_delay_ms(path) if params.propagation else 0.0
    return (fiber + hops * params.per_hop_latency_ms) / 1e3


def build_spec(model: NetworkModel, runs: Sequence[TaskRun], params: SimParams, rate: RateFn,
               background: SimBackground | None = None,
               frames: Callable[[int], Sequence[int]] | None = None) -> dict[str, Any]:
    """The engine's JSON input: directed links (rate x efficiency), the distinct paths with their
    propagation, the task runs in order, and the background flows if any
    (`orchestrator.simulation.background`). `frames(chunk_bytes)`: the bytes of each chunk frame of
    a copy cut at that chunk size (`orchestrator.runtime.compute.model_sizes`), sent as they are;
    None: not modelled (a copy carries the model's bytes only, in equal chunks).

    Raises
    ------
    ValueError
        If a run's schedule is blocked or a path uses a link the topology lacks.
    """
    links = []
    for ln in model.iter_links():
        for a, b in ((ln.a, ln.b), (ln.b, ln.a)):
            links.append({"a": a, "b": b, "rate_mbps": rate(a, b) * params.tcp_efficiency})
    paths: dict[tuple[str, ...], float] = {}
    out_runs = []
    for r in runs:
        s = r.schedule
        if s.blocked:
            raise ValueError(f"task run {r.key}: the schedule is blocked")
        for e in s.edges:
            for u, v in e.links():
                if not model.has_link(u, v):
                    raise ValueError(f"task run {r.key}: path {'-'.join(e.path)} uses {u}-{v}, not a link")
            paths.setdefault(e.path, path_delay_s(model, e.path, params))
        chunk = chunk_bytes(s, r.model_bytes, rate, params)
        sizes = [int(n) for n in frames(chunk)] if frames is not None else []
        out_runs.append({
            "key": r.key, "global": s.global_site, "locals": list(s.local_sites), "rounds": r.rounds,
            "model_bytes": r.model_bytes, "chunk_bytes": chunk,
            "frame_bytes": sum(sizes) - r.model_bytes if sizes else 0, "frame_sizes": sizes,
            "segment_mss": params.segment_mss,
            "alpha_s": params.alpha_s, "max_segments": params.max_segments, "ack_share": params.ack_share,
            "shaper_burst_k": params.shaper_burst_k, "payload_share": params.tcp_efficiency,
            "train_s": train_seconds(s, params, model),
            "train_cpu_s": {k: v * params.train_cpu_factor
                            for k, v in train_seconds(s, replace(params, site_speed=False)).items()},
            "edges": [{"procedure": e.procedure, "src": e.src, "dst": e.dst, "path": list(e.path)} for e in s.edges],
            "lanes": lanes_of(s),
        })
    spec: dict[str, Any] = {"links": links, "paths": [{"path": list(p), "delay_s": d} for p, d in paths.items()],
                            "runs": out_runs}
    if params.cpu_cores > 0 and (params.cpu_s_per_byte > 0 or params.cpu_s_per_chunk > 0
                                 or params.cpu_s_per_byte_hop > 0):
        spec["cpu"] = {"cores": params.cpu_cores, "s_per_byte": params.cpu_s_per_byte,
                       "s_per_chunk": params.cpu_s_per_chunk, "s_per_byte_hop": params.cpu_s_per_byte_hop}
    if background is not None and background.flows:
        spec["background"] = background.to_spec()  # iperf3 rates are payload rates, as the links are
    return spec


def _run_weight(run: dict[str, Any]) -> float:
    """A run's share of the work, roughly: its edges' chunks over all rounds."""
    chunks = max(1, -(-int(run["model_bytes"]) // int(run["chunk_bytes"])))
    if run.get("max_segments"):
        chunks = min(chunks, int(run["max_segments"]))
    return float(len(run["edges"]) * int(run["rounds"]) * chunks)


def split_runs(runs: Sequence[dict[str, Any]], parts: int) -> list[list[dict[str, Any]]]:
    """`runs` cut into at most `parts` consecutive groups of about equal weight (`_run_weight`)."""
    total = sum(_run_weight(r) for r in runs)
    groups: list[list[dict[str, Any]]] = [[]]
    done = 0.0
    for r in runs:
        if groups[-1] and len(groups) < parts and done >= total * len(groups) / parts:
            groups.append([])
        groups[-1].append(r)
        done += _run_weight(r)
    return [g for g in groups if g]


def default_processes() -> int:
    """Engine processes to run at once: the CPUs this process may use, at most 4."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def simulate(spec: dict[str, Any], *, work_dir: Path | None = None, processes: int | None = None) -> dict[str, Any]:
    """Run `spec` in child processes (`python -m orchestrator.simulation.engine`); its JSON result.

    The runs are independent (each task alone on the network, one after the other), so they are
    cut into consecutive groups (`split_runs`), one engine process each (`processes`, default
    `default_processes`), and laid back to back again: each group's times are shifted to start
    where the previous group ended, as if one engine had run them all.

    Raises
    ------
    RuntimeError
        If the engine failed (SimGrid missing, or an error in the simulation), with its last lines.
    """
    if any(f.get("periods") for f in spec.get("background", {}).get("flows", [])):
        processes = 1  # an on/off background runs on one timeline: one engine process
    groups = split_runs(spec["runs"], processes or default_processes()) or [[]]
    # absolute: the engines run in the project's root, so a folder relative to here would not be theirs
    with tempfile.TemporaryDirectory(dir=Path(work_dir).resolve() if work_dir else None, prefix="netai-sim-") as tmp:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        procs = []
        for i, runs in enumerate(groups):
            src, dst = Path(tmp) / f"spec{i}.json", Path(tmp) / f"result{i}.json"
            src.write_text(json.dumps({**spec, "runs": runs}))
            cmd = [sys.executable, "-m", "orchestrator.simulation.engine", str(src), str(dst)]
            procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           env=env, cwd=root), dst))
        results = []
        failed = ""
        for proc, dst in procs:
            stdout, stderr = proc.communicate()
            if (proc.returncode != 0 or not dst.exists()) and not failed:
                tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
                failed = f"the simulation engine failed (exit {proc.returncode}): {tail}"
            elif not failed:
                results.append(json.loads(dst.read_text()))
        if failed:
            raise RuntimeError(failed)
    return _stitch(results)


def _stitch(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The groups' results as one: each group's times shifted to start where the previous ended."""
    runs: list[dict[str, Any]] = []
    end = 0.0
    for res in results:
        shift = end - (res["runs"][0]["start_s"] if res["runs"] else 0.0)
        for r in res["runs"]:
            if shift:
                r["start_s"] += shift
                r["end_s"] += shift
                for events in r["events"].values():
                    for ev in events:
                        ev["t"] += shift
            runs.append(r)
        end = runs[-1]["end_s"] if runs else end
    return {"runs": runs, "sim_end_s": end,
            "wall_s": max((float(r["wall_s"]) for r in results), default=0.0),
            "peak_rss_bytes": sum(int(r["peak_rss_bytes"]) for r in results), "processes": len(results)}
