"""Due dates and the late policy (``--due``, ``--late-policy``, ``--times``).

A policy is one of ``none`` (lateness is recorded, nothing deducted), ``zero`` (a late submission scores
0) or ``percent-per-day:P`` (P percent of the lab's maximum per day or part of a day late, counted from
the due time), optionally after ``grace:HOURS,`` (submissions up to HOURS late lose nothing), e.g.
``grace:2,percent-per-day:10``. A penalty never takes a total below 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone

from grader.roster import read_csv_rows

POLICIES = "none, zero, percent-per-day:P, each optionally after grace:HOURS, (e.g. grace:2,percent-per-day:10)"


@dataclass(frozen=True)
class LatePolicy:
    kind: str = "none"          # none | zero | percent-per-day
    percent: float = 0.0        # per day, for percent-per-day
    grace_hours: float = 0.0

    def penalty(self, late_hours: float, points: float, max_score: float) -> float:
        """Points deducted from ``points`` (what the learner earned) for ``late_hours`` (0 when on time)."""
        if late_hours <= self.grace_hours or self.kind == "none":
            return 0.0
        if self.kind == "zero":
            return max(points, 0.0)
        days = math.ceil(late_hours / 24 - 1e-9)
        return min(max(points, 0.0), round(self.percent / 100 * max_score * days, 4))


def parse_policy(text: str | None) -> LatePolicy:
    if not text:
        return LatePolicy()
    kind, percent, grace = "", 0.0, 0.0
    try:
        for part in (p.strip().lower() for p in text.split(",")):
            name, _, value = part.partition(":")
            if name == "grace":
                grace = float(value)
            elif name == "percent-per-day":
                kind, percent = name, float(value)
            elif name in ("none", "zero") and not value:
                kind = name
            else:
                raise ValueError(part)
    except ValueError:
        raise ValueError(f"--late-policy {text!r} is not a policy; use {POLICIES}.") from None
    if not kind:
        raise ValueError(f"--late-policy {text!r} says nothing about late work after the grace period; "
                         "add zero, percent-per-day:P or none, e.g. grace:2,zero.")
    if percent < 0 or grace < 0 or not (math.isfinite(percent) and math.isfinite(grace)):
        raise ValueError(f"--late-policy {text!r}: percentages and hours cannot be negative.")
    return LatePolicy(kind, percent, grace)


def parse_time(text: str, what: str) -> datetime:
    """An ISO 8601 time (``2026-03-01T23:59``, ``...Z``, ``...+01:00``); one without a zone is UTC."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what} {text!r} is not an ISO 8601 time such as 2026-03-01T23:59:00+01:00.") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def from_mtime(mtime: float) -> str:
    return iso(datetime.fromtimestamp(mtime, tz=timezone.utc))


def read_times(path) -> dict[str, str]:
    """``--times FILE.csv`` (columns ``learner, submitted_at``): learner -> ISO time (UTC)."""
    times = {}
    for line, row in read_csv_rows(path, ("learner", "submitted_at"), "times file"):
        if row["learner"] in times:
            raise ValueError(f"{path}, line {line}: learner {row['learner']!r} appears twice.")
        times[row["learner"]] = iso(parse_time(row["submitted_at"], f"{path}, line {line}: submitted_at"))
    return times


def late_hours(submitted_at: str, due: str) -> float:
    """Hours from ``due`` to ``submitted_at`` (both ISO), 0 when on time."""
    delta = parse_time(submitted_at, "submitted_at") - parse_time(due, "--due")
    return max(0.0, round(delta.total_seconds() / 3600, 4))
