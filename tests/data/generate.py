"""Writes the generated trace files in this folder (run from the repository root:
`python tests/data/generate.py`). Seeded, so the files are the same on every run; the
tests' expected values follow from the parameters below."""
from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
# Spec-Bench's 13 categories: its five task categories and MT-bench's eight.
SPEC_BENCH_CATEGORIES = {**{c: 8 for c in ("translation", "summarization", "qa", "math_reasoning", "rag")},
                         **{c: 2 for c in ("writing", "roleplay", "reasoning", "math", "coding", "extraction",
                                           "stem", "humanities")}}
WORDS = ("alpha", "beta", "gamma", "delta", "model", "state", "token", "draft", "tree", "cache", "block", "pool")
AZURE_ROWS = {"azure_llm_2023_conv_sample.csv": (300, 1.2, 1020, 250), "azure_llm_2023_code_sample.csv": (200, 0.6, 2050, 30)}


def spec_bench(rng: random.Random) -> str:
    lines, qid = [], 1
    for category, n in SPEC_BENCH_CATEGORIES.items():
        for _ in range(n):
            turns = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 400)))
                     for _ in range(rng.choice((1, 2)))]
            lines.append(json.dumps({"question_id": qid, "category": category, "turns": turns}))
            qid += 1
    return "\n".join(lines) + "\n"


def azure(rng: random.Random, rows: int, rate: float, prompt_median: int, output_median: int) -> str:
    """The processed schema (microsoft/vidur's splitwise traces): seconds since the first request."""
    t, out = 0.0, ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    for i in range(rows):
        t += 0.0 if i == 0 else rng.expovariate(rate)
        prompt = max(1, round(rng.lognormvariate(0, 0.8) * prompt_median))
        output = max(1, round(rng.lognormvariate(0, 0.9) * output_median))
        out.append(f"{t:.6f},{prompt},{output}")
    return "\n".join(out) + "\n"


def main() -> None:
    rng = random.Random(0)
    (HERE / "spec_bench_question_sample.jsonl").write_text(spec_bench(rng))
    for name, params in AZURE_ROWS.items():
        (HERE / name).write_text(azure(rng, *params))


if __name__ == "__main__":
    main()
