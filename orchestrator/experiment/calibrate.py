"""`netai calibrate`: this host's time dilation and the flow-level simulation's parameters at it,
once per host and version (docs/simulation.md, "Flow-level simulation", calibration).

An emulation on a small host measures the host's contention as much as the emulated network unless
it is time-dilated to a K at which its own fidelity verdict finds it faithful. So the host's
calibration is first that K, and the model's parameters are then fitted on an emulation at K, where
they describe the emulated network, not the host. A fixed set of measurements, the same on every host:

1. the workers' own CPU per byte of a transfer (`measure_worker_cpu`: framing, socket, check,
   aggregation, on one core of this host): a figure of the host, stored in ``host_cpu``, not applied;
2. the host's K and the emulated reference at it: the fixed config (`CALIBRATION_SET`: NSFNET, spff
   and mst at 2 and 4 locals, 1 task each, 3 rounds, the 2.8 MB MLP, no background) run with
   ``time_dilation: auto`` up to the cap (`AUTO_MAX_TIME_DILATION`): the auto-dilation trials
   (one task at 4 locals, 3 rounds, each scheduler, at K = 1, 2, 4, ...;
   `orchestrator.experiment.calibration`) choose the smallest faithful K (else the cap, said and
   stored as not faithful), then the set runs at that K; its environment also says whether the
   links had delay (netem); the lone trainings' real over modelled time on it is stored in
   ``host_cpu`` (1 when they held: the host kept up at K);
3. the per-hop software latency (`per_hop_latency_ms`: what a chunk still waits at each link of its
   path at K beyond its transmission) fitted by bisection so that the simulated mean round latency
   over the set's points matches the emulated one (geometric mean of the per-point ratios within
   0.2 %); `tcp_efficiency` is derived (TCP payload per Ethernet frame at MTU 1500), so is
   `ack_share` (`spec.ACK_SHARE`: the ACKs on a transfer's reverse links), and the wire
   bytes per payload byte (`wire_bytes_factor`) measured: the emulated run's carried bytes over the
   simulated payload's, task by task. No CPU model is stored: at a faithful K the host's CPU does
   not show in the emulated times, and a model of it would charge the host to the network.

The result is stored with the host's identity and the project's version, K and its trials
(`orchestrator.simulation.calibration`), together with the per-point ratios before and after, so
that an uncalibrated run can say how far off the defaults were here. Nothing is stored when a step
fails.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import AUTO_MAX_TIME_DILATION, ExperimentConfig, parse_config
from orchestrator.experiment.emulation_config import recorded_emulation
from orchestrator.results import queries
from orchestrator.scheduling.cost import TCP_PAYLOAD_SHARE
from orchestrator.simulation.calibration import Calibration, HostIdentity, new_id, save
from orchestrator.simulation.spec import ACK_SHARE, WIRE_BYTES_FACTOR, twin_simulation

#: The fixed emulated set every calibration runs (4 task runs of 3 rounds), at the K its trials
#: choose (``time_dilation: auto``; the cap is set by `calibration_config`). One task a point (format 1
#: ran 2): at K its wall time is K times its emulated time, and the fit compares each task with its twin.
CALIBRATION_SET: dict[str, Any] = {
    "name": "calibrate", "topology": "sndlib/nobel-us", "schedulers": ["spff", "mst"], "locals": [2, 4],
    "tasks_per_point": 1, "seed": 11,
    "task": {"model": "mlp", "model_args": {"hidden": 800, "layers": 2}, "rounds": 3, "demand_mbps": 1000,
             "partition": "iid"},
    "emulation": {"max_link_mbps": 100, "backend": "auto", "time_dilation": "auto"}, "background": {"enabled": False},
}
FIT_TOLERANCE = 0.002
#: The parameter fitted, and its range.
FIT_PARAM = "per_hop_latency_ms"
FIT_MAX = 100.0
FIT_STEPS = 14

Say = Callable[[str], None]


def calibration_config(backend: str = "auto", max_time_dilation: float = AUTO_MAX_TIME_DILATION) -> ExperimentConfig:
    """`CALIBRATION_SET` as a config (its backend may be chosen: the measurements are the same), its
    trials up to `max_time_dilation`."""
    raw = {**CALIBRATION_SET, "emulation": {**CALIBRATION_SET["emulation"], "backend": backend,
                                            "max_time_dilation": max_time_dilation}}
    return parse_config(raw, where="the calibration set")


def measure_worker_cpu(model_args: dict[str, Any] | None = None, chunk_bytes: int = 102_400,
                       reps: int = 5) -> float:
    """CPU seconds per byte the workers' own code spends on one transfer, measured on this machine:
    the chunks of the model framed (`encode_chunk`), sent over a local socket pair (`sendmsg_all`),
    read and checked (`read_frame`, `parse_chunk`) and copied into place, then a second update
    folded in, averaged and re-encoded (`ChunkSum`, as an aggregator does); process CPU time over
    the bytes."""
    import socket
    import threading

    import torch

    from workers.aggregate import ChunkSum
    from workers.framing import Header, chunk_layout, chunk_view, encode_chunk, parse_chunk
    from workers.models import build_model
    from workers.transport import read_frame, sendmsg_all

    torch.set_num_threads(1)
    model = build_model("mlp", input_shape=(64,), num_classes=10, model_args=model_args or {"hidden": 800, "layers": 2})
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    layout = chunk_layout(state, chunk_bytes)
    total = sum(c.nbytes for c in layout) * reps
    a, b = socket.socketpair()
    incoming = {k: torch.empty_like(v) for k, v in state.items()}

    def send() -> None:
        for _ in range(reps):
            for k, spec in enumerate(layout):
                header = Header("GLOBAL", 1, 1, "G", chunk=k, chunks=len(layout))
                sendmsg_all(a, encode_chunk(header, chunk_view(state, spec)))

    cpu0 = time.process_time()
    sender = threading.Thread(target=send)
    sender.start()
    try:
        for _ in range(reps):
            for spec in layout:
                frame = read_frame(b, max_payload_bytes=1 << 30)
                if frame is None:
                    raise RuntimeError("the measuring socket closed early")
                tensors = parse_chunk(frame[1], spec, frame[0])
                for piece in spec.pieces:
                    piece.view(incoming[piece.base]).copy_(tensors[piece.name])
                acc = ChunkSum()
                acc.add("a", tensors, 10)
                acc.add("b", tensors, 10)
                encode_chunk(Header("UPDATE", 1, 1, "A", num_examples=20, chunk=spec.index, chunks=len(layout)),
                             acc.mean())
    finally:
        sender.join()
        a.close()
        b.close()
    return (time.process_time() - cpu0) / total


def as_simulated(raw: dict[str, Any], simulation: dict[str, Any]) -> dict[str, Any]:
    """A config's dict on the flow-level model with `simulation` as its section. The emulation's K
    (one, or one per point) goes: a time-dilated emulation records its durations divided by K, in the emulated network's
    time, which is the simulation's (`twin_simulation` keeps what K changes of the emulation)."""
    emulation = {k: v for k, v in dict(raw.get("emulation") or {}).items()
                 if k not in ("time_dilation", "max_time_dilation", "per_point")}
    return {**raw, "engine": "simulation", "emulation": emulation, "simulation": simulation}


