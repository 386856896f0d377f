"""What the device has free for training: the binding limit of the process (cgroup, ``RLIMIT_AS``, available
memory, or the CUDA device's free memory), measured after the interpreter and libraries are loaded."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class MemoryHeadroom:
    """Bytes the device can still give this process, and which limit sets it (``limits``: every limit found)."""

    device: str
    bytes: int
    binding: str
    limits: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "free_bytes": self.bytes, "binding": self.binding, "limits": dict(self.limits)}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def _proc_status() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _cgroup_headroom() -> int | None:
    """``memory.max - memory.current`` of this process's cgroup (v2), or v1's limit minus usage; None if unlimited."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            for folder in (base, Path("/sys/fs/cgroup")):
                try:
                    limit = (folder / "memory.max").read_text().strip()
                    current = int((folder / "memory.current").read_text())
                except (OSError, ValueError):
                    continue
                return None if limit == "max" else max(int(limit) - current, 0)
        elif "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            try:
                limit = int((folder / "memory.limit_in_bytes").read_text())
                usage = int((folder / "memory.usage_in_bytes").read_text())
            except (OSError, ValueError):
                return None
            return None if limit >= 1 << 60 else max(limit - usage, 0)
    return None


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_headroom(device: str = "cpu") -> MemoryHeadroom:
    """What ``device`` can still give this process: for the CPU the least of the available RAM, the address-space
    and data-segment limits (RLIMIT_AS, RLIMIT_DATA, minus what the process already maps) and the cgroup's limit;
    for CUDA the free memory ``torch.cuda.mem_get_info`` reports."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        free, _total = torch.cuda.mem_get_info(index)
        return MemoryHeadroom(device, int(free), "torch.cuda.mem_get_info", {"cuda_free": int(free)})
    limits: dict[str, int] = {}
    available = _mem_available()
    if available is not None:
        limits["MemAvailable"] = available
    status = _proc_status()
    for name, rlimit, used in (("RLIMIT_AS", resource.RLIMIT_AS, status.get("VmSize", 0)),
                               ("RLIMIT_DATA", resource.RLIMIT_DATA, status.get("VmData", 0))):
        soft, _hard = resource.getrlimit(rlimit)
        if soft != resource.RLIM_INFINITY:
            limits[name] = max(int(soft) - used, 0)
    cgroup = _cgroup_headroom()
    if cgroup is not None:
        limits["cgroup memory.max"] = cgroup
    if not limits:
        return MemoryHeadroom(device, 1 << 62, "none found", {})
    binding = min(limits, key=lambda k: limits[k])
    return MemoryHeadroom(device, limits[binding], binding, limits)

