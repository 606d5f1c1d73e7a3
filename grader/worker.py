"""The learner-side process of ``grade``: ``python -m grader.worker``, started in the sandbox.

It reads its job from stdin (sent by the judge: the lab's locked setup, the learner's answer cells,
each exercise's run function by reference into ``grader/runs/``, the cases' inputs and a seed per
exercise), executes the setup and each answer cell on its own (one broken cell costs only its
exercise), then runs every case of every exercise and sends the plain observations back. Python's,
NumPy's and torch's random generators are seeded with the judge's seed before the setup, before each
answer cell and before each exercise's cases, so what an answer draws does not depend on what ran
before it in this process. It never sees a reference, an expected value or the judge's code.
Everything goes back over one pipe (file descriptor :data:`CHANNEL_FD`) as frames
``kind (1 byte) | length (8 bytes) | payload``:

- ``M`` a progress marker (``setup``, ``exec EID``, ``run EID``, ``done``), so when the process dies
  or hangs the judge knows which exercise did it;
- ``O`` the observations of one exercise: ``EID\\0`` then ``torch.save`` bytes;
- ``T`` learner output (print) captured since the last frame.

The judge accepts only the marker it expects next and one observation per exercise while that
exercise runs, so a forged frame earns nothing (see ``grader.grade``). Everything this process needs
is imported before the first line of learner code runs, and the import machinery is restored after
each answer cell, so import hooks planted by an answer do not reach the harness.
"""
from __future__ import annotations

import builtins
import io
import os
import struct
import sys

CHANNEL_FD = 3
OUTPUT_CAP = 64 * 1024  # characters of learner output kept; the rest is dropped
HEADER = struct.Struct(">cQ")


class CappedStream(io.TextIOBase):
    """A text stream keeping the first ``cap`` characters written to it (megabytes of print() cost nothing)."""

    def __init__(self, cap: int = OUTPUT_CAP) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.cap = cap
        self.dropped = 0
        self.sent = 0

    def write(self, s: str) -> int:
        s = str(s)
        room = self.cap - self.size
        if room > 0:
            self.parts.append(s[:room])
            self.size += min(len(s), room)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def getvalue(self) -> str:
        text = "".join(self.parts)
        return text + (f"\n[... {self.dropped} more characters of output dropped]" if self.dropped else "")

    def take_new(self) -> str:
        """What was written since the last call (for the judge's copy of the output)."""
        text = "".join(self.parts)
        new, self.sent = text[self.sent:], len(text)
        return new


def _channel(fd: int, nonce: bytes):
    """A ``send(kind, payload)`` bound to ``fd`` and ``os.write`` now, before learner code exists.

    Every payload starts with this worker's ``nonce``: frames a careless or spamming answer writes
    to the channel are ignored by the judge (a deliberate forger can still find the nonce in memory).
    """
    write, pack, prefix = os.write, HEADER.pack, nonce + b" "

    def send(kind: bytes, payload: bytes) -> None:
        payload = prefix + payload
        data = memoryview(pack(kind, len(payload)) + payload)
        while data:
            data = data[write(fd, data):]
    return send


def _import_state():
    return list(sys.meta_path), list(sys.path_hooks), list(sys.path), builtins.__import__


def _restore_imports(state) -> None:
    """Undo import hooks, and profile or trace hooks, an answer cell planted (the harness's own
    modules are already loaded)."""
    import threading

    meta_path, path_hooks, path, importer = state
    sys.meta_path[:] = meta_path
    sys.path_hooks[:] = path_hooks
    sys.path[:] = path
    sys.path_importer_cache.clear()
    builtins.__import__ = importer
    sys.setprofile(None)
    sys.settrace(None)
    threading.setprofile(None)
    threading.settrace(None)


def _seed(seed: int) -> None:
    """Seed every generator an answer may draw from without seeding it itself."""
    import random

    import numpy
    import torch

    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)  # every CUDA device too


