"""A chat client's prompt is the message plus the chat template around it, as the server counts
it: guidellm's synthetic prompts and a published guidellm case's client both carry the template's
tokens (workloads/guidellm.py); vLLM's benchmark on /v1/completions sends none."""
from pathlib import Path

from sim.validate.cases import load_case
from workloads import load_workload
from workloads.guidellm import CHAT_TEMPLATE_TOKENS

REAL = Path(__file__).resolve().parent.parent / "validation" / "real"


def test_guidellm_synthetic_prompts_carry_the_template():
    w = load_workload("guidellm-random", 3, 0, {"prompt_tokens": 64, "output_tokens": 16})
    assert CHAT_TEMPLATE_TOKENS == 10
    assert [(r.prompt_tokens, r.output_tokens) for r in w.requests] == [(74, 16)] * 3


def test_a_guidellm_cases_client_counts_the_template():
    case = load_case(REAL / "gpustack-h200-qwen3.5-35b-a3b-generation-heavy-bf16-baseline.yaml")
    assert case.client.tool == "guidellm" and case.dataset.prompt_tokens == 1000
    assert case.mean_prompt_tokens == 1000 + CHAT_TEMPLATE_TOKENS
