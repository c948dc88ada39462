"""Local training and evaluation of one agent: its data part, its model, SGD under the task's
strategy (FedAvg, or FedProx's proximal term: `workers.strategies`).

This is the only part of the agent that runs the model; it does no I/O.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import json
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

from workers import priority
from workers.config import AgentConfig
from workers.data import Dataset, open_dataset, partition
from workers.framing import TensorSet
from workers.models import build_model, state_nbytes
from workers.sgd import SGD
from workers.strategies import make_strategy

T = TypeVar("T")

def run_at_lower_priority(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own, below every network-path thread (`workers.priority`:
    SCHED_IDLE, else nice +10); its result, or its exception re-raised.

    Linux keeps the policy and nice value per thread, so only this thread is lowered, and since
    it ends with ``fn`` nothing needs raising back (which an unprivileged process, or a container
    without CAP_SYS_NICE, could not do). Where neither can be set, ``fn`` runs at the caller's
    priority (`workers.priority.enter_training` logs it once).
    """
    out: list[T] = []
    err: list[BaseException] = []

    def body() -> None:
        priority.enter_training()
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller
            err.append(e)

    worker = threading.Thread(target=body, name="train", daemon=True)
    worker.start()
    worker.join()
    if err:
        raise err[0]
    return out[0]


@functools.lru_cache(maxsize=8)
def _dataset(name: str, seed: int, args_json: str) -> Dataset:
    """A dataset, loaded once per process: the roles of a site server share it (read only)."""
    return open_dataset(name, seed=seed, args=json.loads(args_json))


class Learner:
    """The model, the data and the training of one agent (`cfg.part_index` None: holds no data part)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        torch.set_num_threads(max(1, cfg.threads))
        self.data: Dataset = _dataset(cfg.dataset, cfg.seed, json.dumps(dict(cfg.dataset_args), sort_keys=True))
        self.model: nn.Module = build_model(
            cfg.model,
            input_shape=self.data.input_shape,
            num_classes=self.data.num_classes,
            seed=cfg.seed,
            model_args=dict(cfg.model_args),
        )
        #: Names, shapes and dtypes every received tensor set is checked against.
        self.template: dict[str, torch.Tensor] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model_bytes = state_nbytes(self.model)
        self.strategy = make_strategy(cfg.strategy, mu=cfg.mu)
        self.train_idx: torch.Tensor | None = None
        if cfg.part_index is not None:
            parts = partition(
                self.data.train_y,
                cfg.num_parts,
                scheme="dirichlet" if cfg.partitioning == "dirichlet" else "iid",
                alpha=cfg.alpha,
                seed=cfg.seed,
            )
            self.train_idx = torch.from_numpy(parts[cfg.part_index])
        self._warm_up()

    @property
    def num_examples(self) -> int:
        return 0 if self.train_idx is None else len(self.train_idx)

    def train(self) -> int:
        """Local training on this node's part, below the agent's transfers in priority
        (`run_at_lower_priority`); returns its example count."""
        return run_at_lower_priority(self._train)

    def _train(self) -> int:
        assert self.train_idx is not None
        x = self.data.train_x[self.train_idx]
        y = self.data.train_y[self.train_idx]
        self.model.train()
        opt = SGD(self.model.parameters(), lr=self.cfg.lr, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        self.strategy.begin(self.model)
        gen = torch.Generator().manual_seed(self.cfg.seed + 7919 * (self.cfg.part_index or 0))
        for _ in range(self.cfg.local_epochs):
            order = torch.randperm(len(x), generator=gen)
            for i in range(0, len(x), self.cfg.batch_size):
                idx = order[i : i + self.cfg.batch_size]
                opt.zero_grad()
                self._step_loss(loss_fn, x[idx], y[idx]).backward()
                opt.step()
        return len(x)

    def _step_loss(self, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss one training step back-propagates: the batch's, plus the strategy's penalty."""
        loss: torch.Tensor = loss_fn(self.model(x), y)
        extra = self.strategy.penalty(self.model)
        return loss if extra is None else loss + extra

    def step_flops_per_example(self) -> float:
        """Floating-point operations per example of one training step (forward, loss and backward,
        as `train` takes it) on the first batch of this node's part (of the whole training split
        when it holds none), counted by torch's `FlopCounterMode`: deterministic, no timing. The
        optimizer's update is elementwise and not counted, nor are ops torch has no formula for
        (0 when it counts none). The model's gradients are cleared afterwards."""
        from torch.utils.flop_counter import FlopCounterMode

        idx = self.train_idx if self.train_idx is not None else torch.arange(len(self.data.train_y))
        batch = idx[: self.cfg.batch_size]
        if len(batch) == 0:
            return 0.0
        self.model.train()
        self.strategy.begin(self.model)
        with FlopCounterMode(display=False) as counter:
            self._step_loss(nn.CrossEntropyLoss(), self.data.train_x[batch], self.data.train_y[batch]).backward()
        self.model.zero_grad(set_to_none=True)
        return float(counter.get_total_flops()) / len(batch)

    @torch.no_grad()
    def train_loss(self) -> float:
        """Mean loss of the current model on this node's own training part (local-model selection's
        ``loss`` measure, `workers.selection`)."""
        assert self.train_idx is not None
        self.model.eval()
        return float(nn.functional.cross_entropy(self.model(self.data.train_x[self.train_idx]),
                                                 self.data.train_y[self.train_idx]))

    def _warm_up(self) -> None:
        """One training step on a throw-away copy of the model, so that torch's one-time start-up
        costs (kernels, optimizer) are paid before ``ready`` and not inside round 1's timings. A
        node that holds no data never trains, so it skips the step (and its three transient copies
        of the model: the throw-away one, its gradients and its momentum)."""
        if self.train_idx is not None:
            _one_step(copy.deepcopy(self.model), self.data, lr=self.cfg.lr, batch_size=self.cfg.batch_size)
        self.evaluate()

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """(accuracy, mean loss) of the current model on the held-out test split."""
        self.model.eval()
        out = self.model(self.data.test_x)
        loss = float(nn.functional.cross_entropy(out, self.data.test_y))
        acc = float((out.argmax(dim=1) == self.data.test_y).float().mean())
        return acc, loss

    def state(self, into: TensorSet | None = None) -> TensorSet:
        """A copy of the model's weights (safe to send while the model trains on).

        `into`: tensors of the model's names and shapes to write the copy into (an earlier copy
        that nothing reads any more), returned; else the copy goes to fresh memory. Reuse matters:
        glibc maps a tensor above 32 MiB freshly on every allocation, so a fresh copy pays a page
        fault per 4 KiB, and freeing it later unmaps it on whichever thread drops it last.
        """
        live = self.model.state_dict()
        if into is None:
            return {k: v.detach().clone() for k, v in live.items()}
        if into.keys() != live.keys() or any(into[k].shape != v.shape for k, v in live.items()):
            raise ValueError("the tensors to copy into do not match the model")
        for k, v in live.items():
            into[k].copy_(v.detach())
        return into

    def load(self, tensors: TensorSet) -> None:
        self.model.load_state_dict(tensors)

    def load_file(self, path: str) -> None:
        """Load the weights from a safetensors file, checked against the template (names, shapes,
        dtypes, finite values); raises ValueError naming what is wrong. Nothing is unpickled."""
        from safetensors.torch import load_file

        got = load_file(path)
        if set(got) != set(self.template):
            raise ValueError(f"{path}: tensors {sorted(set(got) ^ set(self.template))[:4]} do not match the model")
        for name, t in got.items():
            ref = self.template[name]
            if t.shape != ref.shape or t.dtype != ref.dtype:
                raise ValueError(f"{path}: {name} is {t.dtype} {tuple(t.shape)}, the model has {ref.dtype} "
                                 f"{tuple(ref.shape)}")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"{path}: {name} has non-finite values")
        self.model.load_state_dict(got)

    def save_file(self, path: str) -> None:
        """Write the weights to a safetensors file atomically (a reader never sees half a file)."""
        import os

        from safetensors.torch import save_file

        tmp = f"{path}.tmp"
        save_file({k: v.detach().contiguous() for k, v in self.model.state_dict().items()}, tmp)
        os.replace(tmp, path)


