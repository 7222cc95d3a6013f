"""Spec-Bench's 480 questions (13 categories) from a user-given `question.jsonl`.

As vLLM's `SpecBench` dataset: optional category filter, `random.seed(seed);
random.shuffle(...)`, the first `num_requests`, oversampled (`random.choice` after
reseeding) when more are asked for than the file holds. Prompt = the first turn's
cl100k_base token count, without a chat template (vLLM applies the served model's
template, which adds a few tokens per prompt); output = a fixed budget, 1024 by
default because Spec-Bench generates up to 1024 new tokens per question (vLLM's
default, `--spec-bench-output-len`, is 256).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from core.files import read_text
from workloads.base import RequestSpec, Sample, WorkloadError
from workloads.sampling import oversample
from workloads.files import memo_by_file
from workloads.tokens import TOKENIZER, count_tokens

DATA_HINT = ("Spec-Bench's data/spec_bench/question.jsonl, https://github.com/hemingkx/Spec-Bench "
             "(Apache-2.0)")


@memo_by_file
def read_questions(path: Path) -> tuple[tuple[str, str], ...]:
    """(category, first turn) per question, in file order."""
    questions = []
    for line_no, line in enumerate(read_text(path, "a Spec-Bench question.jsonl").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path}: line {line_no}, column {e.colno}: not valid JSON: {e.msg}") from None
        turns = q.get("turns") if isinstance(q, dict) else None
        if not (isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0].strip()):
            raise WorkloadError(f"{path}: line {line_no}: expected a 'turns' list whose first item is the "
                                "(non-empty) prompt text (Spec-Bench question.jsonl format)")
        questions.append((str(q.get("category", "")), turns[0]))
    if not questions:
        raise WorkloadError(f"{path}: no questions in the file")
    return tuple(questions)


def load(path: Path, num_requests: int, seed: int, output_budget: int,
         categories: list[str] | None) -> Sample:
    questions = list(read_questions(path))  # a copy: shuffled below
    present = sorted({c for c, _ in questions})
    if categories is not None:
        unknown = sorted(set(categories) - set(present))
        if unknown:
            raise WorkloadError(f"spec-bench: unknown categor{'y' if len(unknown) == 1 else 'ies'} "
                                f"{', '.join(unknown)}; valid: {', '.join(present)}")
        questions = [q for q in questions if q[0] in categories]
        if not questions:
            raise WorkloadError("spec-bench: no question left after the category filter (categories: [])")
    random.Random(seed).shuffle(questions)  # = vLLM's random.seed(seed); random.shuffle(self.data)
    chosen = oversample(questions[:num_requests], num_requests, seed)
    lengths = count_tokens([text for _, text in chosen])
    requests = [RequestSpec(request_id=i, prompt_tokens=int(n), output_tokens=output_budget, category=cat)
                for i, ((cat, _), n) in enumerate(zip(chosen, lengths))]
    source = (f"Spec-Bench questions from {path} ({len(questions)} questions"
              + (f" in {', '.join(categories)}" if categories is not None else "")
              + f"), first turn in {TOKENIZER} tokens, output budget {output_budget}, seed {seed}")
    if num_requests > len(questions):
        source += f"; oversampled from {len(questions)} to {num_requests} as vLLM does"
    return Sample(requests, source, frozenset(present))
