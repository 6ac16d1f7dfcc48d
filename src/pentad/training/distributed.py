"""Processes: the launcher's environment, the process group, and the few collectives pentad uses.

``torchrun`` (and the ``deepspeed`` launcher) start one process per device and tell each its
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. :func:`connect`
reads them, picks the device (``cuda:LOCAL_RANK`` on GPUs) and the backend (nccl on GPUs, gloo on
CPU) and joins the process group with ``train.dist_timeout``. Without a launcher the run is one
process and nothing is initialised.

Besides the training backend every run with more than one process has a gloo *control* group for
small host-side agreements (stop requests, timed saves, config fingerprints), so those never touch
the GPU stream. When a collective fails because another rank died, :func:`describe_failure` names
the rank(s) that are gone, from what each rank recorded in the launcher's store at start.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch

from pentad.errors import UserError

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched(environ: dict[str, str] | None = None) -> bool:
    """Whether this process was started by torchrun / the deepspeed launcher."""
    environ = os.environ if environ is None else environ
    return all(k in environ for k in ("RANK", "WORLD_SIZE"))


@dataclass
class Dist:
    """Where this process stands: rank, world size, device, and the collectives of the run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None      # None: no process group (one process, no launcher)
    launched: bool = False
    control: Any = None             # the gloo group for host-side agreements

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.backend is not None

    def error(self, message: str) -> UserError:
        """A UserError that every rank raises alike: only the main rank prints it (``echo``)."""
        error = UserError(message)
        error.echo = not self.is_main
        return error

    # -------------------------------------------------------------- collectives (no-ops alone)
    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier(group=self.control)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place over the training backend (the tensor stays on its device); returns it."""
        if self.active and self.world_size > 1:
            reduce_op = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX}[op]
            torch.distributed.all_reduce(tensor, op=reduce_op)
        return tensor

    def agree_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks of a few host numbers (control group)."""
        if not (self.active and self.world_size > 1):
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=self.control)
        return tensor.tolist()

    def broadcast_object(self, obj: Any) -> Any:
        """The main rank's ``obj`` on every rank."""
        if not (self.active and self.world_size > 1):
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not (self.active and self.world_size > 1):
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj, group=self.control)
        return out

    def check_same(self, what: str, value: Any) -> None:
        """Raise a UserError on every rank unless ``value`` (JSON-able) is the same on all ranks."""
        digest = hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
        digests = self.gather_objects(digest)
        if len(set(digests)) > 1:
            groups: dict[str, list[int]] = {}
            for rank, d in enumerate(digests):
                groups.setdefault(d, []).append(rank)
            listing = "; ".join(f"ranks {', '.join(map(str, r))}" for r in groups.values())
            raise self.error(f"the {what} differs between ranks ({listing} agree among themselves): every process "
                            "of a run must be started with the same config, overrides and files, or the ranks "
                            "would silently train different things")

    def close(self) -> None:
        if self.active and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        self.backend = None


def _int_env(environ: dict[str, str], key: str) -> int:
    value = environ.get(key, "")
    try:
        return int(value)
    except ValueError:
        raise UserError(f"environment variable {key}={value!r} is not an integer (it is set by the launcher: "
                        "torchrun or deepspeed)") from None


def require_launcher(strategy: str, environ: dict[str, str] | None = None) -> None:
    """UserError unless this process was started by a launcher (``strategy`` cannot run as a plain process)."""
    if not launched(dict(os.environ if environ is None else environ)):
        raise UserError(
            f"train.strategy={strategy} runs under a launcher, which starts the processes and tells each its "
            "rank: `torchrun --nproc_per_node=N -m pentad pretrain ...` (N processes on this machine; N=1 "
            "is fine), or the deepspeed launcher. A plain `pentad pretrain` is one process: use "
            "train.strategy=single there")


