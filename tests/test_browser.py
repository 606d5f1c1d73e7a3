"""A learner's first session, in a real browser: `make lab`, lesson 00, then lab 02's first exercise,
saved, closed and reopened: its verdicts are still there.

Playwright drives Debian's Chromium (``/usr/bin/chromium``: Playwright's own browser download is not
available here) through JupyterLab's own UI: the menus, the CodeMirror editor, Ctrl+Enter. The server
is the real ``make lab`` target on a free port with a known token, with its learner workspace (the
copies a learner works in) in a git-ignored folder of its own. JupyterLab keeps its settings and
runtime files in a temporary folder with autosave off; the test saves only the workspace's lab, and
ends by checking that no tracked file changed on disk. A failure leaves screenshots in ``.gpulab/``.

Skipped when chromium or playwright is missing, unless ``GPULAB_BROWSER_TEST=required`` (``.ci/run``
sets it after installing chromium), which turns the skip into a failure.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from tests.conftest import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / ".gpulab"
WORKSPACE = f".gpulab/browser-workspace-{os.getpid()}"  # git-ignored; `make lab WORKSPACE=...` copies into it
LESSON = f"{WORKSPACE}/notebooks/00_start_here.ipynb"
LAB = f"{WORKSPACE}/labs/02_triton_basics.ipynb"
DRILLS = f"{WORKSPACE}/notebooks/16_interview_drills.ipynb"
TIMEOUT_MS = 120_000  # one step (a cell, a page load) on a loaded 2-core machine

# JupyterLab user settings for the test's own settings folder: never autosave (the test must not
# write tracked files), and no news or update checks (no network here).
SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}

# The classic first mistake: no masks, at the stub's default BLOCK=1024 (the last program overhangs).
WRONG_VECTOR_ADD = '''\
@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


def vector_add(x, y, out=None, BLOCK: int = 1024):
    out = torch.empty_like(x) if out is None else out
    vector_add_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)
    return out
'''


def _skip_reason() -> str | None:
    if not CHROMIUM.exists():
        return f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs playwright (pip install -e '.[test]')"
    return None


# ---------------------------------------------------------------------------------------------------
# Files on disk


def _tracked_files() -> dict[str, str]:
    """Hash of every tracked file's content: stricter than `git status` (it also sees a second edit)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    hashes = {}
    for name in names.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file():
            hashes[name] = hashlib.sha1(path.read_bytes()).hexdigest()
    return hashes


def _solution_answer(cell_id: str) -> str:
    """The answer cell ``cell_id`` of lab 02's solution, with its solution markers and hints removed."""
    nb = json.loads((ROOT / "solutions" / "02_triton_basics.ipynb").read_text())
    source = "".join(next(c["source"] for c in nb["cells"] if c.get("id") == cell_id))
    return "\n".join(line for line in source.splitlines() if not line.strip().startswith("###")) + "\n"


def _cell_index(notebook: str) -> dict[str, int]:
    """Cell id -> position, to find a cell in the page (JupyterLab shows cells in file order)."""
    nb = json.loads((ROOT / notebook).read_text())
    return {c.get("id"): i for i, c in enumerate(nb["cells"])}


