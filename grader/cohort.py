"""``cohort`` and ``merge``: grade a folder of submissions (optionally one shard of it) and combine
shards into one gradebook identical to an unsharded run."""
from __future__ import annotations

import csv
import io
import json
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from grader.checks import exercises
from grader.report import junit_xml, write_reports


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"K/N"`` (1 <= K <= N) to ``(K, N)``; ``None`` means the whole cohort."""
    if not text:
        return 1, 1
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like K/N (e.g. 2/4), got {text!r}.") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard K/N needs 1 <= K <= N, got {text!r}.")
    return k, n


def submissions(folder: Path, shard: tuple[int, int] = (1, 1)) -> list[Path]:
    """The ``.ipynb`` files of ``folder`` in name order; shard K/N takes every N-th from the K-th."""
    files = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    k, n = shard
    return [p for i, p in enumerate(files) if i % n == k - 1]


def result_dir(out: Path, submission: str) -> Path:
    return out / Path(submission).stem


def gradebook_csv(results: list[dict], lab: str) -> str:
    """One row per submission (sorted by name), one column per exercise, then total and max."""
    ids = list(exercises(lab))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["submission", "status", *ids, "total", "max_score"])
    max_score = sum(ex.points for ex in exercises(lab).values())
    for r in sorted(results, key=lambda r: r["submission"]):
        scores = {e["id"]: e["score"] for e in r.get("exercises", [])}
        writer.writerow([r["submission"], r["status"], *[f"{scores.get(i, 0.0):g}" for i in ids],
                         f"{r.get('score', 0.0):g}", f"{max_score:g}"])
    return buf.getvalue()


def write_gradebook(results: list[dict], lab: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ordered = sorted(results, key=lambda r: r["submission"])
    (out / "gradebook.csv").write_text(gradebook_csv(ordered, lab))
    (out / "junit.xml").write_text(junit_xml(ordered, suite=f"cohort {lab}"))


def cohort(folder, lab: str, out, jobs: int = 2, shard: str | None = None, progress: bool = True,
           **grade_kwargs) -> list[dict]:
    """Grade every submission of ``folder`` (or one shard of it) with ``jobs`` in parallel."""
    from grader.grade import grade

    folder, out = Path(folder), Path(out)
    exercises(lab)  # an unknown lab fails before any work
    files = submissions(folder, parse_shard(shard))
    results: list[dict] = []

    def one(path: Path) -> dict:
        try:
            result = grade(path, lab=lab, **grade_kwargs)
        except Exception as exc:  # a grader bug must not stop the batch either
            result = {"schema": 1, "lab": lab, "submission": path.name, "status": "invalid",
                      "message": f"internal grader error: {type(exc).__name__}: {exc}", "score": 0.0,
                      "max_score": 0.0, "device": grade_kwargs.get("device", "cpu"), "duration_s": 0.0,
                      "exercises": []}
        write_reports(result, result_dir(out, path.name))
        return result

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), desc=f"grading {lab}", unit="submission")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # the work happens in child processes
        for future in as_completed([pool.submit(one, p) for p in files]):
            results.append(future.result())
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    write_gradebook(results, lab, out)
    return sorted(results, key=lambda r: r["submission"])


def merge(dirs: list, out) -> list[dict]:
    """Combine the per-submission results of several cohort (shard) folders into one gradebook."""
    results: dict[str, dict] = {}
    labs = set()
    for d in dirs:
        for path in sorted(Path(d).glob("*/result.json")):
            r = json.loads(path.read_text())
            results[r["submission"]] = r
            labs.add(r.get("lab"))
            write_reports(r, result_dir(Path(out), r["submission"]))
    labs.discard(None)
    if len(labs) != 1:
        raise ValueError(f"merge needs results of exactly one lab, found {sorted(labs) or 'none'}.")
    lab = labs.pop()
    write_gradebook(list(results.values()), lab, Path(out))
    return sorted(results.values(), key=lambda r: r["submission"])
