"""The drills themselves: :class:`Question` and the block format they are written in, parsed into
:data:`gpulab.drills.QUESTIONS` by :mod:`gpulab.drills.bank` (drills notebook of lesson 16).

A drill is a block of text: ``## <qid> | <minutes> min | labs <lab numbers>``, the prompt, then one line per item,
its kind given by its first two characters (a line starting with two spaces continues the item above):

- ``- `` a rubric point (what a strong answer covers; ticked for the self-grade);
- ``> `` a follow-up, revealed once the first answer is submitted. ``[[unit|words]]`` in it quotes the first
  number of that kind in your answer, else the words; ``[[s@p99|your p99]]`` the time written nearest to "p99"
  (``494 ms`` if you wrote "p99 494 ms");
- ``+ `` a point of the strong sample answer; ``~ `` the weak sample answer; ``! `` what the weak one lacks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gpulab.drills.units import UNITS, quantities_in

FAMILIES = ("Q-OPT", "Q-PAR", "Q-E2E", "Q-COMP", "Q-HW", "Q-DIST", "Q-SERVE", "Q-MLOPS", "Q-STORY")
FAMILY_TITLES = {"Q-OPT": "Optimization techniques", "Q-PAR": "Tensor vs pipeline parallelism",
                 "Q-E2E": "End-to-end optimization", "Q-COMP": "From model to GPU: compilers",
                 "Q-HW": "Algorithm-hardware fit and metrics", "Q-DIST": "Distributed training design",
                 "Q-SERVE": "Distributed inference design", "Q-MLOPS": "MLOps: monitoring, versioning, rollout",
                 "Q-STORY": "Tell me about a project"}

LAB_TITLES = {  # the stems an answer cites; lessons are notebooks/<stem>.ipynb, graded labs labs/<stem>.ipynb
    "01_performance_model": "timing, roofline, scaling", "02_triton_basics": "Triton, masks, fusion",
    "03_reductions": "reductions, softmax, norms",
    "04_matmul": "tiled matmul", "05_flash_attention": "FlashAttention",
    "06_compile_and_graphs": "compilers, CUDA graphs",
    "07_mixed_precision": "mixed precision", "08_quantization": "quantization",
    "09_pruning_distillation": "pruning, distillation", "10_memory_checkpointing": "memory, checkpointing, ZeRO",
    "11_data_parallel": "data parallelism, collectives", "12_tensor_parallel": "tensor parallelism",
    "13_pipeline_parallel": "pipeline parallelism", "14_inference_serving": "inference serving",
    "15_gpu_algorithms": "GPU algorithms", "16_capstone_design": "capstone: planning and capacity",
    "17_cuda_simt": "CUDA C++, SIMT, occupancy",
}
_KINDS = {"- ": "rubric", "> ": "followups", "+ ": "strong", "~ ": "weak", "! ": "gap"}


@dataclass(frozen=True)
class Question:
    """One timed drill: ``rubric`` lists what a strong answer covers; ``labs`` the stems whose numbers it cites;
    ``followups`` the scripted follow-ups; ``strong`` the points of a strong sample answer, ``weak`` a weak one and
    ``gap`` what the weak one lacks (shown after your answer, to calibrate)."""

    qid: str
    prompt: str
    minutes: int
    rubric: tuple
    labs: tuple
    followups: tuple = ()
    strong: tuple = ()
    weak: str = ""
    gap: str = ""

    @property
    def family(self) -> str:
        return self.qid.rsplit("-", 1)[0]


def parse_drills(text: str) -> list[Question]:
    """The blocks of ``text`` as :class:`Question` objects (see the module's docstring for the format)."""
    questions = []
    for block in text.strip().split("\n## "):
        head, *lines = block.removeprefix("## ").splitlines()
        qid, minutes, labs = (part.strip() for part in head.split("|"))
        stems = tuple(next(stem for stem in LAB_TITLES if stem[:2] == n) for n in labs.split()[1:])
        items: dict[str, list[str]] = {kind: [] for kind in _KINDS.values()}
        prompt, last = [], None
        for line in lines:
            if line[:2] in _KINDS:
                last = items[_KINDS[line[:2]]]
                last.append(line[2:])
            elif line.startswith("  ") and last is not None:
                last[-1] += " " + line.strip()
            elif line.strip():
                prompt.append(line)
        questions.append(Question(qid, " ".join(prompt), int(minutes.split()[0]), tuple(items["rubric"]), stems,
                                  tuple(items["followups"]), tuple(items["strong"]), " ".join(items["weak"]),
                                  " ".join(items["gap"])))
    return questions


def personalise(followup: str, answer: str) -> str:
    """``followup`` with each ``[[unit|words]]`` replaced by the first number of that unit's kind in ``answer`` (as
    written there), or by the words when the answer has none: the follow-up pushes on your own number.
    ``[[unit@word|words]]`` takes the number of that kind written nearest to ``word`` (within 40 characters), so
    ``[[s@p99|your p99]]`` quotes the p99 rather than the first time the answer mentions."""
    found = quantities_in(answer)

    def quote(match: re.Match) -> str:
        unit, _, word = match.group(1).partition("@")
        plain = UNITS[unit][0] == "1"  # a plain number: only the same word counts (a "%" is not a replica count)
        fits = [(start, written) for start, written, q in found
                if (q.unit == unit if plain else q.dimension == UNITS[unit][0])]
        if word:
            spots = [m.start() for m in re.finditer(re.escape(word), answer, re.IGNORECASE)]
            fits = sorted((min(abs(start - spot) for spot in spots), start, written) for start, written in fits
                          if spots and min(abs(start - spot) for spot in spots) <= 40)
            fits = [(start, written) for _, start, written in fits]
        return fits[0][1] if fits else match.group(2)

    return re.sub(r"\[\[([^|\]]+)\|([^\]]+)\]\]", quote, followup)
