"""A warm process that forks the ranks of :func:`gpulab.dist.launch` (lessons 11 to 13).

Starting a rank as a fresh ``python`` costs an interpreter and ``import torch`` (about 1.5 s of CPU here),
paid twice per two-rank launch: a lab that launches ranks a hundred times spends minutes importing. The
fork server imports torch once, then forks one child per rank on request; each child starts at once with
torch already imported and runs the same :func:`gpulab.dist_worker.main` a fresh process would.

What a rank sees is what a fresh process gives it: the launcher's environment and working directory
of *this* launch, stdout and stderr in its log file, fresh Python and NumPy random states, and SIGKILL
when its parent (the server) dies, as the server does when its launcher dies. The server stays in the
launcher's process group, so killing that group (what the grader does to a timed-out worker) stops every
rank too.

Why not ``multiprocessing``'s forkserver: its children re-import the launcher's ``__main__`` (pytest,
ipykernel, the grader's worker) and see the server's environment from when it started, not the launch's.

Protocol: one JSON request per line on the server's stdin
(``{"argv": [...], "env": {...}, "cwd": ..., "log": ..., "exit": ...}``), one line back with the child's
pid; when the child ends, the server writes its exit status (negative: killed by that signal) to the
request's ``exit`` file. Linux only (``os.fork``); elsewhere :mod:`gpulab.dist` starts fresh processes.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# Variables read while torch is imported: a server started under other values would hand ranks a torch
# configured differently from the one a fresh process would get, so a change starts a new server.
_IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "CUDA", "NCCL", "GLOO", "TRITON", "LD_",
                         "PYTHON")

_ANSWER_TIMEOUT_S = 120.0  # a first answer waits for the server's imports, slow on a loaded machine

_server: subprocess.Popen | None = None
_lock = threading.Lock()
_server_key: tuple | None = None


def available() -> bool:
    """Whether ranks can be forked here (Linux, and not switched off with ``GPULAB_FORKSERVER=0``)."""
    return hasattr(os, "fork") and sys.platform == "linux" and os.environ.get("GPULAB_FORKSERVER", "1") != "0"


class ForkedRank:
    """One forked rank, with the part of ``subprocess.Popen``'s interface :mod:`gpulab.dist` uses."""

    def __init__(self, pid: int, exit_file: Path):
        self.pid, self._exit_file, self.returncode = pid, exit_file, None

    def poll(self) -> int | None:
        if self.returncode is None and self._exit_file.exists():
            text = self._exit_file.read_text().strip()
            if text:
                self.returncode = int(text)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float = 10.0) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.returncode


def fork_rank(argv: list, env: dict, log: Path, exit_file: Path) -> ForkedRank:
    """Start ``python -m gpulab.dist_worker *argv`` as a child of the warm server; return its handle.
    Raises ``OSError`` if the server cannot start or does not answer (the caller then starts a fresh
    process)."""
    request = {"argv": [str(a) for a in argv], "env": env, "cwd": os.getcwd(), "log": str(log),
               "exit": str(exit_file)}
    with _lock:  # one request and its answer at a time: launches may come from several threads
        server = _ensure_server(env)
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], _ANSWER_TIMEOUT_S)
        line = server.stdout.readline() if ready else ""
        if not line:
            _stop(server)
            raise OSError("the rank fork server did not answer")
    return ForkedRank(int(line), exit_file)


def _ensure_server(env: dict) -> subprocess.Popen:
    global _server, _server_key
    torch_env = tuple(sorted((k, v) for k, v in env.items() if k.startswith(_IMPORT_TIME_PREFIXES)))
    key = (os.getpid(), sys.executable, torch_env)
    if _server is not None and _server_key[0] != os.getpid():
        _server = None  # this launcher was forked: the server (and its pipes) belong to the parent
    if _server is not None and (_server.poll() is not None or key != _server_key):
        _stop(_server)
        _server = None
    if _server is None:
        _server = subprocess.Popen([sys.executable, "-m", "gpulab.forkserver"], env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        _server_key = key
    return _server


def _stop(server: subprocess.Popen) -> None:
    try:
        server.kill()
        server.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        pass


# --- the server side ---------------------------------------------------------------------------------

def _child(request: dict) -> None:
    """In the forked child: become the rank a fresh process would have been, run it, never return."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _fresh_random_states()
        sys.argv = ["-m", *request["argv"]]
        from gpulab import dist_worker

        work, rank, world, backend, timeout_s = request["argv"][1:]
        code = dist_worker.main(work, int(rank), int(world), backend, float(timeout_s))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _fresh_random_states() -> None:
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _reap(exits: dict) -> None:
    while exits:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        exit_file = exits.pop(pid, None)
        if exit_file:
            Path(exit_file).write_text(str(code))


def assert_cuda_free() -> None:
    """Refuse to fork once CUDA is initialised in this process: a forked child cannot use its parent's CUDA
    context, so every rank would fail at its first CUDA call (NCCL included). Importing torch does not
    initialise CUDA; calling into it (a tensor on the GPU, ``torch.cuda.init()``) would. The server then
    exits without forking and the launcher starts each rank as a fresh process instead."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("the rank fork server initialised CUDA before forking: forked ranks could not use the "
                           "GPU. Keep CUDA calls out of gpulab.forkserver.serve, or set GPULAB_FORKSERVER=0.")


def serve() -> None:
    from gpulab.dist_worker import die_with_parent

    die_with_parent()
    # Imported once here, for every rank: torch, and the submodules rank functions import. The first
    # optimizer a process builds imports TorchDynamo (and with it sympy): seconds per rank otherwise.
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.optim  # noqa: F401
    import torch.profiler  # noqa: F401
    import torch.utils._python_dispatch  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401

    assert_cuda_free()
    exits: dict = {}
    stdin = sys.stdin
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.02)
        _reap(exits)
        if not ready:
            continue
        line = stdin.readline()
        if not line:
            return  # the launcher closed the pipe: it is gone
        request = json.loads(line)
        sys.stdout.flush()
        assert_cuda_free()
        pid = os.fork()
        if pid == 0:
            _child(request)
        exits[pid] = request["exit"]
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
