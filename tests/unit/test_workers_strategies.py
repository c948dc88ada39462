"""Strategies, update compression, training knobs and datasets by spec.

- each codec round-trips within its stated error and shrinks the bytes of an UPDATE on the wire as
  expected (fp16 about 1/2, int8 about 1/4, top-k about 2k: an int32 index and a float32 value per
  kept element);
- a compressed chunk is checked against the compressed layout (dtypes, shapes, finite values) and
  by the codec (scales, indices); bad knobs are refused with a clear error before anything starts;
- FedProx's proximal term keeps local training near the global model;
- compressed tasks still learn on digits, end to end on loopback site servers (a dataset given by
  a file spec, shipped to the servers like a model file).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import torch

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.runtime.backends import LoopbackBackend
from orchestrator.runtime.compute import ComputeManager, check_model
from orchestrator.runtime.task_runner import FLOptions, run_task
from orchestrator.scheduling.schedule import Schedule
from workers import compression, data, strategies
from workers import spec as learning_spec
from workers.aggregate import ChunkSum
from workers.compression import Codec
from workers.config import AgentConfig
from workers.data import open_dataset
from workers.framing import FrameError, Header, chunk_layout, chunk_view, encode_chunk, parse_chunk
from workers.learning import Learner
from workers.models import build_model

CHUNK = 64 * 1024


def _state(hidden: int = 256, seed: int = 0) -> dict[str, torch.Tensor]:
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, seed=seed,
                       model_args={"hidden": hidden}).state_dict()


def _frame_bytes(header: Header, tensors: dict[str, torch.Tensor] | None) -> bytearray:
    return bytearray(b"".join(bytes(b) for b in encode_chunk(header, tensors)))


def test_the_lists_of_knobs_agree() -> None:
    assert learning_spec.STRATEGIES == strategies.STRATEGIES
    assert learning_spec.COMPRESSIONS == compression.COMPRESSIONS
    assert learning_spec.BUILTIN_DATASETS == data.DATASETS
    assert learning_spec.PARTITIONINGS == get_args(data.Partitioning)


@pytest.mark.parametrize("mode", ["fp16", "int8", "int8-chunk", "topk"])
def test_codecs_round_trip_within_their_stated_error(mode: str) -> None:
    delta = {k: torch.randn_like(v) * 0.01 for k, v in _state().items()}
    layout = chunk_layout(delta, CHUNK)
    codec = Codec(mode, layout, k=0.1)
    for spec in layout:
        part = chunk_view(delta, spec)
        wire = codec.encode(spec.index, part)
        # what a receiver sees: the frame parsed against the compressed layout, then decoded
        header = Header("UPDATE", 1, 1, "L", num_examples=5, chunk=spec.index, chunks=len(layout))
        got = codec.decode(spec.index, parse_chunk(_frame_bytes(header, wire)[_skip(header, wire):],
                                                   codec.wire[spec.index], header))
        chunk_amax = max(float(t.abs().max()) for t in part.values())
        for name, x in part.items():
            y = got[name]
            assert y.shape == x.shape and y.dtype == torch.float32
            err = (y - x).abs()
            if mode == "fp16":
                assert bool((err <= x.abs() * 2**-11 + 2**-25).all())  # subnormals: 2**-25 absolute
            elif mode == "int8":
                assert float(err.max()) <= float(x.abs().max()) / 254 * (1 + 1e-5)
            elif mode == "int8-chunk":
                assert float(err.max()) <= chunk_amax / 254 * (1 + 1e-5)
            else:
                kept = y.reshape(-1) != 0
                assert int(kept.sum()) == compression.topk_count(x.numel(), 0.1)
                assert torch.equal(y.reshape(-1)[kept], x.reshape(-1)[kept])  # kept elements exact
                dropped = x.reshape(-1)[~kept].abs()
                assert dropped.numel() == 0 or float(dropped.max()) <= float(x.reshape(-1)[kept].abs().min())


def _skip(header: Header, wire: dict[str, torch.Tensor]) -> int:
    """Bytes of a frame before its payload."""
    buffers = encode_chunk(header, wire)
    return len(buffers[0])


@pytest.mark.parametrize(("mode", "ratio"), [("fp16", 0.5), ("int8", 0.25), ("int8-chunk", 0.25),
                                             ("topk", 2 * 0.05)])
def test_compression_shrinks_the_bytes_on_the_wire(mode: str, ratio: float) -> None:
    delta = {k: torch.randn_like(v) for k, v in _state(hidden=512).items()}  # 300 KB of float32
    layout = chunk_layout(delta, CHUNK)
    codec = Codec(mode, layout, k=0.05)

    def total(c: Codec | None) -> int:
        out = 0
        for spec in layout:
            part = chunk_view(delta, spec)
            header = Header("UPDATE", 1, 1, "L", num_examples=5, chunk=spec.index, chunks=len(layout))
            out += len(_frame_bytes(header, part if c is None else c.encode(spec.index, part)))
        return out

    plain, packed = total(None), total(codec)
    print(f"{mode}: {packed} of {plain} bytes ({packed / plain:.3f})")
    assert ratio * 0.98 <= packed / plain <= ratio * 1.1  # frame and safetensors headers, top-k rounding up


def test_topk_keeps_what_it_left_out_for_the_next_round() -> None:
    delta = {k: torch.randn_like(v) for k, v in _state(hidden=16).items()}
    layout = chunk_layout(delta, None)
    codec = Codec("topk", layout, k=0.1)
    sent = [codec.decode(0, codec.compress(0, delta)) for _ in range(10)]
    # ten rounds of the same change: what was sent adds up to it, less what is still held back
    for name, x in delta.items():
        total = sum(s[name] for s in sent)
        assert torch.allclose(total + codec._residual[0][name], 10 * x, atol=1e-4)


@pytest.mark.parametrize("mode", ["fp16", "int8", "int8-chunk", "topk"])
def test_decoded_updates_aggregate_to_their_exact_weighted_mean(mode: str) -> None:
    deltas = [{k: torch.randn_like(v) * 0.1 for k, v in _state(hidden=32).items()} for _ in range(3)]
    counts = [100, 300, 7]
    layout = chunk_layout(deltas[0], 1024)
    codec = Codec(mode, layout, k=0.2)
    for spec in layout:
        acc = ChunkSum()
        decoded = []
        for i, (d, n) in enumerate(zip(deltas, counts, strict=True)):
            decoded.append(codec.decode(spec.index, codec.encode(spec.index, chunk_view(d, spec))))
            acc.add(str(i), decoded[-1], n)
        mean = acc.mean()
        assert mean is not None
        for name in mean:
            want = sum(n * dec[name].double() for dec, n in zip(decoded, counts, strict=True)) / sum(counts)
            assert torch.allclose(mean[name].double(), want, atol=1e-6)


def test_bad_compressed_chunks_are_rejected() -> None:
    delta = {k: torch.randn_like(v) for k, v in _state(hidden=8).items()}
    layout = chunk_layout(delta, None)
    header = Header("UPDATE", 1, 1, "L", num_examples=5, chunk=0, chunks=1)

    def payload(wire: dict[str, torch.Tensor]) -> bytearray:
        return _frame_bytes(header, wire)[_skip(header, wire):]

    fp16 = Codec("fp16", layout)
    with pytest.raises(FrameError, match="bad_tensors"):  # float32 where float16 is due
        parse_chunk(payload(delta), fp16.wire[0], header)
    nan = fp16.encode(0, delta)
    name = sorted(nan)[0]
    nan[name] = nan[name].clone()
    nan[name].reshape(-1)[0] = float("nan")
    with pytest.raises(FrameError, match="non-finite"):
        parse_chunk(payload(nan), fp16.wire[0], header)

    int8 = Codec("int8", layout)
    wire = int8.encode(0, delta)
    scale = next(n for n in wire if n.endswith(compression.SCALE))
    wire[scale] = torch.tensor([-1.0])
    with pytest.raises(FrameError, match="scale"):
        int8.decode(0, parse_chunk(payload(wire), int8.wire[0], header), header)

    topk = Codec("topk", layout, k=0.5)
    for bad in ("out_of_range", "repeated"):
        wire = topk.encode(0, delta)
        idx_name = next(n for n in wire if n.endswith(compression.INDICES))
        idx = wire[idx_name].clone()
        if bad == "out_of_range":
            idx[-1] = 10**6
        else:
            idx[1] = idx[0]
        wire[idx_name] = idx
        with pytest.raises(FrameError, match="top-k indices"):
            topk.decode(0, parse_chunk(payload(wire), topk.wire[0], header), header)


def _agent(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"task": 1, "site": "L", "host": "127.0.0.2", "broadcast_port": 1, "upload_port": 2,
                            "rounds": 1, "upload_parent": {"site": "G", "host": "127.0.0.1"},
                            "broadcast_parent": {"site": "G", "host": "127.0.0.1"}}
    return base | kw


@pytest.mark.parametrize(("kw", "match"), [
    ({"strategy": "fedsgd"}, "strategy must be one of"),
    ({"mu": 0.1}, "mu .* needs strategy fedprox"),
    ({"strategy": "fedprox", "mu": -1}, "mu must be a number >= 0"),
    ({"compression": "zip"}, "compression must be one of"),
    ({"k": 0.1}, "k .* needs compression topk"),
    ({"compression": "topk", "k": 1.5}, "k must be a number > 0 and <= 1"),
    ({"lr": 0}, "lr must be a number > 0"),
    ({"lr": "0.1"}, "lr must be a number > 0"),
    ({"local_epochs": 0}, "local_epochs must be an integer in 1..1000"),
    ({"batch_size": 2.5}, "batch_size must be an integer in 1..1000000"),
    ({"dataset": "mnist"}, "unknown dataset 'mnist'"),
])
def test_agent_config_rejects_bad_knobs(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AgentConfig.from_dict(_agent(**kw))


def test_agent_config_takes_good_knobs() -> None:
    cfg = AgentConfig.from_dict(_agent(strategy="fedprox", mu=0.01, compression="topk", k=0.05, lr=0.05,
                                       local_epochs=1, batch_size=16, dataset="synthetic",
                                       dataset_args={"input_shape": [1, 4, 4]}))
    assert AgentConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(("task", "match"), [
    ({"compresion": "fp16"}, "unknown key task.compresion"),
    ({"compression": "int4"}, "task.compression must be one of"),
    ({"strategy": "fedavg", "mu": 0.5}, "mu .* needs strategy fedprox"),
    ({"compression": "fp16", "k": 0.1}, "k .* needs compression topk"),
    ({"k": 0}, r"task.k must be a number > 0 and <= 1"),
    ({"lr": -0.1}, "task.lr must be a number > 0"),
    ({"batch_size": 0}, "task.batch_size must be an integer"),
    ({"dataset": "cifar"}, "unknown dataset 'cifar'"),
    ({"dataset_args": [1]}, "task.dataset_args must be a mapping"),
])
def test_experiment_config_rejects_bad_knobs(task: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({"name": "x", "topology": "triangle", "locals": [1], "task": task})


def test_experiment_config_takes_the_knobs_and_round_trips() -> None:
    task = {"lr": 0.05, "local_epochs": 1, "batch_size": 16, "strategy": "fedprox", "mu": 0.01,
            "compression": "topk", "k": 0.1, "dataset": "synthetic", "dataset_args": {"num_examples": 500}}
    cfg = parse_config({"name": "x", "topology": "triangle", "locals": [1], "task": task})
    assert cfg.task.compression == "topk" and cfg.task.mu == 0.01
    assert parse_config(cfg.to_dict()) == cfg


def test_shipped_example_config_parses() -> None:
    from orchestrator.experiment.config import load_config

    cfg = load_config(Path(__file__).parents[2] / "experiments" / "strategies.yaml")
    assert cfg.task.compression != "none"


def _learner(strategy: str, mu: float) -> Learner:
    return Learner(AgentConfig(task=1, site="L", host="127.0.0.2", broadcast_port=1, upload_port=2, rounds=1,
                               part_index=0, num_parts=2, local_epochs=1, strategy=strategy, mu=mu))


def test_fedprox_keeps_local_training_near_the_global_model() -> None:
    moved = {}
    for strategy, mu in (("fedavg", 0.0), ("fedprox", 1.0)):
        learner = _learner(strategy, mu)
        start = learner.state()
        learner.train()
        end = learner.state()
        moved[strategy] = math.sqrt(sum(float(((end[k] - start[k]) ** 2).sum()) for k in start))
    assert moved["fedprox"] < 0.8 * moved["fedavg"], moved


DATASET_FILE = '''
import numpy as np

def blobs(*, seed, n=600, dim=16):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    centres = rng.standard_normal((4, dim)) * 3
    x = (centres[y] + rng.standard_normal((n, dim))).astype(np.float32)
    cut = n * 4 // 5
    return {"train_x": x[:cut], "train_y": y[:cut], "test_x": x[cut:], "test_y": y[cut:], "num_classes": 4}

def broken(*, seed):
    return {"train_x": [[1.0]], "train_y": [0.5], "test_x": [[1.0]], "test_y": [0]}
'''


def test_a_dataset_by_file_spec_is_loaded_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "my_data.py"
    path.write_text(DATASET_FILE)
    ds = open_dataset(f"{path}:blobs", seed=3, args={"n": 500})
    assert (ds.input_shape, ds.num_classes, len(ds.train_x), len(ds.test_x)) == ((16,), 4, 400, 100)
    assert check_model("mlp", {}, f"{path}:blobs", {}) > 0
    with pytest.raises(ValueError, match="train_y must be integer labels"):
        open_dataset(f"{path}:broken")
    with pytest.raises(ValueError, match="the factory raised TypeError"):
        open_dataset(f"{path}:blobs", args={"colour": 1})
    with pytest.raises(ConfigError, match="no_such"):
        check_model("mlp", {}, f"{path}:no_such")


# -- end to end on loopback site servers ------------------------------------------------------------
SITES = ("G", "A", "L1", "L2")
TREE = {"A": "G", "L1": "A", "L2": "A"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComputeManager]:
    root = tmp_path_factory.mktemp("servers")
    with ComputeManager(LoopbackBackend(SITES, log_root=root), SITES) as cm:
        yield cm


@pytest.mark.slow
@pytest.mark.parametrize(("knobs", "ratio"), [
    ({"compression": "fp16"}, 0.5),
    ({"compression": "int8-chunk", "strategy": "fedprox", "mu": 0.01}, 0.25),
    ({"compression": "topk", "k": 0.1}, 0.25),  # 2k, and headers weigh more on a 19 KB model
])
def test_compressed_tasks_learn_digits(servers: ComputeManager, knobs: dict[str, Any], ratio: float) -> None:
    sched = Schedule(task_id=21, scheduler="hand", global_site="G", local_sites=("A", "L1", "L2"),
                     demand_mbps=1.0, broadcast_parent=TREE, upload_parent=TREE)
    name = "-".join(str(v) for v in knobs.values())
    plain = run_task(sched, manager=servers, options=FLOptions(rounds=1, model="mlp", local_epochs=1),
                     log_dir=servers.task_dir(f"plain-{name}"))
    result = run_task(sched, manager=servers, options=FLOptions(rounds=4, model="mlp", local_epochs=1, **knobs),
                      log_dir=servers.task_dir(name))

    acc = [r.accuracy for r in result.rounds]
    sent = [r.upload_bytes for r in result.rounds]
    print(knobs, "accuracy per round:", " ".join(f"{a:.3f}" for a in acc), "upload bytes per round:", sent,
          "uncompressed:", plain.rounds[0].upload_bytes)
    assert acc[-1] > acc[0] and acc[-1] > 0.8, acc
    assert all(r.num_examples == 1438 and r.stragglers == () for r in result.rounds)
    assert result.rejected == ()
    assert all(r.broadcast_bytes == plain.rounds[0].broadcast_bytes for r in result.rounds)
    assert all(s < ratio * 1.1 * plain.rounds[0].upload_bytes for s in sent), sent
    assert not any(b < a - 0.1 for a, b in itertools.pairwise(acc)), acc


@pytest.mark.slow
def test_a_dataset_file_is_shipped_to_the_site_servers(servers: ComputeManager, tmp_path: Path) -> None:
    path = tmp_path / "blob_data.py"
    path.write_text(DATASET_FILE)
    sched = Schedule(task_id=22, scheduler="hand", global_site="G", local_sites=("A", "L1", "L2"),
                     demand_mbps=1.0, broadcast_parent=TREE, upload_parent=TREE)
    result = run_task(sched, manager=servers, log_dir=servers.task_dir("blobs"),
                      options=FLOptions(rounds=2, model="mlp", local_epochs=1, dataset=f"{path}:blobs",
                                        dataset_args={"n": 800}, compression="int8"))
    assert all(r.num_examples == 640 for r in result.rounds)
    assert result.rounds[-1].accuracy > 0.8
