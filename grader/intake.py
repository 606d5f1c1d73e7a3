"""Intake: find the submissions in a folder the way course platforms deliver them.

- flat files, one per learner (``alice.ipynb``; Canvas/Moodle names such as
  ``alice_12345_678_02_triton_basics.ipynb``): the learner is the file's stem;
- a folder per learner (JupyterHub/nbgrader: ``alice/02_triton_basics.ipynb``, also deeper,
  ``alice/ps1/lab.ipynb``): the learner is the top folder's name;
- ``.zip`` archives, unpacked safely into the output folder (never next to the submissions): one
  holding a single notebook counts as a folder named after the archive (``alice.zip`` -> ``alice``);
  one at the top holding several notebooks (a platform's bulk download) is a submissions folder of its own.

Any case of ``.ipynb`` counts. nbgrader's ``timestamp.txt`` (in the notebook's folder or one above it,
within the learner's) gives the submission time. Checkpoints (``.ipynb_checkpoints``), hidden files and ``__MACOSX``
are skipped, as is everything else, and every skipped file is reported with its reason.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader.report import MAX_NAME, sanitize_text

# Limits of what one cohort unpacks (a zip bomb or a huge upload must not fill the disk).
MAX_MEMBER_BYTES = 64 * 2**20      # one notebook or inner archive
MAX_ARCHIVE_BYTES = 512 * 2**20    # everything unpacked from one archive
MAX_TOTAL_BYTES = 4 * 2**30        # everything unpacked by one cohort
MAX_MEMBERS = 5000                 # entries of one archive
MAX_DEPTH = 2                      # an archive inside an archive, no deeper


@dataclass
class Found:
    """One notebook found: ``submission`` names it as the instructor sees it (a path relative to the
    submissions folder; ``bulk.zip/alice/lab.ipynb`` inside an archive), ``path`` is the file to grade."""
    learner: str
    submission: str
    path: Path
    mtime: float
    stamp: str = ""  # the submission time nbgrader recorded (``timestamp.txt`` beside it), ISO, UTC


@dataclass
class Intake:
    found: list[Found] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why), in the order met


def is_notebook(name: str) -> bool:
    return name.lower().endswith(".ipynb")


def _stem(name: str) -> str:
    return name[:-len(".ipynb")] if is_notebook(name) else name[:-len(".zip")] if _is_zip(name) else name


def _is_zip(name: str) -> bool:
    return name.lower().endswith(".zip")


def _skip_reason(name: str) -> str | None:
    """Why a file or folder of this name is not looked at, or None."""
    if name == ".ipynb_checkpoints":
        return "Jupyter checkpoints (an autosave, not the submission)"
    if name == "__MACOSX":
        return "macOS archive metadata"
    if name.startswith(".") and not (is_notebook(name) and set(_stem(name)) <= {"."}):
        return "hidden"  # (a notebook named only dots, ``...ipynb``, is no tool's side file: it is graded)
    return None


def learner_of(parts: list[str]) -> str:
    """The learner a file belongs to: its top folder, or its own stem when it is not in a folder."""
    return parts[0] if len(parts) > 1 else _stem(parts[0])


def find_submissions(folder: Path, unpack_dir: Path, exclude: Path | None = None) -> Intake:
    """Every notebook under ``folder``, or in it when it is a ``.zip`` (archives unpacked into
    ``unpack_dir``, emptied first), sorted by submission name; ``exclude`` (the output folder, when it
    lies inside) is not searched."""
    folder = Path(folder)
    archive = folder.is_file() and _is_zip(folder.name)  # a platform's bulk download, passed as it came
    if not (folder.is_dir() or archive):
        raise ValueError(f"{folder} is neither a folder nor a .zip archive; pass the folder (or the .zip) that "
                         "holds the submissions.")
    if unpack_dir.exists():
        shutil.rmtree(unpack_dir)
    intake = _Walk(unpack_dir)
    if archive:
        intake.take([folder.name], folder, folder.name, folder.stat().st_mtime, depth=0)
        intake.found.sort(key=lambda f: f.submission)
        return intake
    excluded = exclude.resolve() if exclude else None
    for root, dirs, files in os.walk(folder):
        rel_root = Path(root).relative_to(folder)
        for d in sorted(dirs):
            path, rel = Path(root) / d, (rel_root / d).as_posix()
            reason = _skip_reason(d) or ("a symbolic link" if path.is_symlink() else None) or \
                ("the output folder" if excluded is not None and path.resolve() == excluded else None)
            if reason:
                intake.skip(rel + "/", reason)
                dirs.remove(d)
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            rel_parts = [*rel_root.parts, name]
            if path.is_symlink():
                intake.skip("/".join(rel_parts), "a symbolic link (copy the file itself in)")
                continue
            if name == "timestamp.txt" and len(rel_parts) > 1:
                intake.stamps[rel_root.as_posix()] = path
                continue
            intake.take(rel_parts, path, "/".join(rel_parts), path.stat().st_mtime, depth=0)
    for f in intake.found:
        f.stamp = intake.stamp_of(f)
    intake.found.sort(key=lambda f: f.submission)
    return intake


class _Walk(Intake):
    def __init__(self, unpack_dir: Path):
        super().__init__()
        self.unpack_dir = unpack_dir
        self.archives = 0
        self.unpacked_bytes = 0
        self.stamps: dict[str, Path] = {}  # folder (relative, posix) -> its nbgrader timestamp.txt

    def stamp_of(self, found: Found) -> str:
        """The time in the nearest timestamp.txt above ``found`` within its learner's folder, or ""."""
        parts = found.submission.split("/")[:-1]
        while parts:
            path = self.stamps.get("/".join(parts))
            if path is not None:
                when = nbgrader_time(path)
                if when:
                    return when
                self.skip("/".join([*parts, "timestamp.txt"]), "not a time nbgrader writes; the file's mtime is used")
                return ""
            parts.pop()
        return ""

    def skip(self, name: str, reason: str) -> None:
        self.skipped.append((_name(name), sanitize_text(reason, 1000, single_line=True)))

    def take(self, parts: list[str], path: Path, shown: str, mtime: float, depth: int) -> None:
        """Record the file ``path``, seen as ``parts`` (the learner's view of where it lies)."""
        name = parts[-1]
        reason = next((r for p in parts if (r := _skip_reason(p))), None)
        if reason:
            self.skip(shown, reason)
        elif is_notebook(name):
            self.found.append(Found(_name(learner_of(parts)), _name(shown), path, mtime))
        elif _is_zip(name):
            self.unzip(parts, path, shown, mtime, depth)
        else:
            self.skip(shown, "not a notebook (.ipynb) or an archive (.zip)")

    def unzip(self, parts: list[str], path: Path, shown: str, mtime: float, depth: int) -> None:
        if depth >= MAX_DEPTH:
            self.skip(shown, f"an archive inside an archive inside an archive (only {MAX_DEPTH} levels are opened)")
            return
        self.archives += 1
        dest = self.unpack_dir / str(self.archives)
        try:
            members = self._extract(path, dest, shown)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            self.skip(shown, f"an archive that cannot be read ({type(exc).__name__}: {exc})")
            return
        wanted = [m for m in members if is_notebook(m[0][-1]) or _is_zip(m[0][-1])]
        # A top-level archive of several notebooks is a platform's bulk download: its insides are learners.
        base = [] if len(parts) == 1 and len(wanted) > 1 else [*parts[:-1], _stem(parts[-1])]
        for member_parts, disk in members:
            self.take([*base, *member_parts], disk, f"{shown}/{'/'.join(member_parts)}", mtime, depth + 1)

    def _extract(self, path: Path, dest: Path, shown: str) -> list[tuple[list[str], Path]]:
        """Unpack the notebooks and archives of ``path`` into ``dest``; report every other entry."""
        out = []
        archive_bytes = 0
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise ValueError(f"{len(infos)} entries, more than {MAX_MEMBERS}")
            for info in infos:
                name = info.filename.replace("\\", "/")
                where = f"{shown}/{name}"
                if info.is_dir():
                    continue
                parts = _safe_parts(name)
                if parts is None:
                    self.skip(where, "an archive entry whose path leaves the archive (.. or absolute): not unpacked")
                    continue
                if stat.S_ISLNK(info.external_attr >> 16):
                    self.skip(where, "a symbolic link inside an archive: not unpacked")
                    continue
                reason = next((r for p in parts if (r := _skip_reason(p))), None)
                if reason or not (is_notebook(parts[-1]) or _is_zip(parts[-1])):
                    self.skip(where, reason or "not a notebook (.ipynb) or an archive (.zip)")
                    continue
                if info.flag_bits & 0x1:
                    self.skip(where, "encrypted inside the archive")
                    continue
                target = dest.joinpath(*parts)
                limit = min(MAX_MEMBER_BYTES, MAX_ARCHIVE_BYTES - archive_bytes,
                            MAX_TOTAL_BYTES - self.unpacked_bytes)
                written = _copy_capped(zf, info, target, limit)
                if written is None:
                    self.skip(where, f"unpacks to more than {limit / 2**20:.0f} MiB (the size cap): not unpacked")
                    continue
                archive_bytes += written
                self.unpacked_bytes += written
                out.append((parts, target))
        return out


