"""One control group per grading worker: a cap on the memory and the processes of all its processes
together (``RLIMIT_AS`` is per process, so a worker starting children could otherwise take the
machine's memory).

Best effort, where the grader may create groups: cgroup v2 (``memory.max``, ``pids.max``) or v1's
``memory`` and ``pids`` hierarchies. Elsewhere :func:`create` returns ``None`` and the per-process
limits of :mod:`grader.sandbox` are all there is (``result.json`` says which).
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

V2 = Path("/sys/fs/cgroup")
V1 = {"memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids")}


@dataclass
class Group:
    """The folders of one worker's group (one per hierarchy) and how to join it."""

    kind: str                                   # "v2" | "v1"
    folders: list = field(default_factory=list)

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


def _v2_ready() -> bool:
    try:
        controllers = (V2 / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
    return (V2 / "cgroup.controllers").exists() and {"memory", "pids"} <= set(controllers) and _writable(V2)


def create(memory_bytes: int, processes: int) -> Group | None:
    """A new group capping ``memory_bytes`` and ``processes``, or ``None`` where none can be made."""
    name = f"gpulab-{uuid.uuid4().hex[:12]}"
    if _v2_ready():
        group, limits = Group("v2", [V2 / name]), {"memory.max": memory_bytes, "pids.max": processes}
    elif all(_writable(root) for root in V1.values()):
        group = Group("v1", [V1["memory"] / name, V1["pids"] / name])
        limits = {"memory.limit_in_bytes": memory_bytes, "pids.max": processes}
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
