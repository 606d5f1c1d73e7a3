"""Interview drills (drills notebook of lesson 16): every question the course prepares for, on a timer, with
scripted follow-ups that push on your own numbers, a rubric for self-grading, strong and weak sample answers to
calibrate against, a checked estimation set, a project story built from your lab measurements, and a progress view.

- :data:`QUESTIONS` / :data:`BY_ID`: the drills (:mod:`gpulab.drills.questions` describes a drill and its text
  format; :mod:`~gpulab.drills.core` holds the course's questions, :mod:`~gpulab.drills.scenarios` the design
  scenarios and the project story). :data:`FAMILIES`: the interview questions of ``shared/curriculum.md`` plus
  MLOps and the project story; every family has at least one drill.
- :class:`DrillStore` (:mod:`~gpulab.drills.store`): the answers, as JSON beside your drills notebook.
- :class:`Drill` (:mod:`~gpulab.drills.drill`): one drill's logic on an injectable clock.
- :mod:`~gpulab.drills.estimation`: :data:`ESTIMATES`, each checked by :func:`check_answer` within its tolerance.
- :mod:`~gpulab.drills.story`: :func:`project_story` from the measurements tables saved in your lessons.
- :mod:`~gpulab.drills.widgets`: :func:`show_drill`, :func:`show_estimation` (ipywidgets) and the text fallback
  :func:`answer_drill`, :func:`answer_followup`, :func:`check_estimate`.
- :mod:`~gpulab.drills.progress`: :func:`progress_rows` / :func:`show_progress`.
"""
from gpulab.drills.bank import BY_ID, QUESTIONS
from gpulab.drills.core import DRILLS_TEXT
from gpulab.drills.drill import Drill
from gpulab.drills.estimation import BY_ESTIMATE, ESTIMATES, Estimate, EstimateRun, Verdict, check_answer
from gpulab.drills.progress import progress_rows, show_progress
from gpulab.drills.questions import FAMILIES, FAMILY_TITLES, LAB_TITLES, Question, parse_drills, personalise
from gpulab.drills.scenarios import SCENARIOS_TEXT
from gpulab.drills.store import ANSWERS, DrillStore, drills_file
from gpulab.drills.story import project_story, show_project_story
from gpulab.drills.widgets import (
    _in_notebook,
    answer_drill,
    answer_followup,
    check_estimate,
    drill_record,
    drill_widget,
    estimation_summary,
    estimation_widget,
    lab_links,
    show_drill,
    show_estimation,
)

__all__ = ["ANSWERS", "BY_ESTIMATE", "BY_ID", "DRILLS_TEXT", "ESTIMATES", "FAMILIES", "FAMILY_TITLES", "LAB_TITLES",
           "QUESTIONS", "SCENARIOS_TEXT", "Drill", "DrillStore", "Estimate", "EstimateRun", "Question", "Verdict",
           "_in_notebook", "answer_drill", "answer_followup", "check_answer", "check_estimate", "drill_record",
           "drill_widget", "drills_file", "estimation_summary", "estimation_widget", "lab_links", "parse_drills",
           "personalise", "progress_rows", "project_story", "show_drill", "show_estimation", "show_progress",
           "show_project_story"]
