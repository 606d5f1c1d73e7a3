"""The drills' progress view: drills answered, follow-ups answered, estimation questions answered and right, read
from the answers file, so it survives a kernel restart (drills notebook of lesson 16)."""
from __future__ import annotations

from gpulab.drills.bank import QUESTIONS
from gpulab.drills.store import DrillStore
from gpulab.drills.widgets import estimation_summary


def progress_rows(store: DrillStore | None = None) -> list[dict]:
    """One row per drill: family, whether it was drilled (an answer saved), minutes taken, self-score, and how many
    of its follow-ups were answered."""
    data = (store or DrillStore()).load()
    rows = []
    for q in QUESTIONS:
        rec = data.get(q.qid, {})
        rows.append({"qid": q.qid, "family": q.family, "drilled": bool(rec.get("answer", "").strip()),
                     "revealed": bool(rec.get("revealed")), "minutes": round(rec.get("elapsed_s", 0) / 60, 1),
                     "limit": q.minutes, "score": rec.get("score", ""),
                     "followups": sum(bool(a.strip()) for a in rec.get("followups", [])),
                     "followups_total": len(q.followups)})
    return rows


def show_progress(store: DrillStore | None = None) -> None:
    """The progress view: which drills are done, their follow-ups, the estimation set (HTML table in Jupyter, text
    elsewhere)."""
    from gpulab.feedback import display_rich

    store = store or DrillStore()
    rows, est = progress_rows(store), estimation_summary(store)
    done = sum(r["drilled"] for r in rows)
    followups = sum(r["followups"] for r in rows)
    followups_total = sum(r["followups_total"] for r in rows)
    summary = (f"drilled {done}/{len(rows)}; follow-ups answered {followups}/{followups_total}; "
               f"estimation answered {est['answered']}/{est['total']}, {est['right']} right")
    text = [summary, "drill       done  minutes  self-score  follow-ups"]
    page = [f"<p><b>{summary}</b></p><table><tr><th>drill</th><th>done</th>"
            "<th>minutes (limit)</th><th>self-score</th><th>follow-ups</th></tr>"]
    for r in rows:
        mark = "yes" if r["drilled"] else "-"
        text.append(f"{r['qid']:<11} {mark:<5} {r['minutes']:>4}/{r['limit']:<3} {r['score']:<11} "
                    f"{r['followups']}/{r['followups_total']}")
        page.append(f"<tr><td>{r['qid']}</td><td>{'yes ✅' if r['drilled'] else 'not yet'}</td>"
                    f"<td>{r['minutes']} ({r['limit']})</td><td>{r['score']}</td>"
                    f"<td>{r['followups']}/{r['followups_total']}</td></tr>")
    page.append("</table>")
    display_rich("\n".join(text), "".join(page))
