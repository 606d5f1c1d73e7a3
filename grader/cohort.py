"""``cohort`` and ``merge``: grade a folder of submissions (optionally one shard of it) and combine
shards into one gradebook identical to an unsharded run.

``cohort`` finds the submissions (:mod:`grader.intake`; ``intake.csv`` says what was taken and what
was skipped and why), places them on the roster (:mod:`grader.roster`), grades its shard, and writes
``cohort.json``: the lab, the shard K/N and a hash of the whole submission set, so ``merge`` can refuse
shards that are missing, given twice, or graded from different folders. The gradebook itself
(:mod:`grader.gradebook`) is rebuilt from the results on every run, with the instructor's overrides,
written-answer scores and late policy applied on top.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
import tempfile
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from grader.checks import exercises
from grader.gradebook import lab_csv, lab_rows, plain_name, text_cell, write_lab
from grader.intake import file_sha256, find_submissions, one_per_learner
from grader.late import from_mtime, iso, parse_time
from grader.report import junit_xml, sanitize_result, sanitize_text, write_reports
from grader.roster import assign, read_roster

# Files and folders ``cohort`` writes next to the result folders; no result folder may take their names.
_OUT_FILES = frozenset({"gradebook.csv", "gradebook.json", "junit.xml", "intake.csv", "cohort.json"})
UNPACKED = "_unpacked"  # archives are unpacked here, inside the output folder (a slug never starts with _)
SETTINGS = ("overrides", "scores", "due", "late_policy", "times")


class NoSubmissions(ValueError):
    """The submissions folder holds nothing to grade."""


class IncompleteShards(ValueError):
    """``merge`` was given shards that do not make one whole cohort."""


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
    """The notebooks of ``folder`` that ``cohort`` grades (outside archives), in name order; shard K/N
    takes every N-th from the K-th."""
    with tempfile.TemporaryDirectory() as tmp:
        found = find_submissions(Path(folder), Path(tmp) / UNPACKED).found
    entries = [{"submission": f.submission, "path": f.path} for f in found if Path(tmp) not in f.path.parents]
    return [e["path"] for e in shard_of(entries, shard)]


def shard_of(entries: list[dict], shard: tuple[int, int]) -> list[dict]:
    """Shard K/N of the submissions (in name order): every N-th from the K-th."""
    k, n = shard
    ordered = sorted(entries, key=lambda e: e["submission"])
    return [e for i, e in enumerate(ordered) if i % n == k - 1]


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


_text_cell = text_cell  # the name scripts and tests of earlier versions import


def gradebook_csv(results: list[dict], lab: str) -> str:
    """The gradebook of ``results`` alone (one row per submission, learners by file stem), as ``cohort``
    writes it without roster, overrides, scores or due date."""
    results = [sanitize_result(r) for r in results]
    entries = [{"learner": Path(r["submission"]).stem, "submission": r["submission"]} for r in results]
    ids = list(exercises(lab))
    max_score = float(sum(ex.points for ex in exercises(lab).values()))
    _, rows, _ = lab_rows(lab, ids, max_score, entries, {e["learner"]: r for e, r in zip(entries, results)}, [], {})
    return lab_csv(ids, [], rows)


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


def learner_dir(out: Path, learner: str) -> Path:
    """The result folder of one learner (``alice`` -> ``out/alice``; see :func:`result_dir`)."""
    return result_dir(out, f"{learner}.ipynb")


def make_settings(lab: str, overrides=None, scores=None, due=None, late_policy=None, times=None) -> dict:
    """The instructor's additions to the gradebook, checked now (a bad file fails before any grading).
    Files are kept as absolute paths and read again on every gradebook build, so edits show up."""
    settings = {"overrides": overrides, "scores": scores, "due": due, "late_policy": late_policy, "times": times}
    for key in ("overrides", "scores", "times"):
        if settings[key]:
            settings[key] = str(Path(settings[key]).resolve())
    if due:
        settings["due"] = iso(parse_time(due, "--due"))
    if late_policy and not due:
        raise ValueError("--late-policy needs --due (the time submissions are late after).")
    ids = list(exercises(lab))
    lab_rows(lab, ids, 0.0, [], {}, [], settings)  # reads every file: a bad row fails here
    return settings


def plan(folder: Path, lab: str, out: Path, roster=None) -> dict:
    """Who submitted what: ``entries`` (one per learner, with the file to grade under ``path``),
    ``missing`` (roster learners without a submission), ``intake`` (rows of intake.csv) and the
    ``set_sha256`` of the whole set."""
    inside = out.resolve().is_relative_to(folder.resolve())
    intake = find_submissions(folder, out / UNPACKED, exclude=out if inside else None)
    found, skipped, notes = intake.found, list(intake.skipped), {}
    people = read_roster(roster) if roster else None
    if people is not None:
        found, unplaced = assign(found, people)
        notes = dict(unplaced)
    kept, duplicates = one_per_learner(found, lab)
    skipped += duplicates
    identity = {p.learner: p.identity() for p in people or []}
    entries = []
    for f in kept:
        entries.append({"learner": f.learner, "submission": f.submission, "folder": learner_dir(out, f.learner).name,
                        "sha256": file_sha256(f.path), "mtime_at": from_mtime(f.mtime), "stamp_at": f.stamp,
                        "notes": [notes[f.submission]] if f.submission in notes else [],
                        **identity.get(f.learner, {}), "path": str(f.path)})
    taken = {e["learner"] for e in entries}
    missing = [{"learner": p.learner, **p.identity()} for p in people or [] if p.learner not in taken]
    rows = [{"file": e["submission"], "learner": e["learner"], "action": "graded", "reason": "; ".join(e["notes"])}
            for e in entries]
    rows += [{"file": name, "learner": "", "action": "skipped", "reason": why} for name, why in skipped]
    rows += [{"file": "", "learner": m["learner"], "action": "missing", "reason": "on the roster, no submission found"}
             for m in missing]
    digest = hashlib.sha256(json.dumps([[e["learner"], e["submission"], e["sha256"]] for e in entries]
                                       + [m["learner"] for m in missing]).encode())
    return {"entries": entries, "missing": missing, "intake": rows, "set_sha256": digest.hexdigest()}


def intake_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["file", "learner", "action", "reason"])
    for r in rows:
        writer.writerow([_text(r["file"]), _text(r["learner"]), r["action"], _text(r["reason"])])
    return buf.getvalue()


def _text(value) -> str:
    return text_cell(sanitize_text(value, 1000, single_line=True))


def _say_intake(plan_: dict, folder: Path, out: Path, say) -> None:
    """Print what intake skipped, did not place on the roster, or found missing."""
    for r in plan_["intake"]:
        if r["action"] == "skipped":
            say(f"skipped {r['file']}: {r['reason']}")
        elif r["action"] == "graded" and r["reason"]:
            say(f"{r['file']} ({r['learner']}): {r['reason']}")
    missing = [m["learner"] for m in plan_["missing"]]
    if missing:
        say(f"no submission from {len(missing)} roster learners: {', '.join(missing)} (status `missing`, 0 points)")
    say(f"found {len(plan_['entries'])} submissions in {folder}; the whole intake is in {out / 'intake.csv'}")


def cohort(folder, lab: str, out, jobs: int = 2, shard: str | None = None, progress: bool = True,
           roster=None, overrides=None, scores=None, due=None, late_policy=None, times=None, say=None,
           dry_run: bool = False, **grade_kwargs) -> list[dict]:
    """Grade every submission of ``folder`` (or one shard of it) with ``jobs`` in parallel; write the
    results, ``intake.csv``, ``cohort.json`` and the gradebook into ``out``. ``say`` (e.g. print) hears
    what intake skipped. NoSubmissions when there is nothing to grade. ``dry_run`` stops after
    ``intake.csv``: nothing is graded, and the result is empty."""
    from grader.grade import grade

    folder, out = Path(folder), Path(out)
    exercises(lab)  # an unknown lab fails before any work
    k, n = parse_shard(shard)
    if out.resolve() == folder.resolve():
        raise ValueError("--out is the submissions folder; write the grades to a folder of their own.")
    settings = make_settings(lab, overrides, scores, due, late_policy, times)
    plan_ = plan(folder, lab, out, roster)
    out.mkdir(parents=True, exist_ok=True)
    (out / "intake.csv").write_text(intake_csv(plan_["intake"]), encoding="utf-8")
    if say:
        _say_intake(plan_, folder, out, say)
    if not plan_["entries"]:
        skipped = sum(r["action"] == "skipped" for r in plan_["intake"])
        raise NoSubmissions(f"found no submissions in {folder}. cohort takes .ipynb files (any case), also in a "
                            f"folder per learner and inside .zip archives; it skipped {skipped} files, each with "
                            f"its reason in {out / 'intake.csv'}. Check the folder, then run cohort again.")
    mine = shard_of(plan_["entries"], (k, n))
    if dry_run:
        return []
    device = grade_kwargs.get("device", "cpu")

    def one(entry: dict) -> dict:
        folder_ = out / entry["folder"]
        try:
            result = grade(Path(entry["path"]), lab=lab, log_path=folder_ / "grader.log", **grade_kwargs)
            if not _is_result(result):
                raise TypeError(f"grade returned {type(result).__name__}, not a result")
            result = sanitize_result({**result, "submission": entry["submission"]})
        except Exception as exc:  # a grader bug must not stop the batch either
            result = sanitize_result(invalid_result(lab, entry["submission"], f"internal grader error: "
                                                    f"{type(exc).__name__}: {exc}", device))
        return report_or_record(result, folder_)

    results: dict[str, dict] = {}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(mine), desc=f"grading {lab}", unit="submission")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # the work happens in child processes
        futures = {pool.submit(one, e): e["learner"] for e in mine}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    entries = [{k_: v for k_, v in e.items() if k_ != "path"} for e in mine]
    meta = {"schema": 1, "lab": lab, "shard": [k, n], "submissions": len(plan_["entries"]),
            "set_sha256": plan_["set_sha256"], "settings": settings, "entries": entries, "missing": plan_["missing"]}
    (out / "cohort.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    unknown = write_gradebook(out, lab, entries, results, plan_["missing"], settings)
    if say and unknown and n == 1:
        say(_unknown_message(unknown))
    return sorted(results.values(), key=lambda r: r["submission"])


def _unknown_message(unknown: list[str]) -> str:
    return (f"--overrides/--scores name learners not in this gradebook (a typo?): {', '.join(unknown)}; "
            "their rows are ignored.")


def write_gradebook(out: Path, lab: str, entries: list[dict], results: dict[str, dict], missing: list[dict],
                    settings: dict) -> list[str]:
    """``gradebook.csv``/``.json``, the instructor's part of each feedback.md, and ``junit.xml``; returns
    the learners your overrides or scores name but the gradebook does not hold."""
    ids = list(exercises(lab))
    max_score = float(sum(ex.points for ex in exercises(lab).values()))
    questions, rows, unknown = lab_rows(lab, ids, max_score, entries, results, missing, settings)
    write_lab(out, lab, ids, questions, rows, settings)
    ordered = sorted(results.values(), key=lambda r: r["submission"])
    (out / "junit.xml").write_text(junit_xml(ordered, suite=f"cohort {lab}"), encoding="utf-8")
    return unknown


def _read_meta(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / "cohort.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    shard = meta.get("shard")
    ok = (isinstance(meta.get("lab"), str) and isinstance(meta.get("set_sha256"), str)
          and isinstance(shard, list) and len(shard) == 2 and all(isinstance(v, int) for v in shard)
          and isinstance(meta.get("entries"), list) and isinstance(meta.get("missing", []), list)
          and all(isinstance(e, dict) and plain_name(e.get("folder")) and isinstance(e.get("learner"), str)
                  for e in meta["entries"])
          and all(isinstance(m, dict) and isinstance(m.get("learner"), str) for m in meta.get("missing", [])))
    return meta if ok else None



def shard_problems(dirs: list[Path], metas: list[dict | None]) -> list[str]:
    """Why ``dirs`` are not the complete set of shards of one cohort (empty when they are)."""
    problems = [f"{d} has no cohort.json (not written by `cohort`, or damaged)" for d, m in zip(dirs, metas)
                if m is None]
    given = [(d, m) for d, m in zip(dirs, metas) if m is not None]
    if not given:
        return problems
    splits = {m["shard"][1] for _, m in given}
    sets = {(m["set_sha256"], m.get("submissions")) for _, m in given}
    if len(splits) > 1:
        problems.append("the shards split the cohort differently: " +
                        ", ".join(f"{d} is {m['shard'][0]}/{m['shard'][1]}" for d, m in given))
    if len(sets) > 1:
        problems.append("the shards were graded from different sets of submissions (the folder changed between "
                        "them, or another roster was used): " +
                        ", ".join(f"{d} saw {m.get('submissions')}" for d, m in given) +
                        "; grade every shard from the same folder")
    if len(splits) == 1:
        n = splits.pop()
        seen: dict[int, Path] = {}
        for d, m in given:
            k = m["shard"][0]
            if k in seen:
                problems.append(f"shard {k}/{n} is given twice ({seen[k]} and {d})")
            seen[k] = d
        absent = [k for k in range(1, n + 1) if k not in seen]
        if absent:
            problems.append(f"shard{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))} of {n} "
                            f"{'are' if len(absent) > 1 else 'is'} missing")
    return problems


def _merged_settings(metas: list[dict | None], given: dict) -> dict:
    """Each setting from ``given`` (merge's own options) or else as the shards were graded (they must agree)."""
    settings = {}
    for key in SETTINGS:
        if given.get(key) is not None:
            settings[key] = given[key]
            continue
        values = {(m.get("settings") or {}).get(key) for m in metas if m is not None}
        if len(values) > 1:
            raise ValueError(f"the shards were graded with different --{key.replace('_', '-')} "
                             f"({', '.join(sorted(map(str, values)))}); pass the one you mean to merge.")
        settings[key] = values.pop() if values else None
    return settings


def merge(dirs: list, out, allow_incomplete: bool = False, say=None, **given) -> list[dict]:
    """Combine the results of cohort shard folders into one gradebook, exactly the unsharded run's.

    IncompleteShards when shards are missing, given twice, or from different submission sets, unless
    ``allow_incomplete``. ``given`` may set ``overrides``, ``scores``, ``due``, ``late_policy``, ``times``;
    what it leaves out is taken from the shards."""
    dirs, out = [Path(d) for d in dirs], Path(out)
    metas = [_read_meta(d) for d in dirs]
    loaded = [_with_result(d, entry) for d, m in zip(dirs, metas)
              for entry in (m["entries"] if m is not None else _entries_without_meta(d))]
    problems = shard_problems(dirs, metas)
    if problems and not allow_incomplete:
        raise IncompleteShards("refusing to merge an incomplete set of shards: " + "; ".join(problems) +
                               ". Grade the missing shards (same folder, same --shard N) or pass "
                               "--allow-incomplete to merge what is there.")
    labs = {m["lab"] for m in metas if m is not None} | {r.get("lab") for _, r in loaded}
    entries: dict[str, dict] = {}
    results: dict[str, dict] = {}
    for entry, result in loaded:
        # the folder keeps the name cohort gave it, so merged shards look like one run
        results[entry["learner"]] = report_or_record(result, out / entry["folder"])
        entries[entry["learner"]] = entry
    missing = {p["learner"]: p for m in metas if m is not None for p in m.get("missing", [])}
    labs.discard(None)
    if len(labs) != 1:
        raise ValueError(f"merge needs results of exactly one lab, found {sorted(labs) or 'none'}.")
    lab = labs.pop()
    settings = make_settings(lab, **_merged_settings(metas, given))
    missing_ = [p for learner, p in sorted(missing.items()) if learner not in entries]
    entry_list = sorted(entries.values(), key=lambda e: e["submission"])
    meta = {"schema": 1, "lab": lab, "shard": [1, 1], "submissions": len(entry_list),
            "set_sha256": next((m["set_sha256"] for m in metas if m is not None), ""), "settings": settings,
            "entries": entry_list, "missing": missing_}
    out.mkdir(parents=True, exist_ok=True)
    (out / "cohort.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    intake = next((d / "intake.csv" for d in dirs if (d / "intake.csv").exists()), None)
    if intake is not None and intake.resolve() != (out / "intake.csv").resolve():
        shutil.copyfile(intake, out / "intake.csv")
    unknown = write_gradebook(out, lab, entry_list, results, missing_, settings)
    if say and unknown:
        say(_unknown_message(unknown))
    return sorted(results.values(), key=lambda r: r["submission"])


def _entries_without_meta(folder: Path) -> list[dict]:
    """Entries for a folder without cohort.json (``--allow-incomplete``): one per result folder."""
    return [{"learner": p.parent.name, "folder": p.parent.name} for p in sorted(folder.glob("*/result.json"))]


def _with_result(folder: Path, entry: dict) -> tuple[dict, dict]:
    result = _load_result(folder / entry["folder"] / "result.json")
    return ({**entry} if "submission" in entry else {**entry, "submission": result["submission"]}), result


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
