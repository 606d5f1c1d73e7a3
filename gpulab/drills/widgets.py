"""The drills as ipywidgets, and their text-mode fallback (drills notebook of lesson 16).

- :func:`drill_widget` / :func:`show_drill`: a timer, an answer box, Submit (stops the clock; the follow-ups appear
  with their own boxes, the rubric as checkboxes, the strong and weak sample answers); outside a notebook front end,
  :func:`show_drill` prints the question and :func:`answer_drill` / :func:`answer_followup` do the same in text.
- :func:`estimation_widget` / :func:`show_estimation`: the quick-fire estimation set, one question at a time, checked
  within its tolerance, the worked solution after each answer; :func:`check_estimate` in text.
Every widget has a text/HTML rendering (:func:`drill_record`), so a saved notebook reads without a kernel.
"""
from __future__ import annotations

import html
import threading
import time
from typing import Callable

from gpulab.drills.bank import BY_ID
from gpulab.drills.drill import Drill
from gpulab.drills.estimation import BY_ESTIMATE, ESTIMATES, QUICK_S, EstimateRun
from gpulab.drills.questions import LAB_TITLES, Question
from gpulab.drills.store import DrillStore

_PRE = "<pre style='white-space:pre-wrap;word-break:normal;overflow-wrap:break-word'>{}</pre>"


def lab_links(question: Question) -> str:
    """Markdown links to the lessons (beside the drills notebook) and labs whose numbers the answer cites."""
    return "; ".join(f"[{stem}]({stem}.ipynb) ({LAB_TITLES.get(stem, '')}, lab: [../labs/{stem}.ipynb]"
                     f"(../labs/{stem}.ipynb))" for stem in question.labs)


def _in_notebook() -> bool:
    from gpulab.feedback import _in_notebook as front_end

    return front_end()


def drill_record(qid: str, record: dict) -> tuple[str, str]:
    """``(text, html)``: drill ``qid`` and what ``record`` holds (answer, time, self-score, follow-up answers),
    readable without a kernel or widgets: a notebook viewer shows it where the live drill cannot run."""
    q = BY_ID[qid]
    answer = record.get("answer", "").strip()
    minutes = f"{record['elapsed_s'] / 60:.1f} of {q.minutes} min" if "elapsed_s" in record else f"{q.minutes} min"
    score = f", self-score {record['score']}" if record.get("score") else ""
    saved = f" (saved {record['saved']})" if record.get("saved") else ""
    followups = [(i, a.strip()) for i, a in enumerate(record.get("followups", [])) if a.strip()]
    text = (f"{q.qid} ({minutes}{score}): {q.prompt}\n"
            f"  your answer{saved}: {answer or '(none yet)'}")
    text += "".join(f"\n  follow-up {i + 1}: {a}" for i, a in followups)
    body = _PRE.format(html.escape(answer)) if answer else "<p><i>No answer saved yet.</i></p>"
    body += "".join(f"<p><b>Follow-up {i + 1}</b>:</p>" + _PRE.format(html.escape(a)) for i, a in followups)
    page = (f"<div class='gpulab-drill'><h4>{q.qid} · {minutes}{html.escape(score)}</h4><p>{html.escape(q.prompt)}</p>"
            f"<p><b>Your answer</b>{html.escape(saved)}:</p>{body}"
            f"<p><i>Run this cell in JupyterLab for the timer, the answer box and the rubric.</i></p></div>")
    return text, page


def _samples_html(drill: Drill) -> str:
    strong, weak, gap = drill.samples()
    return ("<p><b>A strong answer</b> covers:</p><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in strong)
            + f"</ul><p><b>A weak answer</b>: <i>{html.escape(weak)}</i></p><p><b>What it lacks</b>: "
            f"{html.escape(gap)}</p>")


def _box_class(record: Callable):
    """A VBox whose text/HTML rendering is ``record(box)``: a viewer without widgets still shows the work."""
    import ipywidgets as w

    class RecordedBox(w.VBox):
        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            data = bundle[0] if isinstance(bundle, tuple) else bundle
            data["text/plain"], data["text/html"] = record(self)
            return bundle

    return RecordedBox


