"""The rank launcher: results per rank, notebook-style code, free ports, crashes and hangs end cleanly."""
import threading
import time

import pytest
import torch

from gpulab.dist import RankError, RankTimeout, launch, pick_backend
from tests.conftest import scaled


def _all_reduce_sum(rank, world_size, scale):
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)]) * scale
    dist.all_reduce(t)
    return t.item()


def test_all_reduce_on_two_ranks():
    assert launch(_all_reduce_sum, 2, 10.0, timeout_s=scaled(30)) == [30.0, 30.0]


def test_the_ranks_meet_on_a_port_the_os_picked(tmp_path):
    """Rank 0 binds the store first and publishes its port; nothing picks a port that another launch could
    take in between (the notebook lane launches ranks beside the unit tests)."""
    from gpulab.dist_worker import rendezvous_store

    clients = []
    joiner = threading.Thread(target=lambda: clients.append(rendezvous_store(tmp_path, 1, 2, scaled(10))))
    joiner.start()  # rank 1 may start first: it waits for the port
    master = rendezvous_store(tmp_path, 0, 2, scaled(10))
    joiner.join()
    assert int((tmp_path / "store.port").read_text()) == master.port != 0
    clients[0].set("from rank 1", "hello")
    assert master.get("from rank 1") == b"hello"


def test_launches_at_the_same_time_do_not_meet():
    results, errors = [], []

    def one(scale):
        try:
            results.append(launch(_all_reduce_sum, 2, scale, timeout_s=scaled(30)))
        except Exception as exc:  # noqa: BLE001 - collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(float(k),)) for k in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results) == [[3.0, 3.0], [6.0, 6.0], [9.0, 9.0]]


def test_code_defined_like_a_notebook_cell_is_shipped_by_value():
    namespace = {"__name__": "__main__"}
    exec("import torch\nOFFSET = 5\n"
         "def ring(rank, world_size):\n"
         "    import torch.distributed as dist\n"
         "    t = torch.tensor([float(rank)])\n"
         "    dst, src = (rank + 1) % world_size, (rank - 1) % world_size\n"
         "    if rank % 2 == 0:\n"
         "        dist.send(t, dst); dist.recv(t, src)\n"
         "    else:\n"
         "        buf = torch.zeros(1); dist.recv(buf, src); dist.send(t, dst); t = buf\n"
         "    return t.item() + OFFSET\n", namespace)
    assert launch(namespace["ring"], 4, timeout_s=scaled(30)) == [8.0, 5.0, 6.0, 7.0]


def test_a_crashing_rank_ends_the_launch_with_its_traceback():
    def crash(rank, world_size):
        import torch.distributed as dist
        if rank == 1:
            raise ValueError("rank one is broken")
        dist.barrier()  # rank 0 would wait forever without the watchdog

    start = time.monotonic()
    with pytest.raises(RankError, match=r"rank 1 of 2 failed:(.|\n)*ValueError: rank one is broken"):
        launch(crash, 2, timeout_s=scaled(60))
    assert time.monotonic() - start < scaled(60) / 2  # no waiting for the timeout


def test_a_hung_rank_ends_within_its_timeout_with_a_clear_message():
    def hang(rank, world_size):
        import torch.distributed as dist
        if rank == 0:
            dist.recv(torch.zeros(1), 1)  # rank 1 never sends ...
        else:
            time.sleep(120)               # ... and stays alive: a true hang
        return rank

    start = time.monotonic()
    with pytest.raises(RankTimeout, match=r"rank 0 of 2 timed out waiting for another rank"):
        launch(hang, 2, timeout_s=5)
    assert time.monotonic() - start < 5 + scaled(40)  # the timeout, plus starting the ranks


def test_a_rank_stuck_outside_any_collective_is_stopped_by_the_watchdog():
    def spin(rank, world_size):
        while rank == 1:
            time.sleep(0.1)
        return rank

    start = time.monotonic()
    finished = r"rank\(s\) \[1\] did not finish within 3 s(.|\n)*rank\(s\) \[0\] had finished"
    with pytest.raises(RankTimeout, match=finished):
        launch(spin, 2, timeout_s=3)
    assert time.monotonic() - start < 3 + scaled(40)