def simulated_config(cfg: ExperimentConfig, params: dict[str, Any], *, propagation: bool,
                     time_dilation: float = 1.0) -> ExperimentConfig:
    """`cfg` on the flow-level model at the emulated rates with `params` (no stored calibration:
    the parameters are set, and the note says so), standing for its emulation at `time_dilation`
    (`twin_simulation`)."""
    raw = cfg.to_dict()
    for key in ("online", "events", "reschedule"):
        raw.pop(key, None)
    twin = twin_simulation(propagation=propagation, time_dilation=time_dilation, paced=cfg.emulation.pace_copies)
    raw = as_simulated(raw, {**twin, **params,
                             "calibration": params.get("calibration") or "set explicitly"})
    return parse_config({**raw, "mode": "sequential"}, where=f"{cfg.name} (simulated)")


def point_means(run_dir: Path, run_id: int) -> dict[tuple[str, int], float]:
    """Mean over its done tasks of each task's mean round latency, per (scheduler, locals)."""
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.summary import run_summary

    with ResultsDB(run_dir / "results.db") as db:
        tasks = run_summary(db, run_id).tasks
    by: dict[tuple[str, int], list[float]] = {}
    for t in tasks:
        if t.state == "done" and t.mean_latency_s:
            by.setdefault((t.scheduler, t.n_locals), []).append(float(t.mean_latency_s))
    return {k: sum(v) / len(v) for k, v in by.items()}