def drill_widget(qid: str, store: DrillStore | None = None, clock: Callable[[], float] = time.monotonic,
                 ticking: bool = True):
    """The drill as an ipywidgets box: Start (the timer counts down in a background thread when ``ticking``), an
    answer box saved on every change, Submit (stops the clock; then the follow-ups with their own boxes, the rubric
    as checkboxes saved as ticked, and the sample answers), and the links. A drill submitted in an earlier session
    opens with all of that restored. Returns the box; ``box.drill`` is the :class:`Drill` behind it."""
    import ipywidgets as w

    drill = Drill(qid, store, clock)
    q, saved = drill.question, drill.record
    timer = w.HTML(f"<b>{q.minutes} min</b> — press Start")
    answer = w.Textarea(value=saved.get("answer", ""), placeholder="Your answer: outline first, numbers next.",
                        layout=w.Layout(width="100%", height="180px"))
    start, reveal = w.Button(description="Start", button_style="primary"), w.Button(description="Submit answer")
    followup_box, rubric_box, samples_box = w.VBox([]), w.VBox([]), w.VBox([])

    def tick():
        timer.value = f"<b>{drill.timer_text()}</b>"

    def run_clock():
        while drill.started_at is not None and drill.stopped_at is None:
            tick()
            time.sleep(1.0)
        tick()

    def on_start(_):
        drill.start()
        tick()
        if ticking:
            threading.Thread(target=run_clock, daemon=True).start()

    def on_answer(change):
        drill.save(change["new"])

    def show_after_submit():
        earlier = drill.record.get("followups", [])
        boxes = []
        for i, text in enumerate(drill.followups()):
            box = w.Textarea(value=earlier[i] if i < len(earlier) else "", layout=w.Layout(width="100%"),
                             placeholder="Your answer to the follow-up.")
            box.observe(lambda change, i=i: drill.save_followup(i, change["new"]), names="value")
            boxes += [w.HTML(f"<p><b>Follow-up {i + 1}</b>: {html.escape(text)}</p>"), box]
        followup_box.children = [w.HTML("<b>The interviewer follows up</b> (answer as you would aloud):")] + boxes
        ticked = set(drill.record.get("checked", []))
        checks = [w.Checkbox(value=i in ticked, description=point, indent=False, layout=w.Layout(width="100%"))
                  for i, point in enumerate(q.rubric)]
        for check in checks:
            check.observe(lambda _: drill.check([i for i, b in enumerate(checks) if b.value]), names="value")
        rubric_box.children = [w.HTML("<b>Rubric</b>: tick what your answer covered.")] + checks
        calibration = w.Accordion(children=[w.HTML(_samples_html(drill))], selected_index=None)
        calibration.set_title(0, "Calibrate: a strong and a weak sample answer")
        samples_box.children = [calibration]

    def on_reveal(_):
        drill.save(answer.value)
        try:
            drill.reveal()
        except ValueError as err:  # nothing written yet: say so beside the timer, reveal nothing
            timer.value = f"<b>{html.escape(str(err))}</b>"
            return
        show_after_submit()
        tick()

    start.on_click(on_start)
    reveal.on_click(on_reveal)
    answer.observe(on_answer, names="value")
    if drill.submitted:
        show_after_submit()
    header = w.HTML(f"<h4>{q.qid} · {q.minutes} min</h4><p>{html.escape(q.prompt)}</p>")
    links = w.HTML("<p>Cite your measurements from: " + ", ".join(
        f"<a href='{stem}.ipynb' target='_blank'>{stem}</a>" for stem in q.labs) + "</p>")
    box = _box_class(lambda b: drill_record(qid, b.drill.record))(
        [header, w.HBox([start, timer]), answer, reveal, followup_box, rubric_box, samples_box, links])
    box.drill, box.parts = drill, dict(start=start, answer=answer, reveal=reveal, rubric=rubric_box, timer=timer,
                                       followups=followup_box, samples=samples_box)
    return box


def show_drill(qid: str) -> None:
    """Display drill ``qid`` as a widget in a notebook; elsewhere print the question and how to answer it."""
    if _in_notebook():
        from IPython.display import display

        display(drill_widget(qid))
        return
    q = BY_ID[qid]
    print(f"{q.qid} ({q.minutes} min): {q.prompt}\n  cite: {', '.join(q.labs)}\n"
          f"  answer in text with answer_drill({q.qid!r}, 'your answer'): the follow-ups, the rubric and the sample "
          f"answers follow (or open this notebook in JupyterLab for the timer and the answer box)")


def answer_drill(qid: str, answer: str, store: DrillStore | None = None) -> list[str]:
    """Text mode: save ``answer`` as drill ``qid``'s first answer, submit it, print the follow-ups, the rubric and
    the sample answers; returns the follow-ups. Answer them with :func:`answer_followup`."""
    drill = Drill(qid, store)
    drill.save(answer)
    rubric = drill.reveal()
    followups = drill.followups()
    strong, weak, gap = drill.samples()
    print(f"{qid}: saved. The interviewer follows up (answer_followup({qid!r}, n, 'your answer')):")
    print("\n".join(f"  {n}. {text}" for n, text in enumerate(followups, 1)))
    print("Rubric (what a strong answer covers):\n" + "\n".join(f"  - {point}" for point in rubric))
    print("A strong answer:\n" + "\n".join(f"  + {point}" for point in strong))
    print(f"A weak answer: {weak}\n  what it lacks: {gap}")
    return followups


