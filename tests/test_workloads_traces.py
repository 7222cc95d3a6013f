"""Spec-Bench, BurstGPT and Azure traces: the loaders on files in the published schemas
(tests/data/, generated with known contents) and on bad input."""
from pathlib import Path

import pandas as pd
import pytest

from workloads import load_workload
from workloads.base import WorkloadError

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "burstgpt_sample.csv"
SPEC_BENCH = DATA / "spec_bench_question_sample.jsonl"
AZURE = {"azure-conv": DATA / "azure_llm_2023_conv_sample.csv", "azure-code": DATA / "azure_llm_2023_code_sample.csv"}


@pytest.fixture(autouse=True)
def _no_env_paths(monkeypatch):
    for var in ("SPEC_BENCH_PATH", "BURSTGPT_PATH", "AZURE_CONV_PATH", "AZURE_CODE_PATH"):
        monkeypatch.delenv(var, raising=False)


# ------------------------------------------------------------------ Spec-Bench
def test_spec_bench_whole_file():
    w = load_workload("spec-bench", 56, 0, {"path": str(SPEC_BENCH)})
    cats = pd.Series([r.category for r in w.requests]).value_counts()
    assert len(cats) == 13 and cats.sum() == 56  # every question once (tests/data/generate.py)
    assert {cats[c] for c in ("translation", "summarization", "qa", "math_reasoning", "rag")} == {8}
    assert all(r.output_tokens == 1024 for r in w.requests)
    assert len({r.prompt_tokens for r in w.requests}) > 40  # each question's own length, not a constant
    assert w.acceptance == {}


def test_spec_bench_env_var_budget_categories_and_oversampling(monkeypatch):
    monkeypatch.setenv("SPEC_BENCH_PATH", str(SPEC_BENCH))
    w = load_workload("spec-bench", 100, 7, {"output_budget": 256, "categories": ["qa", "rag"]})
    assert {r.category for r in w.requests} == {"qa", "rag"} and {r.output_tokens for r in w.requests} == {256}
    big = load_workload("spec-bench", 500, 7, {"categories": ["writing"]})  # 2 questions -> 500
    assert len(big.requests) == 500 and "oversampled from 2" in big.source
    assert len({(r.prompt_tokens, r.category) for r in big.requests}) <= 2
    assert big.requests == load_workload("spec-bench", 500, 7, {"categories": ["writing"]}).requests


def test_spec_bench_hand_made_file(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"question_id": 1, "category": "qa", "turns": ["word word word", "second turn"]}\n'
                 '{"question_id": 2, "category": "rag", "turns": ["word word word word word"]}\n')
    w = load_workload("spec-bench", 2, 0, {"path": str(f), "output_budget": 9})
    assert sorted((r.category, r.prompt_tokens, r.output_tokens) for r in w.requests) == [("qa", 3, 9), ("rag", 5, 9)]


def test_spec_bench_bad_input(tmp_path):
    with pytest.raises(WorkloadError, match=r"SPEC_BENCH_PATH.*hemingkx/Spec-Bench"):
        load_workload("spec-bench", 10, 0)
    f = tmp_path / "q.jsonl"
    f.write_text('{"category": "qa", "turns": ["hi there"]}\n{"category": "qa", "prompt": "no turns"}\n')
    with pytest.raises(WorkloadError, match=r"line 2: expected a 'turns' list"):
        load_workload("spec-bench", 1, 0, {"path": str(f)})
    f.write_text('{"category": "qa", "turns": ["hi there"]}\n{not json\n')
    with pytest.raises(WorkloadError, match=r"line 2, column \d+: not valid JSON"):
        load_workload("spec-bench", 1, 0, {"path": str(f)})
    f.write_text('{"category": "qa", "turns": ["hi there"]}\n')
    with pytest.raises(WorkloadError, match=r"unknown category codng; valid: qa"):
        load_workload("spec-bench", 1, 0, {"path": str(f), "categories": ["codng"]})


