"""One drill's logic on an injectable clock, without widgets (drills notebook of lesson 16): ``start()``,
``remaining()``, ``save(text)``, ``reveal()`` (submits the first answer: stops the clock, returns the rubric and
unlocks the follow-ups and the sample answers), ``followups()``, ``save_followup(i, text)``, ``check(indices)``
(the self-grade). Tests drive it directly; :mod:`gpulab.drills.widgets` draws it."""
from __future__ import annotations

import time
from typing import Callable

from gpulab.drills.bank import BY_ID
from gpulab.drills.questions import personalise
from gpulab.drills.store import DrillStore


class Drill:
    """One drill on a clock (``clock()`` in seconds; :func:`time.monotonic` by default)."""

    def __init__(self, qid: str, store: DrillStore | None = None, clock: Callable[[], float] = time.monotonic):
        if qid not in BY_ID:
            raise KeyError(f"no drill {qid!r}; the drills are {', '.join(BY_ID)}")
        self.question, self.store, self.clock = BY_ID[qid], store or DrillStore(), clock
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    @property
    def record(self) -> dict:
        return self.store.get(self.question.qid)

    @property
    def submitted(self) -> bool:
        """Whether the first answer was submitted (in this session or an earlier one)."""
        return bool(self.record.get("revealed"))

    def start(self) -> None:
        self.started_at, self.stopped_at = self.clock(), None
        self.store.update(self.question.qid, started=time.strftime("%Y-%m-%d %H:%M:%S"), revealed=False)

    def elapsed(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.stopped_at if self.stopped_at is not None else self.clock()) - self.started_at

    def remaining(self) -> float:
        """Seconds left (negative once over time)."""
        return self.question.minutes * 60 - self.elapsed()

    def timer_text(self) -> str:
        left = self.remaining()
        sign, left = ("-", -left) if left < 0 else ("", left)
        state = "not started" if self.started_at is None else ("over time" if sign else "left")
        return f"{sign}{int(left) // 60:02d}:{int(left) % 60:02d} {state}"

    def _timing(self) -> dict:
        """The time taken, when this session timed the drill; {} otherwise, so that editing an answer or revealing
        the rubric again in a later session keeps the time recorded when the drill was done."""
        return {} if self.started_at is None else {"elapsed_s": round(self.elapsed(), 1)}

    def save(self, answer: str) -> None:
        self.store.update(self.question.qid, answer=answer, **self._timing())

    def reveal(self) -> tuple:
        """Submit the first answer: stop the clock, unlock the follow-ups and samples, return the rubric. An empty
        answer cannot be submitted: the follow-ups push on what it says."""
        if not self.record.get("answer", "").strip():
            raise ValueError(f"{self.question.qid}: write your answer first; the follow-ups push on what it says")
        if self.started_at is not None and self.stopped_at is None:
            self.stopped_at = self.clock()
        self.store.update(self.question.qid, revealed=True, **self._timing())
        return self.question.rubric

    def _require_submitted(self, what: str) -> None:
        if not self.submitted:
            raise RuntimeError(f"{self.question.qid}: submit your first answer before the {what} (Submit in the "
                               f"widget, or answer_drill({self.question.qid!r}, 'your answer') in text)")

    def followups(self) -> list[str]:
        """The follow-ups, quoting your own numbers where they ask about them; only after :meth:`reveal`."""
        self._require_submitted("follow-ups")
        answer = self.record.get("answer", "")
        return [personalise(f, answer) for f in self.question.followups]

    def save_followup(self, index: int, text: str) -> dict:
        """Save your answer to follow-up ``index`` (0-based)."""
        self._require_submitted("follow-ups")
        if not 0 <= index < len(self.question.followups):
            raise IndexError(f"{self.question.qid} has follow-ups 0 to {len(self.question.followups) - 1}")
        answers = list(self.record.get("followups", []))
        answers += [""] * (len(self.question.followups) - len(answers))
        answers[index] = text
        return self.store.update(self.question.qid, followups=answers)

    def samples(self) -> tuple[tuple, str, str]:
        """``(strong points, weak answer, what the weak one lacks)``; only after :meth:`reveal`."""
        self._require_submitted("sample answers")
        q = self.question
        return q.strong, q.weak, q.gap

    def check(self, indices) -> dict:
        """Record which rubric points the answer covered (self-graded); returns the record."""
        rubric = self.question.rubric
        checked = sorted({int(i) for i in indices if 0 <= int(i) < len(rubric)})
        return self.store.update(self.question.qid, checked=checked, score=f"{len(checked)}/{len(rubric)}")