def answer_followup(qid: str, n: int, answer: str, store: DrillStore | None = None) -> None:
    """Text mode: save ``answer`` to follow-up ``n`` (1-based, as printed) of drill ``qid``."""
    Drill(qid, store).save_followup(n - 1, answer)
    print(f"{qid} follow-up {n}: saved.")


def check_estimate(qid: str, answer: str, store: DrillStore | None = None) -> bool:
    """Text mode: check ``answer`` to estimation question ``qid``, print the verdict and the worked solution, save
    the attempt; returns whether it was within the tolerance."""
    verdict = EstimateRun(qid, store or DrillStore()).check(answer)
    print(f"{qid}: {verdict.message}")
    if verdict.read is not None:
        print(BY_ESTIMATE[qid].solution())
    return verdict.ok


def estimation_widget(store: DrillStore | None = None, clock: Callable[[], float] = time.monotonic,
                      ticking: bool = True):
    """The quick-fire set, one question at a time: an answer box, Check (the verdict, then the worked solution),
    Previous / Next, and an optional 30-second timer (shown, never judged). A question answered in an earlier
    session shows its saved answer and solution. Returns the box; ``box.parts`` holds its widgets."""
    import ipywidgets as w

    store = store or DrillStore()
    state = {"index": 0, "run": None, "checked": False}
    header, verdict, solution = w.HTML(), w.HTML(), w.HTML()
    answer = w.Text(placeholder="e.g. 208 GB, 2.1e11, 1.5k, 3 ms")
    check = w.Button(description="Check", button_style="primary")
    prev, nxt = w.Button(description="Previous"), w.Button(description="Next")
    timed, timer = w.Checkbox(value=False, description=f"{QUICK_S} s timer", indent=False), w.HTML()

    def run_clock(run):
        while timed.value and state["run"] is run and not state["checked"]:
            timer.value = f"{run.seconds():.0f} s of {QUICK_S}"
            time.sleep(1.0)

    def show(index):
        state["index"] = index % len(ESTIMATES)
        estimate = ESTIMATES[state["index"]]
        run = EstimateRun(estimate.qid, store, clock)
        run.start()
        state.update(run=run, checked=False)
        header.value = (f"<h4>{estimate.qid} · {html.escape(estimate.topic)} ({state['index'] + 1} of "
                        f"{len(ESTIMATES)})</h4><p>{html.escape(estimate.prompt())}</p>")
        saved = store.get(estimate.qid)
        answer.value = saved.get("answer", "")
        verdict.value = solution.value = timer.value = ""
        if saved.get("answer"):
            mark = "right ✅" if saved.get("ok") else "not yet ❌"
            verdict.value = f"<p>Saved answer: {html.escape(saved['answer'])} ({mark})</p>"
            solution.value = _PRE.format(html.escape(estimate.solution()))
        if timed.value and ticking:
            threading.Thread(target=run_clock, args=(run,), daemon=True).start()

    def on_check(_):
        run = state["run"]
        result = run.check(answer.value)
        state["checked"] = True
        mark = "✅" if result.ok else "❌"
        note = run.timer_note() if timed.value else ""
        verdict.value = f"<p>{mark} {html.escape(result.message)}{' · ' + note if note else ''}</p>"
        if result.read is not None:
            solution.value = _PRE.format(html.escape(run.estimate.solution()))

    check.on_click(on_check)
    prev.on_click(lambda _: show(state["index"] - 1))
    nxt.on_click(lambda _: show(state["index"] + 1))
    timed.observe(lambda _: show(state["index"]), names="value")
    show(0)

    def record(_box):
        rows = estimation_summary(store)
        text = f"Estimation: {rows['answered']}/{rows['total']} answered, {rows['right']} right"
        return text, f"<p><b>{html.escape(text)}</b> (run this cell in JupyterLab for the questions)</p>"

    box = _box_class(record)([header, w.HBox([answer, check, timed, timer]), verdict, solution, w.HBox([prev, nxt])])
    box.parts = dict(header=header, answer=answer, check=check, verdict=verdict, solution=solution, prev=prev,
                     next=nxt, timed=timed, timer=timer)
    return box


def estimation_summary(store: DrillStore | None = None) -> dict:
    """``{"total", "answered", "right"}`` over the estimation set, from the saved attempts."""
    data = (store or DrillStore()).load()
    answered = [e.qid for e in ESTIMATES if data.get(e.qid, {}).get("answer")]
    return {"total": len(ESTIMATES), "answered": len(answered), "right": sum(bool(data[q].get("ok")) for q in answered)}


def show_estimation() -> None:
    """Display the estimation set as a widget in a notebook; elsewhere print every question and how to answer."""
    if _in_notebook():
        from IPython.display import display

        display(estimation_widget())
        return
    for e in ESTIMATES:
        print(f"{e.qid} ({e.topic}): {e.prompt()}")
    print("Answer in text with check_estimate('E-...', 'your number and unit'), e.g. check_estimate('E-ZERO-DDP', "
          "'200 GB').")
