"""One rank of :func:`gpulab.dist.launch`: ``python -m gpulab.dist_worker WORK RANK WORLD BACKEND TIMEOUT``."""
from __future__ import annotations

import datetime
import json
import sys
import traceback
from pathlib import Path


def die_with_parent() -> None:
    """Linux: get SIGKILL when the launching process dies, so no rank outlives its launch."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's watchdog still stops the ranks


def rendezvous_store(work_dir: Path, rank: int, world_size: int, timeout_s: float):
    """The launch's ``TCPStore``: rank 0 opens it on a port the OS picks and writes the port to ``store.port``
    in the launch's folder; the other ranks read it there. No port is chosen before it is bound, so launches
    running at the same time (tests, a cohort's graders, a notebook beside them) never meet on one port."""
    import time

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    path = work_dir / "store.port"
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        (work_dir / "store.port.tmp").write_text(str(store.port))
        (work_dir / "store.port.tmp").replace(path)  # atomic: a reader sees the whole port or no file
        return store
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not open the launch's store within {timeout_s:g} s (timed out)")
        time.sleep(0.01)  # a poll interval: rank 0 is starting
    return dist.TCPStore("127.0.0.1", int(path.read_text()), world_size, is_master=False, timeout=timeout)


def main(work: str, rank: int, world_size: int, backend: str, timeout_s: float) -> int:
    die_with_parent()
    import cloudpickle
    import torch
    import torch.distributed as dist

    work_dir = Path(work)

    def fail() -> int:
        # Written before the process group goes down: peers fail right after, and the first error is the cause.
        exc = sys.exc_info()[1]
        (work_dir / f"rank{rank}.exc").write_text(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        (work_dir / f"rank{rank}.error").write_text(traceback.format_exc())
        return 1

    try:
        fn, args, kwargs = cloudpickle.loads((work_dir / "payload.pkl").read_bytes())
        if backend == "nccl":
            torch.cuda.set_device(rank)  # NCCL: exactly one rank per GPU
        dist.init_process_group(backend, store=rendezvous_store(work_dir, rank, world_size, timeout_s), rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    except BaseException:
        return fail()
    try:
        result = fn(rank, world_size, *args, **kwargs)
        (work_dir / f"rank{rank}.result").write_bytes(cloudpickle.dumps(result))
        code = 0
    except BaseException:
        code = fail()
    try:
        dist.destroy_process_group()
    except BaseException:
        pass
    return code

if __name__ == "__main__":
    import os

    code = main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
    sys.stdout.flush()
    os._exit(code)
