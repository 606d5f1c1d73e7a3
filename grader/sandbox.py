"""The box learner code runs in when it is graded: bubblewrap, a minimal file system, resource limits.

Every grading worker and the rebuilt-notebook run start through :func:`wrap`. With bubblewrap
(Debian package ``bubblewrap``) the process sees:

- read-only: the system libraries, the Python interpreter and the venv, ``gpulab/`` and the few
  run-side grader modules (:data:`RUN_SIDE`); never ``solutions/``, the checks' references or the
  judge's code;
- writable: a size-capped tmpfs at ``/tmp`` (its working directory and ``$HOME``) and a private,
  size-capped ``/dev/shm``, nothing else;
- devices: bubblewrap's minimal ``/dev`` (null, zero, random, tty ...), plus on CUDA only the NVIDIA
  device nodes (``/dev/nvidia*``, ``/dev/nvidia-caps``), never the host's whole ``/dev``;
- no network beyond its own loopback, its own PID namespace (every process it starts dies with it:
  ``--die-with-parent``, and the namespace's init reaps the rest), a new session (no terminal),
  and an environment holding only :func:`environment`'s variables (``--clearenv``); bubblewrap itself,
  the box's PID 1, starts with :data:`BWRAP_ENV` only, so ``/proc/1/environ`` holds nothing of the judge's;
- resource limits per process (address space on CPU, file size, open files, CPU time) and, when
  the grader runs as root, a user id of its own, so the process-count limit counts only this
  worker's processes and it holds no capabilities;
- a CPU share: a control group's ``cpu.weight``/``cpu.shares`` per worker where the grader can make
  one (:mod:`grader.cgroups`), else a lower priority (``nice``) than the judge's.

Without bubblewrap (or where user namespaces are forbidden) the worker runs with the resource
limits only and :func:`isolation` says so loudly; ``result.json`` records which mode was used.
"""
from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, NamedTuple

from gpulab.paths import ROOT
from grader import cgroups

# The grader modules a worker imports (the judge's modules and the checks stay outside).
RUN_SIDE = ("grader/__init__.py", "grader/worker.py", "grader/notebooks.py", "grader/exercise.py", "grader/runs")
TMP_BYTES = 1 << 30          # the sandbox's whole writable space
FILE_BYTES = 256 << 20       # the largest file learner code may write
SHM_BYTES = 1 << 30          # the box's private /dev/shm (torch shares tensors between processes there)
ADDRESS_SPACE = 8 << 30      # per process, CPU only (CUDA reserves far more virtual memory)
WORKER_MEMORY = 8 << 30      # all of one worker's processes together, where a control group can be made
OPEN_FILES = 1024
PROCESSES = 256              # per worker (its own user id when the grader is root)
CPU_WEIGHT = 100             # each worker's group weighs as much as one plain process (cgroup v2's scale)
NICE = 10                    # without a CPU group: workers yield to the judge and the rest of the machine
# bubblewrap's own environment: it is PID 1 in the box, and /proc/1/environ is readable there when
# the grader runs unprivileged. The worker's environment is set with --clearenv/--setenv.
BWRAP_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

_uid_lock = threading.Lock()
_uid_next = [0]


def _bwrap() -> str | None:
    return shutil.which("bwrap")


