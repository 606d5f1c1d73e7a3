"""Every drill, parsed once: the course's questions (:mod:`gpulab.drills.core`) then the scenario drills and the
project story (:mod:`gpulab.drills.scenarios`), in the notebook's order by family."""
from gpulab.drills.core import DRILLS_TEXT
from gpulab.drills.questions import FAMILIES, parse_drills
from gpulab.drills.scenarios import SCENARIOS_TEXT

QUESTIONS = sorted(parse_drills(DRILLS_TEXT) + parse_drills(SCENARIOS_TEXT),
                   key=lambda q: (FAMILIES.index(q.family), int(q.qid.rsplit("-", 1)[1])))
BY_ID = {q.qid: q for q in QUESTIONS}
