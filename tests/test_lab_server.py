"""`make lab` serves JupyterLab rooted at the project, opening lesson 00 (its HTTP API answers)."""
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.conftest import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_serves_jupyterlab(tmp_path):
    port = _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    args = "--allow-root --no-browser --ServerApp.token=probe --ContentsManager.allow_hidden=True"
    workspace = f".gpulab/lab-server-test-{os.getpid()}"  # git-ignored; the learner's workspace/ stays untouched
    proc = subprocess.Popen(["make", "-s", "lab", f"PORT={port}", f"LAB_ARGS={args}", f"WORKSPACE={workspace}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 90
        api = None
        while time.time() < deadline and api is None:
            time.sleep(1)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2) as r:
                    api = json.loads(r.read())
            except OSError:
                assert proc.poll() is None, "jupyter lab exited early"
        assert api and "version" in api
        url = f"http://127.0.0.1:{port}/api/contents/notebooks/00_start_here.ipynb?content=0&token=probe"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert json.loads(r.read())["name"] == "00_start_here.ipynb"  # rooted at the project
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/labs?token=probe", timeout=5) as r:
            assert any(re.match(r"\d\d_", c["name"]) for c in json.loads(r.read())["content"])
        url = f"http://127.0.0.1:{port}/api/contents/{workspace}/notebooks/00_start_here.ipynb?content=0&token=probe"
        with urllib.request.urlopen(url, timeout=5) as r:  # the learner's copy, made on first use
            assert json.loads(r.read())["name"] == "00_start_here.ipynb"
    finally:
        os.killpg(proc.pid, 15)
        shutil.rmtree(ROOT / workspace, ignore_errors=True)
        proc.wait(timeout=30)