def carried_by_task(run_dir: Path, run_id: int) -> dict[tuple[str, int], int]:
    """Carried bytes of each done task, by (scheduler, task id)."""
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.summary import run_summary

    with ResultsDB(run_dir / "results.db") as db:
        tasks = run_summary(db, run_id).tasks
    return {(t.scheduler, t.task_id): int(t.carried_bytes) for t in tasks if t.state == "done" and t.carried_bytes}


def wire_factor(emu: dict[tuple[str, int], int], sim: dict[tuple[str, int], int], sim_factor: float) -> float:
    """The wire bytes per payload byte that makes the simulated carried bytes the emulated ones,
    over the tasks both runs completed (`sim` was counted with `sim_factor`)."""
    keys = set(emu) & set(sim)
    if not keys:
        raise RuntimeError("no task completed in both runs: carried bytes cannot be compared")
    return sim_factor * sum(emu[k] for k in keys) / sum(sim[k] for k in keys)


def training_factor(run_dir: Path, run_id: int) -> float:
    """The host's real training time over the modelled one, on trainings that ran alone: the median
    over the run's node-rounds whose training overlapped no other training of its task's round
    (`lone_ratios`) of real / modelled, counting a training that held (no overrun) as 1. The
    simulation adds the sharing of the cores itself, so a training that shared them would count it
    twice (at 2 locals both locals train at once)."""
    from orchestrator.results.db import ResultsDB

    with ResultsDB(run_dir / "results.db") as db:
        spans = queries.training_spans(db.conn, run_id)
    ratios = sorted(lone_ratios(spans))
    return ratios[len(ratios) // 2] if ratios else 1.0


def lone_ratios(spans: list[dict[str, Any]]) -> list[float]:
    """Real / modelled of each training in `spans` (`queries.training_spans`) that overlapped no
    other of its task and round (real time: its overrun's, else its span, which held: ratio 1)."""
    by: dict[tuple[Any, ...], list[tuple[float, float, float]]] = {}
    for s in spans:
        real = float(s["real_s"]) if s["real_s"] is not None else float(s["end_s"]) - float(s["start"])
        ratio = real / float(s["modelled_s"]) if s["real_s"] is not None and s["modelled_s"] else 1.0
        by.setdefault((s["scheduler"], s["task_id"], s["round"]), []).append((float(s["start"]), real, ratio))
    out = []
    for group in by.values():
        for i, (start, real, ratio) in enumerate(group):
            if not any(j != i and s0 < start + real and s0 + r0 > start for j, (s0, r0, _) in enumerate(group)):
                out.append(ratio)
    return out


def geo_ratio(sim: dict[tuple[str, int], float], emu: dict[tuple[str, int], float]) -> float:
    """Geometric mean over the common points of sim / emu (the fit's criterion)."""
    keys = sorted(set(sim) & set(emu))
    if not keys:
        raise RuntimeError("the simulated and emulated runs have no point in common")
    return math.exp(sum(math.log(sim[k] / emu[k]) for k in keys) / len(keys))


def fit(emu: dict[tuple[str, int], float], simulate_with: Callable[[float], dict[tuple[str, int], float]],
        say: Say) -> float:
    """The value of the fitted parameter (`FIT_PARAM`) whose simulation matches `emu` (`geo_ratio`
    within `FIT_TOLERANCE`), by bisection on [0, `FIT_MAX`]; the bound it reached if the emulation
    is faster than the model without it (0) or slower than with the most (the bound)."""
    lo, hi = 0.0, FIT_MAX
    r_lo = geo_ratio(simulate_with(lo), emu)
    say(f"  {FIT_PARAM} 0: simulated / emulated {r_lo:.3f}")
    if r_lo >= 1.0 - FIT_TOLERANCE:
        return 0.0
    r_hi = geo_ratio(simulate_with(hi), emu)
    if r_hi <= 1.0:
        return hi
    for _ in range(FIT_STEPS):
        mid = (lo + hi) / 2
        r = geo_ratio(simulate_with(mid), emu)
        say(f"  {FIT_PARAM} {mid:.3f}: simulated / emulated {r:.3f}")
        if abs(r - 1.0) <= FIT_TOLERANCE:
            return mid
        lo, hi = (mid, hi) if r < 1.0 else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Reference:
    """The calibration set's emulated run: where, whether its links had delay, and its K."""

    run_dir: Path
    run_id: int
    delay: bool
    #: The K it ran at, and the auto-dilation search that chose it (None: a run without one).
    k: float
    dilation: dict[str, Any] | None


def calibrate(*, out_root: Path, store: Path, backend: str = "auto", emulated_run: Path | None = None,
              max_time_dilation: float = AUTO_MAX_TIME_DILATION, say: Say = print) -> Calibration:
    """Run the fixed set at the host's K, fit, store (see the module docstring); the stored calibration.

    Raises
    ------
    ConfigError
        If the emulated run failed, or `emulated_run` is not a run of the fixed set.
    """
    host = HostIdentity.here()
    say(f"calibrate: host {host.hostname} ({host.cores} cores, {host.cpu_model}, kernel {host.kernel})")
    cfg = calibration_config(backend, max_time_dilation)
    say("[1/3] the workers' CPU per byte of a transfer, on this host ...")
    per_byte = min(measure_worker_cpu(dict(cfg.task.model_args or {})) for _ in range(3))
    say(f"  {per_byte:.3g} s per byte")
    say(f"[2/3] the host's time dilation (trials of 1 task at {max(cfg.locals)} locals, K up to "
        f"{max_time_dilation:g}), then the fixed set emulated at it ({len(cfg.schedulers)} schedulers x "
        f"{len(cfg.locals)} points x {cfg.tasks_per_point} tasks, {cfg.task.rounds} rounds) ...")
    ref = _emulated(cfg, out_root, emulated_run, say)
    emu = point_means(ref.run_dir, ref.run_id)
    say(f"  at K={ref.k:g}: " + ", ".join(f"{s} {n} locals {v * 1e3:.1f} ms" for (s, n), v in sorted(emu.items())))
    train = round(training_factor(ref.run_dir, ref.run_id), 3)
    say(f"  real training over modelled at K={ref.k:g}, trainings that ran alone (median): {train:.3f}")
    say(f"[3/3] fitting {FIT_PARAM} to the emulated round latency at K={ref.k:g} ...")
    params, points, off = _fit_model(cfg, ref, emu, out_root, say)
    cal_id, created = new_id(host)
    from orchestrator import __version__

    cal = Calibration(id=cal_id, created=created, host=host, version=__version__, params=params,
                      delay_emulated=ref.delay, points=points, uncalibrated_off_by=off,
                      time_dilation=ref.k, dilation=ref.dilation, frames=True,
                      host_cpu={"cpu_s_per_byte": float(f"{per_byte:.3g}"), "train_real_over_modelled": train},
                      note=f"netai calibrate: fixed set {cfg.topology} spff/mst at 2 and 4 locals, emulated run "
                           f"{ref.run_dir.name} at K={ref.k:g} (auto-dilation trials up to {max_time_dilation:g}); "
                           f"tcp_efficiency derived, {FIT_PARAM} fitted and wire_bytes_factor measured at K")
    save(cal, store)
    return cal


def _fit_model(cfg: ExperimentConfig, ref: Reference, emu: dict[tuple[str, int], float], out_root: Path,
               say: Say) -> tuple[dict[str, float], list[dict[str, Any]], float]:
    """The model's parameters fitted on the reference (`FIT_PARAM` by `fit`, the wire factor measured),
    each point's emulated, uncalibrated and calibrated mean round time, and the defaults' worst error."""
    base = {"tcp_efficiency": round(TCP_PAYLOAD_SHARE, 4), "ack_share": ACK_SHARE}
    sim_dir = out_root / "calibration-sims"
    last: list[tuple[Path, int]] = []

    def simulate_with(value: float, params: dict[str, Any] | None = None) -> dict[tuple[str, int], float]:
        from orchestrator.experiment.simulated import run_simulated

        p = params if params is not None else {**base, FIT_PARAM: value}
        outcome = run_simulated(simulated_config(cfg, p, propagation=ref.delay, time_dilation=ref.k),
                                out_root=sim_dir, figures=False)
        last[:] = [(outcome.run_dir, outcome.run_id)]
        return point_means(outcome.run_dir, outcome.run_id)

    fitted = float(f"{fit(emu, simulate_with, say):.3g}")
    before, after = simulate_with(0.0, {}), simulate_with(fitted)
    factor = wire_factor(carried_by_task(ref.run_dir, ref.run_id), carried_by_task(*last[0]), WIRE_BYTES_FACTOR)
    say(f"  wire bytes per payload byte (carried bytes): {factor:.4f} (derived default {WIRE_BYTES_FACTOR})")
    params = {**base, FIT_PARAM: fitted, "wire_bytes_factor": round(factor, 4)}
    points: list[dict[str, Any]] = [
        {"scheduler": s, "locals": n, "emulated_s": emu[(s, n)], "uncalibrated_s": before.get((s, n)),
         "calibrated_s": after.get((s, n))} for s, n in sorted(emu)]
    off = max((abs(before[k] / emu[k] - 1) for k in emu if k in before), default=0.0)
    return params, points, off


def _emulated(cfg: ExperimentConfig, out_root: Path, emulated_run: Path | None, say: Say = print) -> Reference:
    """The fixed set's emulated run at the host's K (run now, its trials first, or an earlier one
    given); its fidelity verdict said (a point that measured the host fits the model to the host)."""
    from orchestrator.results.db import ResultsDB

    if emulated_run is None:
        from orchestrator.experiment.runner import run_experiment

        outcome = run_experiment(cfg, out_root=out_root, progress=False, figures=False)
        if outcome.status != "completed":
            raise ConfigError(f"the calibration's emulated run {outcome.run_dir} ended {outcome.status}")
        run_dir, run_id = outcome.run_dir, outcome.run_id
    else:
        run_dir = emulated_run
        run_id = same_config_run(run_dir, cfg)
    with ResultsDB(run_dir / "results.db") as db:
        env = db.run(run_id)["environment"]
    from orchestrator.results.agreement_report import fidelity_lines

    dilation = env.get("time_dilation_calibration")
    k = float(env.get("time_dilation") or 1.0)
    if dilation is not None and not dilation.get("faithful"):
        say(f"  warning: no K up to {dilation.get('cap')} was faithful: K={k:g} (the cap) still measures some of the host")
    for line in fidelity_lines(run_dir, run_id, [(s, n) for s in cfg.schedulers for n in cfg.locals],
                               compute_modelled=cfg.task.compute_timing == "modeled"):
        say("  " + line)
    return Reference(run_dir, run_id, bool(env.get("delay_emulated", False)), k, dilation)


def same_config_run(run_dir: Path, cfg: ExperimentConfig) -> int:
    """The id of the emulated run in `run_dir` of `cfg` (the backend may differ: the same tasks).

    Raises
    ------
    ConfigError
        If `run_dir` holds no results, no emulated run, or one of another config.
    """
    from orchestrator.results.db import ResultsDB

    if not (run_dir / "results.db").exists():
        raise ConfigError(f"{run_dir} holds no results.db")
    with ResultsDB(run_dir / "results.db") as db:
        last = queries.last_completed_run(db.conn, "emulation")
        if last is None:
            raise ConfigError(f"{run_dir} holds no completed emulated run")
        run = db.run(last)
    want = _comparable(cfg.to_dict())
    got = _comparable(dict(run["config"]))
    if want != got:
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise ConfigError(f"{run_dir} is a run of another config (differs in: {', '.join(diff)})")
    return int(run["id"])


def _comparable(raw: dict[str, Any]) -> dict[str, Any]:
    """A config's dict without what does not change its tasks or network (the backend, the name); a
    run recorded before the ``order`` key ran its schedulers in the config's order (``fixed``), and
    one recorded before ``pace_copies`` did not pace them."""
    out = {k: v for k, v in raw.items() if k not in ("name", "engine", "simulation")}
    out.setdefault("order", "fixed")
    emulation = recorded_emulation(out.get("emulation") or {})
    emulation.pop("backend", None)
    out["emulation"] = emulation
    return out


def replace_backend(cfg: ExperimentConfig, backend: str) -> ExperimentConfig:
    """`cfg` with another emulation backend (re-validated)."""
    return parse_config(replace(cfg, emulation=replace(cfg.emulation, backend=backend)).to_dict(), where=cfg.name)