def connect(strategy: str, device_choice: str, backend_choice: str = "auto", timeout_s: float = 600.0,
            needs_launcher: bool = False, environ: dict[str, str] | None = None) -> Dist:
    """Read the launcher's environment, pick the device and backend, join the process group.

    ``needs_launcher``: the strategy cannot run as a plain process (fsdp, deepspeed).
    """
    environ = dict(os.environ if environ is None else environ)
    if not launched(environ):
        if needs_launcher:
            require_launcher(strategy, environ)
        device = pick_device(device_choice, 0)
        _check_backend(backend_choice, device)
        return Dist(device=device)
    rank, world = _int_env(environ, "RANK"), _int_env(environ, "WORLD_SIZE")
    local_rank = _int_env(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else rank
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in environ]
    if missing:
        raise UserError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} not: start the run with torchrun "
                        "(or the deepspeed launcher), which sets all of them")
    if strategy == "single" and world > 1:
        raise UserError(f"train.strategy=single but the launcher started {world} processes: use train.strategy=ddp "
                        "(or fsdp, deepspeed) to train one model on all of them, or start one process")
    device = pick_device(device_choice, local_rank)
    backend = _check_backend(backend_choice, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s),
                                         device_id=device if device.type == "cuda" else None)
    control = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s)) \
        if backend != "gloo" else None
    dist = Dist(rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend,
                launched=True, control=control)
    _register(dist)
    return dist


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    """``train.device`` (auto, cpu, cuda) for the process with this local rank: ``cuda:LOCAL_RANK``
    when a GPU is chosen or available, else the CPU."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise UserError("train.device=cuda but no CUDA device is available; use train.device=auto (or cpu)")
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise UserError(f"local rank {local_rank} has no GPU: this machine has {count}; start at most {count} "
                            "processes per machine (torchrun --nproc_per_node)")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _check_backend(choice: str, device: torch.device) -> str:
    if choice == "nccl" and device.type != "cuda":
        raise UserError("train.dist_backend=nccl needs GPUs, and this run is on the CPU (no CUDA device, or "
                        "train.device=cpu): use train.dist_backend=auto, which picks gloo on CPU")
    if choice == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    return choice


# -------------------------------------------------------------------- failure diagnosis
_STORE_PREFIX = "pentad/rank/"


def _register(dist: Dist) -> None:
    """Record (host, pid) of this rank in the launcher's store, for :func:`describe_failure`."""
    try:
        store = torch.distributed.distributed_c10d._get_default_store()  # noqa: SLF001
        store.set(f"{_STORE_PREFIX}{dist.rank}", json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    except Exception:  # noqa: BLE001 - diagnosis only; never fail a run over it
        pass


def mark_failed(dist: Dist, message: str) -> None:
    """Record in the store that this rank is failing and why (read by the other ranks)."""
    if not dist.active:
        return
    try:
        store = torch.distributed.distributed_c10d._get_default_store()  # noqa: SLF001
        store.set(f"pentad/failed/{dist.rank}", message[:500])
    except Exception:  # noqa: BLE001
        pass


def describe_failure(dist: Dist) -> str:
    """Which other ranks are known to have failed or died: what they recorded in the store, or,
    for ranks on this host, whether their process is gone."""
    try:
        store = torch.distributed.distributed_c10d._get_default_store()  # noqa: SLF001
    except Exception:  # noqa: BLE001
        return "another rank stopped"
    host = socket.gethostname()
    found = []
    for rank in range(dist.world_size):
        if rank == dist.rank:
            continue
        try:  # check(): no waiting (wait() would log a socket timeout per key)
            if store.check([f"pentad/failed/{rank}"]):
                found.append(f"rank {rank} failed: {store.get(f'pentad/failed/{rank}').decode()}")
                continue
            if not store.check([f"{_STORE_PREFIX}{rank}"]):
                continue
            where = json.loads(store.get(f"{_STORE_PREFIX}{rank}").decode())
        except Exception:  # noqa: BLE001 - the store is gone too
            continue
        if where.get("host") == host and not _alive(int(where["pid"])):
            found.append(f"rank {rank} (pid {where['pid']}) is gone: killed or crashed")
    return "; ".join(found) if found else "another rank stopped or is unreachable (the launcher's summary names it)"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its launcher, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