def nbgrader_time(path: Path) -> str:
    """The ISO time (UTC) in an nbgrader ``timestamp.txt`` (``2026-03-01 23:59:01.123456 UTC``), or ""."""
    from grader.late import iso, parse_time

    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()[:100]
    except OSError:
        return ""
    for zone in (" UTC", " GMT", " Z"):
        text = text[:-len(zone)] + "+00:00" if text.endswith(zone) else text
    try:
        return iso(parse_time(text, "timestamp"))
    except ValueError:
        return ""


def _name(text: str) -> str:
    """A file or learner name as reports show it: one line, no control characters (a name from a
    learner's archive could hold terminal escapes)."""
    return sanitize_text(text, MAX_NAME, single_line=True)


def _safe_parts(name: str) -> list[str] | None:
    """The parts of an archive entry's path, or None when it is absolute or climbs out (``..``)."""
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return None
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return parts


def _copy_capped(zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, limit: int) -> int | None:
    """Copy one entry to ``target`` counting the bytes really unpacked (the header's size may lie);
    None, and nothing left on disk, when it exceeds ``limit``."""
    if info.file_size > limit:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with zf.open(info) as src, open(target, "wb") as dst:
        while chunk := src.read(1 << 20):
            written += len(chunk)
            if written > limit:
                break
            dst.write(chunk)
    if written > limit:
        target.unlink()
        return None
    return written


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def one_per_learner(found: list[Found], lab: str) -> tuple[list[Found], list[tuple[str, str]]]:
    """Keep one submission per learner: one whose name holds the lab's name (``02_triton_basics``, or
    ``triton_basics``) before others, then the newest; report the rest as skipped."""
    short = lab.split("_", 1)[-1].lower()
    by_learner: dict[str, list[Found]] = {}
    for f in found:
        by_learner.setdefault(f.learner, []).append(f)
    kept, skipped = [], []
    for learner, files in by_learner.items():
        files.sort(key=lambda f: (short not in PurePosixPath(f.submission).name.lower(), -f.mtime, f.submission))
        kept.append(files[0])
        skipped += [(f.submission, f"{learner} has another submission, {files[0].submission}, which is graded "
                                   "(one named after the lab, else the newest, wins)") for f in files[1:]]
    return sorted(kept, key=lambda f: (f.learner, f.submission)), skipped
