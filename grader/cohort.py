"""``cohort`` and ``merge``: grade a folder of submissions (optionally one shard of it) and combine
shards into one gradebook identical to an unsharded run."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from grader.checks import exercises
from grader.report import junit_xml, sanitize_result, write_reports

# Files ``cohort`` writes next to the result folders; no folder may take their names.
_OUT_FILES = frozenset({"gradebook.csv", "junit.xml"})


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
    """The folder of one submission's reports: always directly under ``out``, one per name.

    ``alice.ipynb`` gets ``out/alice``. Any other name (capitals, spaces, ``/``, dots, unicode,
    control characters, very long) gets a lower-case ASCII slug plus a short hash of the whole
    name, e.g. ``Alice Smith.ipynb`` -> ``out/alice_smith-3f9c0a1b2d``, so no two names share a
    folder, not even on a case-insensitive file system.
    """
    ascii_name = unicodedata.normalize("NFKD", submission).encode("ascii", "ignore").decode()
    stem = ascii_name[:-len(".ipynb")] if ascii_name.endswith(".ipynb") else ascii_name
    slug = re.sub(r"[^a-z0-9._-]+", "_", stem.lower()).strip("._-")[:64].strip("._-") or "submission"
    if f"{slug}.ipynb" != submission or slug in _OUT_FILES:
        digest = hashlib.sha256(submission.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        slug = f"{slug}-{digest}"
    return Path(out) / slug


def _text_cell(value) -> str:
    """A CSV cell that a spreadsheet shows as text, never runs as a formula (OWASP CSV injection), also
    after leading spaces a spreadsheet may drop (`` =cmd|' /C calc'!A0``)."""
    text = str(value)
    return "'" + text if text.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")) else text


def _number_cell(value) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return ""


def gradebook_csv(results: list[dict], lab: str) -> str:
    """One row per submission (sorted by name), one column per exercise, then total and max."""
    ids = list(exercises(lab))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["submission", "status", *ids, "total", "max_score"])
    max_score = sum(ex.points for ex in exercises(lab).values())
    for r in sorted(map(sanitize_result, results), key=lambda r: r["submission"]):
        scores = {e.get("id"): e.get("score") for e in r.get("exercises", [])}
        writer.writerow([_text_cell(r["submission"]), _text_cell(r["status"]),
                         *[_number_cell(scores.get(i, 0.0)) for i in ids],
                         _number_cell(r.get("score", 0.0)), _number_cell(max_score)])
    return buf.getvalue()


def write_gradebook(results: list[dict], lab: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ordered = sorted(results, key=lambda r: r["submission"])
    (out / "gradebook.csv").write_text(gradebook_csv(ordered, lab), encoding="utf-8")
    (out / "junit.xml").write_text(junit_xml(ordered, suite=f"cohort {lab}"), encoding="utf-8")


def invalid_result(lab: str, submission: str, message: str, device: str = "cpu") -> dict:
    """A schema-1 result for a submission that could not be graded or reported."""
    return {"schema": 1, "lab": lab, "submission": submission, "status": "invalid", "message": message,
            "score": 0.0, "max_score": 0.0, "device": device, "duration_s": 0.0, "exercises": []}


def _is_result(value) -> bool:
    """Just enough of schema 1 for the gradebook: a name, a status, and a list of exercise dicts."""
    exercises_ = value.get("exercises", []) if isinstance(value, dict) else None
    return (isinstance(value, dict) and isinstance(value.get("submission"), str)
            and value.get("status") in ("graded", "invalid") and isinstance(exercises_, list)
            and all(isinstance(e, dict) for e in exercises_))


def report_or_record(result: dict, folder: Path) -> dict:
    """Write ``result``'s reports into ``folder``; if that fails, return an ``invalid`` result saying so
    (so the gradebook still has its row), else ``result`` itself."""
    try:
        write_reports(result, folder)
        return result
    except Exception as exc:
        return invalid_result(result.get("lab"), result["submission"],
                              f"its reports could not be written to {folder} "
                              f"({type(exc).__name__}: {exc}); free that path and grade this submission "
                              "again.", result.get("device", "cpu"))


def cohort(folder, lab: str, out, jobs: int = 2, shard: str | None = None, progress: bool = True,
           **grade_kwargs) -> list[dict]:
    """Grade every submission of ``folder`` (or one shard of it) with ``jobs`` in parallel."""
    from grader.grade import grade

    folder, out = Path(folder), Path(out)
    exercises(lab)  # an unknown lab fails before any work
    files = submissions(folder, parse_shard(shard))
    results: list[dict] = []
    device = grade_kwargs.get("device", "cpu")

    def one(path: Path) -> dict:
        try:
            result = grade(path, lab=lab, log_path=result_dir(out, path.name) / "grader.log", **grade_kwargs)
            if not _is_result(result):
                raise TypeError(f"grade returned {type(result).__name__}, not a result")
            result = sanitize_result(result)
        except Exception as exc:  # a grader bug must not stop the batch either
            result = sanitize_result(invalid_result(lab, path.name, f"internal grader error: "
                                                    f"{type(exc).__name__}: {exc}", device))
        return report_or_record(result, result_dir(out, path.name))

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
            r = _load_result(path)
            labs.add(r.get("lab"))
            # the folder keeps the name cohort gave it, so merged shards look like one run
            results[r["submission"]] = report_or_record(r, Path(out) / path.parent.name)
    labs.discard(None)
    if len(labs) != 1:
        raise ValueError(f"merge needs results of exactly one lab, found {sorted(labs) or 'none'}.")
    lab = labs.pop()
    write_gradebook(list(results.values()), lab, Path(out))
    return sorted(results.values(), key=lambda r: r["submission"])


def _load_result(path: Path) -> dict:
    """A ``result.json`` written by ``cohort`` (sanitized), or ValueError saying which file is damaged."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    if not _is_result(result):
        raise ValueError(f"{path} is not a grader result (no submission or status); "
                         "grade that shard again.")
    return sanitize_result(result)