def test_spec_bench_acceptance_per_category(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"category": "qa", "turns": ["hi there"]}\n{"category": "rag", "turns": ["a b"]}\n')
    table = {"": [[0.8, 0.1], [0.7]], "qa": [[0.9, 0.05, 0.05]]}
    w = load_workload("spec-bench", 2, 0, {"path": str(f), "acceptance": table})
    assert w.acceptance == table
    with pytest.raises(WorkloadError, match=r"acceptance\['math'\]: unknown category; valid: '', 'qa', 'rag'"):
        load_workload("spec-bench", 2, 0, {"path": str(f), "acceptance": {"math": [[0.5]]}})


# -------------------------------------------------------------------- BurstGPT
GPT4_OK = [(420, 270), (2103, 412), (58, 731), (865, 98), (3012, 187), (150, 35), (611, 944), (24, 8),
           (1475, 260), (333, 333)]  # the fixture's GPT-4 rows with Response tokens > 0 and a prompt


def test_burstgpt_filters_as_vllm():
    w = load_workload("burstgpt", 10, 0, {"path": str(FIXTURE)})
    assert sorted((r.prompt_tokens, r.output_tokens) for r in w.requests) == sorted(GPT4_OK)
    assert w.arrival == "poisson" and all(r.arrival_s is None for r in w.requests)
    assert "20 rows, 4 failed dropped, 1 with 0 request tokens dropped, model GPT-4, 10 usable" in w.source


def test_burstgpt_sample_is_pandas_sample_with_the_seed():
    w = load_workload("burstgpt", 6, 5, {"path": str(FIXTURE)})
    df = pd.read_csv(FIXTURE)
    df = df[(df["Model"] == "GPT-4") & (df["Response tokens"] > 0) & (df["Request tokens"] > 0)]
    expected = df.sample(n=6, random_state=5)  # vLLM's BurstGPTDataset._sample_loaded_data
    assert [(r.prompt_tokens, r.output_tokens) for r in w.requests] == list(
        zip(expected["Request tokens"], expected["Response tokens"]))
    more = load_workload("burstgpt", 25, 5, {"path": str(FIXTURE)})  # more than 10 rows: with replacement
    assert len(more.requests) == 25 and {(r.prompt_tokens, r.output_tokens) for r in more.requests} <= set(GPT4_OK)


def test_burstgpt_all_models_and_trace_replay(monkeypatch):
    monkeypatch.setenv("BURSTGPT_PATH", str(FIXTURE))
    assert len({(r.prompt_tokens, r.output_tokens) for r in
                load_workload("burstgpt", 15, 0, {"model_filter": None}).requests}) == 15
    w = load_workload("burstgpt", 3, 0, {"arrival": "trace"})
    assert [(r.prompt_tokens, r.arrival_s) for r in w.requests] == [(420, 0.0), (2103, 51.0), (58, 84.0)]
    with pytest.raises(WorkloadError, match="only 10 usable rows"):
        load_workload("burstgpt", 11, 0, {"arrival": "trace"})


def test_burstgpt_missing_file_says_where_and_which_flag():
    with pytest.raises(WorkloadError) as e:
        load_workload("burstgpt", 10, 0)
    msg = str(e.value)
    assert "github.com/HPMLL/BurstGPT" in msg and "--set path=FILE" in msg and "BURSTGPT_PATH" in msg


