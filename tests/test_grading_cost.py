"""benchmarks/grading_cost.py: its memory sampling sees a whole process tree, and its table says which
labs miss the one-minute goal (the numbers themselves come from a run, committed under benchmarks/results)."""
import subprocess
import sys
import time

from benchmarks.grading_cost import GOAL_S, markdown, tree_rss


def test_tree_rss_counts_the_judge_and_every_process_below_it():
    grandchild = "import time; b = bytearray(200 * 2**20); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                              f"subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(30)"])
    try:
        for _ in range(100):  # until the grandchild has its 200 MiB
            judge, workers = tree_rss(child.pid)
            if workers > 200 * 2**20:
                break
            time.sleep(0.1)
        assert judge > 0 and workers > 200 * 2**20
    finally:
        import psutil

        for p in psutil.Process(child.pid).children(recursive=True):
            p.kill()
        child.kill()
        child.wait()
    assert tree_rss(child.pid) == (0, 0)  # a process that has ended has no memory


def test_the_table_flags_a_lab_over_the_goal():
    def row(lab, mode, wall, score):
        return {"lab": lab, "mode": mode, "wall_s": wall, "score": score, "max_score": 10.0,
                "judge_peak_mib": 300, "workers_peak_mib": 900}

    report = {"machine": "x86_64 x2 cores", "date": "today", "script": "benchmarks/grading_cost.py",
              "load_before": 0.1, "load_after": 0.2,
              "rows": [row("01_a", "solution", 20.0, 10.0), row("01_a", "untouched lab", 15.0, 0.0),
                       row("11_b", "solution", GOAL_S + 22, 10.0), row("11_b", "solution, no notebook run", 50, 10.0)]}
    text = markdown(report)
    assert "| 01_a | 20 | 10/10 |  | 15 | 0 | 300 | 900 | yes |" in text
    assert f"| 11_b | {GOAL_S + 22:g} | 10/10 | 50 |" in text and "**no**" in text
    assert "1.7 min" in text  # one learner's two solutions, one at a time
