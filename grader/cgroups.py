"""One control group per grading worker: a cap on the memory and the processes of all its processes
together (``RLIMIT_AS`` is per process, so a worker starting children could otherwise take the
machine's memory), and one CPU share for all of them (24 spinning processes of one submission weigh
as much as a peer's single one, so no submission slows its peers).

Best effort, where the grader may create groups: cgroup v2 (``memory.max``, ``pids.max``,
``cpu.weight``) or v1's ``memory``, ``pids`` and ``cpu`` hierarchies (``cpu.shares``). Memory and
processes are required for a group; the CPU share is added where the ``cpu`` controller is available
(:attr:`Group.cpu` says whether it was). Elsewhere :func:`create` returns ``None`` and the
per-process limits of :mod:`grader.sandbox` are all there is (``result.json`` says which).
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

V2 = Path("/sys/fs/cgroup")
V1 = {"memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids")}
V1_CPU = Path("/sys/fs/cgroup/cpu")


@dataclass
class Group:
    """The folders of one worker's group (one per hierarchy) and how to join it."""

    kind: str                                   # "v2" | "v1"
    folders: list = field(default_factory=list)
    cpu: bool = False                           # whether the group holds a CPU share

    def join(self) -> None:
        """Move the calling process into the group (run in the child before exec)."""
        for folder in self.folders:
            with open(folder / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def remove(self) -> None:
        """Delete the group once its processes are gone (a killed process may take a moment)."""
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK)


def _v2_controllers() -> set[str]:
    """The controllers child groups of the v2 root get, or an empty set without a usable v2 root."""
    try:
        controllers = set((V2 / "cgroup.subtree_control").read_text().split())
    except OSError:
        return set()
    return controllers if (V2 / "cgroup.controllers").exists() and _writable(V2) else set()


def create(memory_bytes: int, processes: int, cpu_weight: int) -> Group | None:
    """A new group capping ``memory_bytes`` and ``processes``, with ``cpu_weight`` (cgroup v2's scale,
    1-10000, 100 being a plain process's share) where the cpu controller allows, or ``None`` where
    no group can be made."""
    name = f"gpulab-{uuid.uuid4().hex[:12]}"
    v2 = _v2_controllers()
    if {"memory", "pids"} <= v2:
        group, limits = Group("v2", [V2 / name]), {"memory.max": memory_bytes, "pids.max": processes}
        if "cpu" in v2:
            group.cpu, limits["cpu.weight"] = True, cpu_weight
    elif all(_writable(root) for root in V1.values()):
        group = Group("v1", [V1["memory"] / name, V1["pids"] / name])
        limits = {"memory.limit_in_bytes": memory_bytes, "pids.max": processes}
        if _writable(V1_CPU) and (V1_CPU / "cpu.shares").exists():
            # v1 counts a plain process as 1024 shares where v2 counts it as a weight of 100
            group.cpu, limits["cpu.shares"] = True, max(2, cpu_weight * 1024 // 100)
            group.folders.append(V1_CPU / name)
    else:
        return None
    try:
        for folder in group.folders:
            folder.mkdir()
        for file, value in limits.items():
            folder = next(f for f in group.folders if (f / file).exists())
            (folder / file).write_text(str(value))
    except (OSError, StopIteration):
        group.remove()
        return None
    return group
