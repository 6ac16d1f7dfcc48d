"""Memory estimates checked before anything large is allocated.

A model of absurd size (a typo in ``hidden_size``, 100,000 experts, ``--num-beams 100000``) would
otherwise be allocated first and fail later: killed by the kernel once it has taken all of RAM, a
traceback deep in torch, or a machine swapping without progress. Callers build the model on the
meta device (no memory, milliseconds), count what it will need with :func:`tensor_bytes` (plus
gradients and optimizer state when training, the key/value cache when generating) and call
:func:`require`, which compares the estimate with the memory the device has available now
(:func:`available_memory`) and raises a :class:`~pentad.errors.UserError` stating both when it does
not fit. The estimate is a lower bound (activations are not counted), so a run it refuses would not
have fit in the memory there is now; one it lets through may still need more.
``PENTAD_SKIP_MEMORY_CHECK=1`` turns the check off for users who know better (memory that frees up
later, swap, offloading the check does not model).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from pentad.errors import UserError

SKIP_ENV = "PENTAD_SKIP_MEMORY_CHECK"


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units up to EiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


def tensor_bytes(module: nn.Module) -> tuple[int, int]:
    """(bytes of the parameters and buffers, bytes of the parameters that train) of ``module``, shared
    (tied) tensors once. Works on the meta device: only shapes and dtypes are read."""
    total = trainable = 0
    seen: set[int] = set()
    for param in module.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        size = param.numel() * param.element_size()
        total += size
        if param.requires_grad:
            trainable += size
    for buffer in module.buffers():
        if id(buffer) not in seen:
            seen.add(id(buffer))
            total += buffer.numel() * buffer.element_size()
    return total, trainable


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _reclaimable(directory: Path, key: str) -> int:
    """The inactive page cache a cgroup's usage counts (``key`` of its ``memory.stat``): the kernel drops
    it before refusing memory, so it is room (as container runtimes count a working set)."""
    try:
        for line in (directory / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def _cgroup_room(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What the process's cgroups (a container's or a job's memory limit, on its own group or one above)
    still allow, or None without a limit. cgroup v2 (``memory.max``) and v1 (``memory.limit_in_bytes``);
    inactive page cache counts as room (:func:`_reclaimable`)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one unified hierarchy
            base, limit_name, usage_name, cache = root, "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name, cache = (root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                                                   "total_inactive_file")
        else:
            continue
        group = base / path.strip("/")
        for directory in (group, *group.parents):
            limit, usage = _read_int(directory / limit_name), _read_int(directory / usage_name)
            if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes "no limit" as ~2^63
                rooms.append(max(0, limit - max(0, usage - _reclaimable(directory, cache))))
            if directory == base:
                break
    return min(rooms) if rooms else None


def _host_available() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else the physical memory (sysconf)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(device: str | torch.device | None = None) -> tuple[int | None, str]:
    """(bytes available now, where) on ``device`` (default: the CPU): the free memory of a CUDA device
    (``torch.cuda.mem_get_info``), else the host's available memory within its cgroup's limit. None
    when it cannot be measured (then nothing is refused)."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
        except (RuntimeError, AssertionError):
            return None, f"device {device}"
        return int(free), f"device {device} (of {format_bytes(total)})"
    host, room = _host_available(), _cgroup_room()
    if room is not None and (host is None or room < host):
        return room, "this machine (within its cgroup's memory limit)"
    return host, "this machine"


def skipped() -> bool:
    return os.environ.get(SKIP_ENV, "").strip().lower() not in ("", "0", "false", "no")


def require(need: int, what: str, breakdown: str, device: str | torch.device | None = None,
            hint: str = "") -> None:
    """A UserError when ``need`` bytes (at least: ``breakdown`` says of what) do not fit in the memory
    ``device`` has available now; ``what``: what would be allocated, ``hint``: how to make it smaller.
    Nothing is checked with ``PENTAD_SKIP_MEMORY_CHECK=1`` or where the memory cannot be measured."""
    if skipped():
        return
    available, where = available_memory(device)
    if available is None or need <= available:
        return
    raise UserError(f"not enough memory for {what}: it needs at least {format_bytes(need)} ({breakdown}), and "
                    f"{where} has {format_bytes(available)} available, so nothing was allocated. "
                    + (hint + ". " if hint else "")
                    + f"If you know it fits (memory freed later, swap), set {SKIP_ENV}=1 to skip this check")