# ---------------------------------------------------------------------------------------------------
# The server: the real `make lab`


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_lab(tmp: Path, port: int, token: str, log: Path) -> subprocess.Popen:
    """`make lab` on ``port`` with ``token``; Jupyter's config, settings and workspaces under ``tmp``."""
    for plugin, values in SETTINGS.items():
        path = tmp / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
    for name in ("GPULAB_STRICT", "GPULAB_GRADING", "MPLBACKEND"):  # a learner's kernel has none of them
        env.pop(name, None)
    # The workspace sits in a hidden (git-ignored) folder, which Jupyter serves only when asked to.
    args = f"--allow-root --no-browser --IdentityProvider.token={token} --ContentsManager.allow_hidden=True"
    return subprocess.Popen(["make", "-s", "lab", f"PORT={port}", f"LAB_ARGS={args}", f"WORKSPACE={WORKSPACE}"],
                            cwd=ROOT, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_server(proc: subprocess.Popen, port: int, log: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"`make lab` exited early:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2):
                return
        except OSError:
            time.sleep(0.25)
    raise AssertionError(f"`make lab` did not answer within {seconds:.0f} s:\n{log.read_text()[-3000:]}")


def _assert_autosave_off(port: int, token: str) -> None:
    """The server reads the test's settings folder (else a slow run could autosave tracked notebooks)."""
    url = f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/docmanager-extension:plugin?token={token}"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert json.loads(r.read())["settings"].get("autosave") is False, "autosave is on in the test server"


def _server_writes(log: Path) -> list[str]:
    """Files the Jupyter server wrote through its contents API (it logs each save, upload, creation), outside
    the learner's workspace (where the test saves its lab)."""
    return [line for line in log.read_text().splitlines()
            if re.search(r"Saving file at|Uploading file to|Creating new", line) and WORKSPACE not in line]


def _stop(proc: subprocess.Popen) -> None:
    """Stop `make lab` and Jupyter (its process group); Jupyter shuts its kernels down on SIGTERM."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------------------
# JupyterLab's UI

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"

# State of the visible notebook: each cell's prompt ("[3]:", "[*]:", ""), a kernel-death dialog.
_STATE_JS = """() => {
  const panel = document.querySelector('%s');
  const cells = panel ? [...panel.querySelectorAll('.jp-Notebook .jp-Cell')] : [];
  const prompt = c => { const p = c.querySelector('.jp-InputArea-prompt'); return p ? p.textContent.trim() : ''; };
  const dialog = [...document.querySelectorAll('.jp-Dialog')].map(d => d.textContent).join(' ');
  return {prompts: cells.map(prompt), code: cells.map(c => c.classList.contains('jp-CodeCell')), dialog};
}""" % PANEL


def _state(page) -> dict:
    return page.evaluate(_STATE_JS)


def _count(prompt: str) -> int | None:
    m = re.fullmatch(r"\[(\d+)\]:", prompt)
    return int(m.group(1)) if m else None


def _died(state: dict) -> bool:
    return bool(re.search(r"died|dead|restarting", state["dialog"], re.I))


def _wait(page, done, what: str, timeout_ms: int = TIMEOUT_MS) -> dict:
    """Poll the notebook until ``done(state)``; fail at once if the kernel died."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        state = _state(page)
        assert not _died(state), f"the kernel died while {what}: {state['dialog'].strip()}"
        if done(state):
            return state
        assert time.monotonic() < deadline, f"timed out while {what}; prompts {state['prompts']}"
        page.wait_for_timeout(200)  # a poll interval, not a fixed wait: the loop exits on the condition


def _menu(page, menu: str, item: str) -> None:
    """Click ``menu`` in the menu bar, then its entry ``item``."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(rf"^{menu}$")).click()
    page.locator(".lm-Menu-item:not(.lm-mod-hidden)", has_text=item).first.click()


def _cell(page, index: int):
    return page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(index)


def _run_cell(page, index: int, what: str) -> None:
    """Run one cell with Ctrl+Enter and wait for its new execution count."""
    before = max((_count(p) or 0) for p in _state(page)["prompts"])
    _cell(page, index).locator(".cm-content").click()
    page.keyboard.press("Control+Enter")
    _wait(page, lambda s: (_count(s["prompts"][index]) or 0) > before, what)


def _type_into_cell(page, index: int, text: str) -> None:
    """Replace a cell's text the way a learner does: select all in its editor, type."""
    _cell(page, index).locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(text)  # one input event: no auto-indent or bracket closing


def _verdict(page, index: int) -> tuple[str, str, list[str]]:
    """A check cell's verdict as a browser without an emoji font shows it (hidden elements excluded):
    the whole text, its headline (the exercise's verdict) and each case's mark."""
    cell = _cell(page, index)
    cell.scroll_into_view_if_needed()  # JupyterLab renders only the cells near the viewport
    output = cell.locator(".jp-OutputArea")
    output.locator(".jp-OutputArea-output").first.wait_for()
    text = _without_symbols(output.inner_text()).strip()
    marks = [_without_symbols(t).strip() for t in output.locator(".gpulab-mark").all_inner_texts()]
    return text, text.splitlines()[0], marks


def _one_line(locator) -> bool:
    """Whether an element's text fits on one line (no wrapping), by its client rectangles."""
    return locator.evaluate("e => { const r = document.createRange(); r.selectNodeContents(e); "
                            "const tops = new Set([...r.getClientRects()].map(x => Math.round(x.top))); "
                            "return tops.size <= 1; }")


def _error_outputs(page) -> list[str]:
    """Tracebacks shown in the visible notebook (JupyterLab renders errors as stderr)."""
    texts = page.locator(f"{PANEL} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    return [t for t in texts.all_text_contents() if re.search(r"Traceback|Error\b", t)]


def _open(page, path: str) -> None:
    """File > Open from Path..., then wait until the notebook's kernel is idle."""
    _menu(page, "File", "Open from Path")
    page.locator(".jp-Dialog input").fill(path)
    page.keyboard.press("Enter")
    _wait_notebook(page, path)


def _wait_notebook(page, path: str) -> None:
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text=Path(path).name).first.wait_for()
    page.locator(f"{PANEL} .jp-Notebook .jp-Cell").first.wait_for()
    page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle")).wait_for(timeout=TIMEOUT_MS)


def _is_dirty(page) -> bool:
    return page.locator(".lm-TabBar-tab.lm-mod-current.jp-mod-dirty").count() > 0


def _close_without_saving(page, name: str) -> None:
    """File > Close and Shut Down Notebook: "Ok" to "shut down?"; "Discard" if it ever asks to save."""
    _menu(page, "File", "Close and Shut Down Notebook")
    tab, dialog = page.locator(".lm-TabBar-tab", has_text=name), page.locator(".jp-Dialog")
    deadline = time.monotonic() + 30
    while tab.count():
        assert time.monotonic() < deadline, f"{name} did not close"
        if dialog.count():
            dialog.locator("button", has_text=re.compile(r"^(Discard|Don.t Save|Shut Down|Ok)$", re.I)).click()
            dialog.wait_for(state="detached")
        else:
            page.wait_for_timeout(100)  # a poll interval


def _screenshot(page, name: str) -> Path:
    SHOTS.mkdir(exist_ok=True)
    path = SHOTS / f"browser-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _without_symbols(text: str) -> str:
    """The text as a browser without an emoji font shows it: every non-ASCII symbol gone."""
    return re.sub(r"[^\x00-\x7f]", "", text)


# ---------------------------------------------------------------------------------------------------
# The learner's session


def _lesson_00(page, findings: list[str]) -> None:
    """`make lab` lands on lesson 00; Run All Cells runs every code cell without an error."""
    assert page.url.split("?")[0].endswith(f"/lab/tree/{LESSON}"), f"`make lab` opens {page.url}, not {LESSON}"
    _wait_notebook(page, LESSON)
    if _is_dirty(page):
        findings.append(f"opening {LESSON} marks it modified (dirty tab) before anything ran "
                        f"(screenshot {_screenshot(page, 'lesson-dirty-on-open')})")
    _menu(page, "Run", "Run All Cells")
    state = _wait(page, lambda s: all(_count(p) for p, code in zip(s["prompts"], s["code"]) if code),
                  f"running all cells of {LESSON}")
    errors = _error_outputs(page)
    assert not errors, f"{LESSON} shows errors:\n" + "\n".join(e[-1500:] for e in errors)
    assert sum(state["code"]) >= 5, state
    _close_without_saving(page, Path(LESSON).name)


def _lab_02(page, findings: list[str]) -> None:
    """Lab 02: a wrong vector add gets a FAIL verdict with a hint, the right one a PASS; a plot shows."""
    cells = _cell_index(LAB)
    _open(page, LAB)
    if _is_dirty(page):
        findings.append(f"opening {LAB} marks it modified (dirty tab) before anything ran "
                        f"(screenshot {_screenshot(page, 'lab-dirty-on-open')})")
    for cell_id in ("parameters", "setup"):
        _run_cell(page, cells[cell_id], f"running lab 02's {cell_id} cell")

    # Wrong: no masks at the default BLOCK=1024. The verdict must arrive, and the kernel survive.
    _type_into_cell(page, cells["add"], WRONG_VECTOR_ADD)
    _run_cell(page, cells["add"], "defining a vector add without masks")
    _run_cell(page, cells["add-check"], "checking a vector add without masks")
    verdict, headline, marks = _verdict(page, cells["add-check"])
    assert re.search(r"\bFAIL", headline, re.I) and not re.search(r"\bPASS", headline, re.I), verdict
    assert marks and all(re.fullmatch(r"[A-Z]+", m) for m in marks), f"case marks without words: {marks}"
    assert "FAIL" in marks, marks
    assert re.search(r"mask|out of bounds|out-of-bounds|past the end", verdict, re.I), verdict
    check_cell = _cell(page, cells["add-check"])
    assert all(_one_line(mark) for mark in check_cell.locator(".gpulab-mark").all()), "a case's mark wraps"
    hint = check_cell.get_by_text(re.compile(r"Hint:"))
    assert not hint.is_visible(), "the hint shows before the learner asks for it"
    check_cell.locator("summary", has_text="Show hint").click()
    hint.wait_for(state="visible")
    assert "mask" in hint.inner_text().lower(), hint.inner_text()
    status = page.locator("#jp-main-statusbar").inner_text()
    assert not re.search(r"Dead|Restarting|Unknown", status), f"kernel status after the wrong answer: {status}"

    # Right: the solution's answer, in the same kernel (a restarted kernel would have lost the setup).
    _type_into_cell(page, cells["add"], _solution_answer("add"))
    _run_cell(page, cells["add"], "defining the solution's vector add")
    _run_cell(page, cells["add-check"], "checking the solution's vector add")
    verdict, headline, marks = _verdict(page, cells["add-check"])
    assert re.search(r"\bPASS", headline, re.I) and not re.search(r"\bFAIL", verdict, re.I), verdict
    assert marks and set(marks) == {"PASS"}, f"case marks: {marks}"

    # A rendered plot: section 5's bar chart needs the byte count, so answer that exercise too.
    _type_into_cell(page, cells["bytes"], _solution_answer("bytes"))
    for cell_id in ("bytes", "bytes-check", "measure"):
        _run_cell(page, cells[cell_id], f"running lab 02's {cell_id} cell")
    plot = _cell(page, cells["measure"]).locator(".jp-OutputArea img")
    plot.wait_for()
    assert plot.evaluate("img => img.complete && img.naturalWidth > 100"), "the bar chart did not render"
    errors = _error_outputs(page)
    assert not errors, f"{LAB} shows errors:\n" + "\n".join(e[-1500:] for e in errors)
    _save_close_and_reopen(page, Path(LAB).name)
    # The saved verdict is back without the kernel that made it (a widget's would read "model not found").
    verdict, headline, marks = _verdict(page, cells["add-check"])
    assert re.search(r"\bPASS", headline, re.I) and set(marks) == {"PASS"}, verdict
    assert "bytes-check" in cells and "PASS" in _verdict(page, cells["bytes-check"])[1]
    page_text = page.locator(PANEL).inner_text()
    assert "Error displaying widget" not in page_text and "model not found" not in page_text
    _close_without_saving(page, Path(LAB).name)


def _drill(page) -> None:
    """A drill answered in its box and submitted, its first follow-up answered, saved, closed and reopened: the
    answer, the follow-ups with their answer and the rubric are still shown, in the restored widgets (make lab
    saves widget state), with no "model not found"."""
    cells = _cell_index(DRILLS)
    _open(page, DRILLS)
    for cell_id in ("parameters", "setup", "q-opt-1-drill"):
        _run_cell(page, cells[cell_id], f"running the drills' {cell_id} cell")
    cell = _cell(page, cells["q-opt-1-drill"])
    boxes = cell.locator("textarea")  # the answer box; after Submit, one more per follow-up
    boxes.first.fill("Quantize the weights to int8 and measure")  # saved to the answers file on every change
    page.wait_for_timeout(1000)  # let the widget sync the value to the kernel (a debounce, not a poll)
    cell.get_by_role("button", name="Submit answer").click()
    _wait(page, lambda s: boxes.count() > 1, "showing the follow-ups after Submit")
    boxes.nth(1).fill("Measure the bytes per token first")
    page.wait_for_timeout(1000)
    _save_close_and_reopen(page, Path(DRILLS).name, DRILLS)
    shown = _drill_output(page, cells["q-opt-1-drill"])
    if "model not found" in shown:
        # jupyterlab-manager can mark itself restored (from the new kernel, which has no widgets) before it has
        # read the notebook's saved state, and a view rendered in between stays broken; seen under heavy load,
        # more often the more widgets a notebook saved. The work itself must never be lost: running the cell
        # again rebuilds the drill from the answers file.
        warnings.warn(f"the reopened drill showed {shown.strip()[:80]!r}; re-running its cell")
        _menu(page, "Edit", "Clear Outputs of All Cells")  # the saved execution counts would hide the new ones
        for cell_id in ("parameters", "setup", "q-opt-1-drill"):  # a new kernel: the setup first
            _run_cell(page, cells[cell_id], f"re-running the drills' {cell_id} cell")
        shown = _drill_output(page, cells["q-opt-1-drill"])
    assert "Quantize the weights to int8" in shown, shown
    assert "The interviewer follows up" in shown and "Follow-up 1" in shown and "Follow-up 3" in shown, shown
    assert "Measure the bytes per token first" in shown and "Rubric" in shown, shown
    assert "model not found" not in shown and "Error displaying widget" not in shown, shown
    _close_without_saving(page, Path(DRILLS).name)


def _drill_output(page, index: int) -> str:
    """The text a drill cell's output shows, its answer boxes' contents included, once its widget has loaded."""
    cell = _cell(page, index)
    cell.scroll_into_view_if_needed()
    output = cell.locator(".jp-OutputArea")
    output.locator(".jp-OutputArea-output").first.wait_for()
    _wait(page, lambda s: "Loading widget" not in output.inner_text(), "restoring the drill's widget")
    return output.inner_text() + " ".join(t.input_value() for t in output.locator("textarea").all())


def _save_close_and_reopen(page, name: str, path: str = LAB) -> None:
    """Save (File > Save Notebook: a focused widget keeps Ctrl+S to itself), close and shut down the kernel, then
    open the notebook again from disk."""
    _menu(page, "File", "Save Notebook")
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while _is_dirty(page):
        assert time.monotonic() < deadline, f"{name} was not saved"
        page.wait_for_timeout(100)  # a poll interval
    _close_without_saving(page, name)
    _open(page, path)


@pytest.mark.slow
def test_first_session_in_a_browser(tmp_path):
    reason = _skip_reason()
    if reason:
        if os.environ.get("GPULAB_BROWSER_TEST") == "required":
            pytest.fail(f"the browser test is required here but cannot run: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    before = _tracked_files()
    port, token, log = _free_port(), secrets.token_hex(16), tmp_path / "lab.log"
    proc = _start_lab(tmp_path, port, token, log)
    findings: list[str] = []  # problems that do not stop the session; reported together at the end
    try:
        _wait_for_server(proc, port, log)
        _assert_autosave_off(port, token)
        with sync_playwright() as p:
            browser = p.chromium.launch_persistent_context(
                str(tmp_path / "chromium"), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                headless=True, viewport={"width": 1400, "height": 1000})
            page = browser.pages[0] if browser.pages else browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            try:
                page.goto(f"http://127.0.0.1:{port}/?token={token}")  # the server's root: lesson 00
                _lesson_00(page, findings)
                _lab_02(page, findings)
                _drill(page)
            except BaseException:
                print(f"screenshot: {_screenshot(page, 'failure')}")
                print("found before the failure:", *findings, sep="\n")
                raise
            finally:
                browser.close()
    finally:
        _stop(proc)
        shutil.rmtree(ROOT / WORKSPACE, ignore_errors=True)
    findings += [f"the Jupyter server wrote a file: {line}" for line in _server_writes(log)]
    findings += _tracked_changes(before, _tracked_files())
    assert not findings, "\n".join(findings)


def _tracked_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Tracked files whose content changed during the session, as findings.

    In CI (``GPULAB_BROWSER_TEST=required``) any change counts. On a developer's machine, where an
    editor may save files while the tests run, only the notebooks the session opened count; the
    other changes are reported as a warning.
    """
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    ours = [name for name in changed if name.startswith(("notebooks/", "labs/"))]
    others = [name for name in changed if name not in ours]
    if os.environ.get("GPULAB_BROWSER_TEST") == "required":
        ours, others = changed, []
    if others:
        warnings.warn(f"tracked files changed while the browser test ran (not by it, as far as it can tell): "
                      f"{others}")
    if not ours:
        return []
    diff = subprocess.run(["git", "diff", "--stat", "--", *ours], cwd=ROOT, capture_output=True, text=True)
    return [f"tracked files changed on disk during the session: {ours}\n{diff.stdout}"]


def test_ci_always_runs_the_browser_test():
    """CI installs chromium and turns the skip into a failure; playwright comes with the test extras."""
    import tomllib

    run = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install" in run and "chromium" in run
    assert "GPULAB_BROWSER_TEST=required" in run
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(req.startswith("playwright") for req in extras)