def test_parallel_launches_get_their_own_ports():
    results = []
    def one_launch():
        results.append(launch(_all_reduce_sum, 2, 1.0, timeout_s=scaled(30)))

    threads = [threading.Thread(target=one_launch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [[3.0, 3.0], [3.0, 3.0]]


def test_backend_choice_and_argument_errors():
    assert pick_backend(2, "cpu") == "gloo"
    with pytest.raises(ValueError, match="world_size"):
        launch(_all_reduce_sum, 0)
    with pytest.raises(TypeError, match="function"):
        launch(42)
    with pytest.raises(ValueError, match="backend"):
        launch(_all_reduce_sum, 2, backend="mpi")


def test_a_rank_leaving_without_its_send_is_explained():
    def unmatched(rank, world_size):
        import torch.distributed as dist
        if rank == 0:
            dist.recv(torch.zeros(1), 1)  # rank 1 returns without sending
        return rank

    with pytest.raises(RankError, match="send without a matching recv"):
        launch(unmatched, 2, timeout_s=scaled(20))  # found when rank 1 exits, long before the timeout


def test_ranks_die_with_the_process_that_launched_them(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "launcher.py"
    script.write_text(
        "import time\nfrom gpulab.dist import launch\n"
        "def spin(rank, world_size):\n    import os, time\n"
        f"    open(r'{tmp_path}/rank%d.pid' % rank, 'w').write(str(os.getpid()))\n"
        "    time.sleep(600)\n"
        "launch(spin, 2, timeout_s=600)\n")
    from tests.conftest import ROOT
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    pids, deadline = [], time.monotonic() + scaled(30)
    while len(pids) < 2 and time.monotonic() < deadline:
        pids = [p for p in tmp_path.glob("rank*.pid") if p.read_text()]
        time.sleep(0.1)  # a poll interval
    assert len(pids) == 2, f"no rank wrote its pid within {scaled(30):.0f} s"
    os.killpg(proc.pid, signal.SIGKILL)  # what the grader does to a worker that timed out
    proc.wait()
    time.sleep(1.0)
    for pid_file in pids:
        pid = int(pid_file.read_text())
        alive = True
        try:
            os.kill(pid, 0)
            alive = open(f"/proc/{pid}/stat").read().split()[2] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            alive = False
        assert not alive, f"rank process {pid} outlived its launcher"


def _what_a_rank_sees(rank, world_size):
    import os
    import random
    import sys

    return (os.environ.get("GPULAB_TEST_MARK"), os.getcwd(), random.random(), os.getppid(),
            "torch._dynamo" in sys.modules)


def test_forked_ranks_see_this_launchs_environment_and_directory(tmp_path, monkeypatch):
    """Ranks fork from a warm server (gpulab.forkserver) started at an earlier launch: each launch still
    hands them the caller's environment and working directory of that moment, and fresh random states."""
    from gpulab import forkserver

    assert forkserver.available()
    launch(_all_reduce_sum, 2, 1.0, timeout_s=scaled(30))  # the server is up from here on
    monkeypatch.setenv("GPULAB_TEST_MARK", "set after the server started")
    monkeypatch.chdir(tmp_path)
    seen = launch(_what_a_rank_sees, 2, timeout_s=scaled(30))
    assert [s[:2] for s in seen] == [("set after the server started", str(tmp_path))] * 2
    assert seen[0][2] != seen[1][2]  # each rank draws its own random numbers
    assert seen[0][3] == seen[1][3] == forkserver._server.pid  # forked, not started afresh
    assert seen[0][4]  # the server imported TorchDynamo once for every rank (optimizers import it)


def test_a_rank_killed_by_a_signal_is_reported_with_its_exit_status():
    def killed(rank, world_size):
        import os
        import signal

        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        import time
        time.sleep(30)

    with pytest.raises(RankError, match=r"rank 1 of 2 failed:\nexit code -9"):
        launch(killed, 2, timeout_s=scaled(30))


def test_without_the_fork_server_ranks_start_as_fresh_processes(monkeypatch):
    import os

    monkeypatch.setenv("GPULAB_FORKSERVER", "0")
    seen = launch(_what_a_rank_sees, 2, timeout_s=scaled(30))
    assert seen[0][3] == seen[1][3] == os.getpid()  # children of this process, no server between


def test_the_fork_server_never_forks_with_cuda_initialised(monkeypatch):
    """A child forked from a process that initialised CUDA cannot use the GPU (NCCL ranks would fail): the
    server checks before every fork, and a launch then falls back to fresh processes."""
    import subprocess
    import sys

    import torch

    from gpulab import forkserver

    forkserver.assert_cuda_free()  # importing torch (as the server does) initialises nothing
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="initialised CUDA before forking"):
        forkserver.assert_cuda_free()
    script = ("import torch, gpulab.forkserver as f; torch.cuda.is_initialized = lambda: True; f.serve()")
    proc = subprocess.run([sys.executable, "-c", script], input='{"argv": []}\n', capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and proc.stdout == "" and "initialised CUDA" in proc.stderr  # no pid: no fork