def _probe(argv: list[str]) -> str:
    """'' when ``argv`` runs, else why not."""
    try:
        done = subprocess.run(argv + ["/bin/true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "" if done.returncode == 0 else done.stderr.decode(errors="replace").strip()[:300]


@functools.lru_cache(maxsize=None)
def isolation() -> dict:
    """``{"mode": "bwrap" | "none", "detail": ...}``: what :func:`wrap` will use on this machine."""
    if os.environ.get("GPULAB_SANDBOX") == "off":
        return {"mode": "none", "detail": "disabled with GPULAB_SANDBOX=off; " + _unboxed_reach()}
    exe = _bwrap()
    if exe is None:
        return {"mode": "none", "detail": "bubblewrap is not installed (apt-get install bubblewrap); "
                                          + _unboxed_reach()}
    why = _probe(_namespace_args(exe) + ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"])
    if why:
        return {"mode": "none", "detail": f"bubblewrap cannot create namespaces here ({why}); " + _unboxed_reach()}
    return {"mode": "bwrap", "detail": "bubblewrap: read-only system and venv, no solutions or judge code, "
                                       "tmpfs /tmp, no network, own PID namespace, cleared environment"
                                       + (", own user id" if os.geteuid() == 0 else "")}


def _unboxed_reach() -> str:
    """What learner code can reach without bubblewrap, for :func:`isolation`'s detail."""
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ("learner code runs with resource limits only, as an unprivileged user id of its own: it can read "
                "every file others may read (make solutions/, grader/checks/ and grader/kit/ readable by root only "
                "to keep them out of its reach).")
    return "learner code runs with resource limits only and can read this machine's files."


def warn_if_weak(stream=None) -> None:
    """Say once, on stderr, when grading runs without the sandbox."""
    iso = isolation()
    if iso["mode"] != "bwrap":
        print(f"grader: WARNING: weak isolation: {iso['detail']}", file=stream or sys.stderr)


def _namespace_args(exe: str) -> list[str]:
    base = [exe, "--die-with-parent", "--new-session", "--clearenv"]
    if os.geteuid() == 0:  # no user namespace: the worker gets a real user id of its own below
        return base + ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    return base + ["--unshare-all"]


def _python_roots() -> list[Path]:
    """The interpreter's installation and the venv (both read-only in the box)."""
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).absolute()}
    return sorted(roots)


def _mkdirs(path: Path, made: set) -> list[str]:
    """bwrap copies a missing parent's mode (``/root`` is 0700): create each parent 0755 first."""
    args = []
    for parent in reversed(path.parents):
        if str(parent) != "/" and parent not in made:
            made.add(parent)
            args += ["--perms", "0755", "--dir", str(parent)]
    return args


def environment(device: str) -> dict[str, str]:
    """The only variables a worker sees (the instructor's environment stays outside)."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
           "USER": "learner", "LOGNAME": "learner", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
           "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
           "TRITON_CACHE_DIR": "/tmp/home/.triton", "GPULAB_GRADING": "1", "GPULAB_DEVICE": device,
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    # The project is found through PYTHONPATH, inside the box (ROOT's run-side folders are bound at
    # the same paths) and out of it: a checkout that was never pip-installed (the offline GPU
    # machines) grades like an installed one.
    env["PYTHONPATH"] = str(ROOT)
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
        if device == "cuda" and name in os.environ:
            env[name] = os.environ[name]
    return env


def _next_uid() -> int:
    with _uid_lock:
        _uid_next[0] += 1
        return 200_000 + (os.getpid() % 20_000) * 50 + _uid_next[0] % 50


def _limits(device: str, cpu_seconds: float, uid_of_its_own: bool, group: cgroups.Group | None):
    """A ``preexec_fn`` setting the worker's resource limits (inherited by everything it starts)."""
    nproc = PROCESSES if uid_of_its_own else PROCESSES + _processes_of_this_user()

    def apply() -> None:
        if group is not None:
            group.join()
        if group is None or not group.cpu:
            os.nice(NICE)
        if device != "cuda":
            resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        cpu = int(cpu_seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        # Root is exempt from this limit; the worker's own user id (set after bwrap) is not.
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    return apply


def _processes_of_this_user() -> int:
    uid = str(os.getuid())
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if f"Uid:\t{uid}\t" in status.read_text():
                count += 1
        except OSError:
            pass
    return count


@functools.lru_cache(maxsize=None)
def _group_kind() -> str | None:
    """"v2" or "v1" where this grader can make a control group per worker, else None."""
    probe = _new_group()
    if probe is None:
        return None
    probe.remove()
    return probe.kind + ("+cpu" if probe.cpu else "")


def _new_group() -> cgroups.Group | None:
    return cgroups.create(WORKER_MEMORY, PROCESSES, CPU_WEIGHT)


def cpu_share() -> str:
    """How a worker's CPU share is enforced here, for ``result.json`` and the README."""
    kind = _group_kind() or ""
    if kind.endswith("+cpu"):
        return f"control group cpu weight {CPU_WEIGHT} (cgroup {kind.split('+')[0]}) per worker"
    return f"nice {NICE} per worker (no cpu control group here); CPU time capped per process"


def limits_summary(device: str) -> dict:
    """The limits :func:`wrap` sets, for ``result.json``."""
    return {"address_space_bytes": None if device == "cuda" else ADDRESS_SPACE,
            "worker_memory_bytes": WORKER_MEMORY if _group_kind() else None,
            "control_group": (_group_kind() or "").split("+")[0] or None, "cpu_share": cpu_share(),
            "file_bytes": FILE_BYTES,
            "tmp_bytes": TMP_BYTES if isolation()["mode"] == "bwrap" else None,
            "processes": PROCESSES, "open_files": OPEN_FILES}


class Launch(NamedTuple):
    """How to start one boxed process: ``Popen(command, preexec_fn=preexec, env=env, cwd=cwd)``, then
    ``cleanup()`` once it has ended (it removes the worker's control group)."""

    command: list
    preexec: Callable[[], None]
    env: dict | None
    cwd: Path | None
    cleanup: Callable[[], None]


def wrap(argv: list[str], *, device: str, cpu_seconds: float, cwd_outside: Path | None = None) -> Launch:
    """A :class:`Launch` of ``argv`` (a ``python`` command line) in the box.

    ``cwd_outside`` is only used without bubblewrap (the worker's working directory on this
    machine); in the box the working directory is ``/tmp/work`` on the tmpfs.
    """
    env = environment(device)
    exe = _bwrap()
    group = _new_group() if _group_kind() else None
    done = group.remove if group is not None else (lambda: None)
    if isolation()["mode"] != "bwrap" or exe is None:
        return _unboxed(argv, env, device, cpu_seconds, cwd_outside, group, done)
    # The tmpfs first: binds that follow may lie under /tmp (a project cloned there) and stay visible.
    args = _namespace_args(exe) + ["--size", str(TMP_BYTES), "--perms", "1777", "--tmpfs", "/tmp"]
    for top in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if Path(top).exists():
            args += ["--ro-bind", top, top]
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime"):
        if Path("/etc", name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    made: set = set()
    for root in _python_roots():
        args += _mkdirs(root, made) + ["--ro-bind", str(root), str(root)]
    args += _mkdirs(ROOT / "gpulab", made) + ["--ro-bind", str(ROOT / "gpulab"), str(ROOT / "gpulab")]
    args += ["--perms", "0755", "--dir", str(ROOT / "grader")]
    for rel in RUN_SIDE:
        args += ["--ro-bind", str(ROOT / rel), str(ROOT / rel)]
    args += ["--proc", "/proc"] + _devices(device)
    args += ["--dir", "/tmp/home", "--dir", "/tmp/work", "--chdir", "/tmp/work"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    uid_of_its_own = os.geteuid() == 0
    if uid_of_its_own:  # a real, unprivileged user id: no capabilities, its own process count
        uid = _next_uid()
        args += ["--chmod", "1777", "/tmp", "--chmod", "0777", "/tmp/home", "--chmod", "0777", "/tmp/work",
                 *_drop_to(uid)]
    return Launch(args + argv, _limits(device, cpu_seconds, uid_of_its_own, group), dict(BWRAP_ENV), None, done)


def _drop_to(uid: int) -> list[str]:
    """``setpriv`` arguments that run the rest of the command line as ``uid``, with no capabilities."""
    return [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def _unboxed(argv, env, device, cpu_seconds, cwd_outside, group, done) -> Launch:
    """Without bubblewrap: resource limits only. A root grader (a container, Gradescope's) still drops the
    worker to an unprivileged user id of its own, so files only root may read (``solutions/``, the
    checks, where the instructor made them so) stay out of its reach and it holds no capabilities."""
    home = str(cwd_outside or "/tmp")
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return Launch(argv, _limits(device, cpu_seconds, False, group), {**env, "HOME": home}, cwd_outside, done)
    if cwd_outside is not None:
        os.chmod(cwd_outside, 0o777)  # the worker's own scratch folder, made for this one run
    return Launch(_drop_to(_next_uid()) + argv, _limits(device, cpu_seconds, True, group), {**env, "HOME": home},
                  cwd_outside, done)


def _nvidia_nodes() -> list[str]:
    """The NVIDIA driver's device nodes of this machine (``/dev/nvidia0``, ``/dev/nvidiactl``,
    ``/dev/nvidia-uvm`` ..., and the ``/dev/nvidia-caps`` folder where MIG is set up)."""
    return sorted(str(p) for p in Path("/dev").glob("nvidia*"))


def _devices(device: str) -> list[str]:
    """bwrap arguments for ``/dev``: bubblewrap's minimal one, the NVIDIA nodes on CUDA (and the driver's
    view of the PCI bus in ``/sys``), then a private, size-capped ``/dev/shm``."""
    args = ["--dev", "/dev"]
    if device == "cuda":
        for node in _nvidia_nodes():
            args += ["--dev-bind", node, node]
        args += ["--ro-bind", "/sys", "/sys"]
    return args + ["--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm"]


def stop(proc) -> None:
    """End a boxed process and everything it started (the box's PID namespace dies with bwrap; without
    bwrap, the process group it leads)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    proc.wait()