def _observations_bytes(outcomes: list) -> bytes:
    import torch

    buf = io.BytesIO()
    try:
        torch.save(outcomes, buf)
    except Exception as exc:  # the learner returned something that cannot travel (a generator, a lock ...)
        buf = io.BytesIO()
        message = (f"the answer returned something that cannot be sent back ({type(exc).__name__}); "
                   "return the documented types (numbers, strings, tensors).")
        torch.save([{"status": "error", "message": message}] * len(outcomes), buf)
    return buf.getvalue()


def main() -> int:
    import pickle

    import numpy  # noqa: F401 - imported before learner code can shadow anything
    import torch  # noqa: F401

    import gpulab  # noqa: F401 - the run-side helpers the checks use, loaded now
    import gpulab.compare  # noqa: F401
    import gpulab.launches  # noqa: F401
    from grader.exercise import Case, RunSide, run_case
    from grader.notebooks import exec_source

    # From the judge, over a pipe: trusted. Unpickling imports each exercise's run side by name from
    # grader/runs/ (bound read-only in the box): the judge's modules are not here to import.
    job = pickle.loads(sys.stdin.buffer.read())
    send = _channel(CHANNEL_FD, job["nonce"].encode())
    runs = {eid: RunSide(entries, run) for eid, (entries, run) in job["runs"].items()}
    capture = CappedStream()
    sys.stdout = sys.stderr = capture
    os.environ.pop("GPULAB_STRICT", None)  # inline checks in answer cells must not raise here
    imports = _import_state()

    ns: dict = {"__name__": "__lab__"}
    seeds = job["seeds"]
    send(b"M", b"setup")
    _seed(seeds["setup"])
    exec_source(job["setup_source"], "<lab setup>", ns)
    _restore_imports(imports)
    cell_errors: dict[str, str] = {}
    for eid, source in job["cells"]:
        send(b"M", f"exec {eid}".encode())
        try:
            _seed(seeds[eid])
            exec_source(source, f"<answer cell {eid}>", ns)
        except BaseException as exc:  # SyntaxError, SystemExit, anything: this exercise only
            if isinstance(exc, KeyboardInterrupt):
                raise
            cell_errors[eid] = f"the answer cell failed to run: {_cell_error(exc, eid)}"[:2000]
        finally:
            _restore_imports(imports)

    for eid in job["run"]:
        send(b"M", f"run {eid}".encode())
        cases = job["cases"][eid]
        if eid in cell_errors:
            outcomes = [{"status": "error", "message": cell_errors[eid]}] * len(cases)
        else:
            _seed(seeds[eid])
            outcomes = []
            for case in cases:
                try:
                    outcomes.append(run_case(runs[eid], ns, Case(case.name, case.inputs), job["device"]))
                except BaseException as exc:  # SystemExit from inside the learner's function
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    outcomes.append({"status": "crashed",
                                     "message": f"the code ended the process ({type(exc).__name__}: {exc})"})
                finally:
                    _restore_imports(imports)
        send(b"T", capture.take_new().encode("utf-8", "replace"))
        send(b"O", eid.encode() + b"\0" + _observations_bytes(outcomes))
    send(b"M", b"done")
    return 0


def _cell_error(exc: BaseException, eid: str) -> str:
    """The exception an answer cell raised while it ran, with the line of that cell it reached (the last
    frame in the cell: a call into the learner's own functions shows where the call was made) and its code.
    A syntax error names its line itself."""
    import traceback

    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    filename = f"<answer cell {eid}>"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    if not frames or isinstance(exc, SyntaxError):
        return text
    where = f'File "{filename}", line {frames[-1].lineno}'
    code = (frames[-1].line or "").strip()
    return f"{where}\n    {code}\n{text}" if code else f"{where}\n{text}"


if __name__ == "__main__":
    code = main()
    os._exit(code)  # skip interpreter teardown: learner objects' __del__ must not change the outcome