#: glibc's mallopt parameters (malloc.h) and the values a site server sets.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8
_KEEP_FREED_BYTES = 512 * 2**20
#: Heaps (arenas) the threads of a process share. glibc gives each new thread a heap of its own, up to
#: 8 per core; a role's threads are new with every task, their freed blocks stay in heaps the next
#: task's threads may not use, and a local's server kept 5.6-9.8 copies of a 10.7 MB model after the
#: first task and 11.5-18.9 after the tenth (peaks up to 24.7 copies); with two, 3.3-5.2 after each,
#: with no creep (`benchmarks/bench_site_memory.py --hidden 1600 --tasks 10`; docs/long-runs.md,
#: "Two malloc heaps a server").
_ARENAS = 2
_TOP_PAD_BYTES = 64 * 2**20
_MMAP_ABOVE_BYTES = 32 * 2**20  # glibc's largest allowed threshold on 64-bit


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of returning it to the kernel.

    Each round allocates and frees the same large buffers (chunk payloads of about 1 MB, model
    copies); by default glibc hands such blocks back to the kernel, and every reuse then pays a page
    fault per 4 KiB (measured: a copy into fresh memory costs about 9 times one into warm memory),
    on both the transfer's and the training's critical path. The price is that a process keeps its
    peak heap, so its threads share `_ARENAS` heaps, where a later task's threads find the blocks an
    earlier task's freed. False where the C library is not glibc (nothing changed).
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, _MMAP_ABOVE_BYTES), (_M_TRIM_THRESHOLD, _KEEP_FREED_BYTES), (_M_TOP_PAD, _TOP_PAD_BYTES),
        (_M_ARENA_MAX, _ARENAS)))


#: How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). A role's
#: socket threads wait for it after every recv/send; at 5 ms a reader or sender behind the round loop
#: idles while the link could carry megabytes.
GIL_SWITCH_S = 0.0002


def tune_process() -> None:
    """Set a worker process up for moving models: freed memory kept (`keep_freed_memory`), and a
    short GIL switch interval (`GIL_SWITCH_S`)."""
    keep_freed_memory()
    sys.setswitchinterval(GIL_SWITCH_S)


def warm_process() -> None:
    """Pay a process's one-time costs (the dataset library, torch's first forward and backward
    pass) once, so that a site server's first role starts as fast as its later ones."""
    data = _dataset("digits", 0, "{}")
    _one_step(build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes), data,
              lr=0.1, batch_size=32)


def _one_step(model: nn.Module, data: Dataset, *, lr: float, batch_size: int) -> None:
    """One SGD step (the training's optimizer) of `model` on the first test batch (warm-up only)."""
    model.train()
    opt = SGD(model.parameters(), lr=lr, momentum=0.9)
    nn.functional.cross_entropy(model(data.test_x[:batch_size]), data.test_y[:batch_size]).backward()
    opt.step()