def test_burstgpt_bad_rows_and_columns(tmp_path):
    f = tmp_path / "b.csv"
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    f.write_text(header + "1,GPT-4,10,5,15,API log\n2,GPT-4,ten,5,15,API log\n")
    with pytest.raises(WorkloadError, match=r"line 3: column 'Request tokens' value 'ten' is not a number"):
        load_workload("burstgpt", 1, 0, {"path": str(f)})
    f.write_text(header + "1,GPT-4,10,5,15,API log\n2,GPT-4,10,-5,5,API log\n")
    with pytest.raises(WorkloadError, match=r"line 3: column 'Response tokens' value '-5' is negative"):
        load_workload("burstgpt", 1, 0, {"path": str(f)})
    f.write_text("Timestamp,Model,Request_tokens,Response tokens\n1,GPT-4,10,5\n")
    with pytest.raises(WorkloadError, match=r"missing column\(s\) 'Request tokens'.*found .*'Request_tokens'"):
        load_workload("burstgpt", 1, 0, {"path": str(f)})
    f.write_text(header + "1,ChatGPT,10,5,15,API log\n2,GPT-4,10,0,10,API log\n")
    with pytest.raises(WorkloadError, match=r"no successful request of model 'GPT-4'; models in the file: ChatGPT"):
        load_workload("burstgpt", 1, 0, {"path": str(f)})
    f.write_text("")
    with pytest.raises(WorkloadError, match="empty file"):
        load_workload("burstgpt", 1, 0, {"path": str(f)})


# ----------------------------------------------------------------------- Azure
@pytest.mark.parametrize("name,rows", [("azure-conv", 300), ("azure-code", 200)])
def test_azure_traces(name, rows):
    path = AZURE[name]
    df = pd.read_csv(path)
    assert len(df) == rows
    n = rows - 50
    w = load_workload(name, n, 0, {"path": str(path)})
    assert w.arrival == "trace"
    assert [(r.prompt_tokens, r.output_tokens) for r in w.requests] == list(
        zip(df["num_prefill_tokens"][:n], df["num_decode_tokens"][:n]))
    assert [r.arrival_s for r in w.requests] == pytest.approx(list(df["arrived_at"][:n] - df["arrived_at"][0]))
    assert w.requests == load_workload(name, n, 99, {"path": str(path)}).requests  # the seed plays no part
    with pytest.raises(WorkloadError, match=f"holds {rows} usable requests"):
        load_workload(name, rows + 1, 0, {"path": str(path)})


def test_azure_raw_schema_and_env_var(tmp_path, monkeypatch):
    f = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
                 "2023-11-16 18:15:51.0000000,100,0\n")
    monkeypatch.setenv("AZURE_CONV_PATH", str(f))
    w = load_workload("azure-conv", 2, 0)
    assert [(r.prompt_tokens, r.output_tokens) for r in w.requests] == [(374, 44), (396, 109)]
    assert w.requests[1].arrival_s == pytest.approx(4.314579)
    assert "1 rows with 0 tokens dropped" in w.source


def test_azure_bad_input(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n1.5,39.5,10\n")
    with pytest.raises(WorkloadError, match=r"line 3: column 'num_prefill_tokens' value '39.5' is not a whole number"):
        load_workload("azure-code", 1, 0, {"path": str(f)})
    f.write_text("time,prompt,output\n0,1,2\n")
    with pytest.raises(WorkloadError, match=r"missing column\(s\) 'arrived_at'.*TIMESTAMP,ContextTokens"):
        load_workload("azure-code", 1, 0, {"path": str(f)})
    with pytest.raises(WorkloadError, match=r"AZURE_CODE_PATH.*AzurePublicDataset"):
        load_workload("azure-code", 1, 0)
    with pytest.raises(WorkloadError, match=r"data file not found: .*nope.csv \(from path\)"):
        load_workload("azure-code", 1, 0, {"path": str(tmp_path / "nope.csv")})


def test_edited_file_is_read_again(tmp_path):
    """Files are memoised per process (sweeps load a workload per point); an edit shows."""
    f = tmp_path / "t.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n")
    assert load_workload("azure-conv", 1, 0, {"path": str(f)}).requests[0].prompt_tokens == 10
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,1234,5\n")
    assert load_workload("azure-conv", 1, 0, {"path": str(f)}).requests[0].prompt_tokens == 1234


def test_generated_files_are_what_the_generator_writes(tmp_path, monkeypatch):
    """tests/data's generated traces come from tests/data/generate.py, byte for byte."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("generate", DATA / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    monkeypatch.setattr(gen, "HERE", tmp_path)
    gen.main()
    for f in tmp_path.iterdir():
        assert f.read_bytes() == (DATA / f.name).read_bytes(), f.name
