"""The API server's time outside the engine: the client's tokeniser queue, the measured
overhead file, how validation cases charge it, and the loopback measurement itself."""
import asyncio
import json

import pytest
import simpy

from core.config import ConfigError
from sim.engine.client import Client
from sim.engine.request import Request
from sim.validate.cases import load_cases
from sim.validate.client import OVERHEAD_FILE, client_overhead, load_overhead
from sim.validate.client_measure import _loopback, prompt_of
from workloads.base import RequestSpec
from workloads.qwen_tokens import _qwen


def _reach_engine(prompts, round_trip_s, per_token_s, limit=None):
    env = simpy.Environment()
    reqs = [Request(RequestSpec(i, p, 4), 0.0) for i, p in enumerate(prompts)]
    arrived = {}
    client = Client(env, reqs, limit, lambda r: arrived.setdefault(r.rid, env.now) is not None,
                    round_trip_s, per_token_s)
    env.process(client.arrivals())
    env.run()
    return [arrived[i] for i in range(len(prompts))]


def test_prompts_are_tokenised_one_at_a_time_after_the_round_trip():
    # Three requests sent together: each round trip runs in parallel, the tokeniser thread in turn.
    assert _reach_engine([1000, 2000, 1000], 0.5, 1e-4) == pytest.approx([0.6, 0.8, 0.9])
    assert _reach_engine([1000, 2000], 0.0, 1e-4) == pytest.approx([0.1, 0.3])
    assert _reach_engine([1000, 2000], 0.5, 0.0) == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="tokenize_s_per_token"):
        _reach_engine([10], 0.0, -1.0)


def test_overhead_rate_is_interpolated_between_the_measured_sizes():
    ov = {"round_trip_s": 0.002, "sizes": [100, 1000], "seconds": [1e-5, 3e-4], "path": OVERHEAD_FILE}
    assert client_overhead(100, ov) == {"round_trip_s": 0.002, "tokenize_s_per_token": pytest.approx(1e-7)}
    assert client_overhead(550, ov)["tokenize_s_per_token"] == pytest.approx(2e-7)
    assert client_overhead(5000, ov)["tokenize_s_per_token"] == pytest.approx(3e-7)  # held at the end


def test_committed_overhead_file_loads_and_names_its_machine():
    ov = load_overhead()
    assert ov["round_trip_s"] > 0 and len(ov["sizes"]) >= 2 and all(s > 0 for s in ov["seconds"])
    assert "not the GPU host" in ov["provenance"]["machine"]


def test_bad_overhead_file_is_one_line(tmp_path):
    bad = tmp_path / "o.json"
    bad.write_text(json.dumps({"client": {}}))
    with pytest.raises(ConfigError) as e:
        load_overhead(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_cases_charge_the_overhead_at_their_prompt_size_and_set_wins(tmp_path):
    ov = load_overhead()
    cases = {c.name: (p, c) for p, c in load_cases(OVERHEAD_FILE.parent / "real")}
    path, long = next(v for k, v in cases.items() if k.endswith("long-context-bf16-baseline"))
    cfg = long.run_config(str(path), ov)
    assert cfg.client.round_trip_s == ov["round_trip_s"]
    assert cfg.client.tokenize_s_per_token == pytest.approx(client_overhead(32010, ov)["tokenize_s_per_token"])
    assert long.run_config(str(path)).client.tokenize_s_per_token == 0.0  # no overhead: the engine alone
    _, share = next(v for k, v in cases.items() if k.endswith("sharegpt-bf16-baseline"))
    assert share.mean_prompt_tokens == pytest.approx(342.058)
    pinned = long.model_copy(update={"set": {**long.set, "client.round_trip_s": 0.0}})
    assert pinned.run_config(str(path), ov).client.round_trip_s == 0.0


def test_loopback_stream_delivers_every_chunk():
    enc = _qwen()
    text = prompt_of(enc, 300)
    assert abs(len(enc.encode(text)) - 300) <= 3  # cut at a token, re-encoded
    m = asyncio.run(_loopback(text, requests=3, tokens=20))
    assert m["tokens_per_stream"] == 20 and m["first_chunk_s"] > 0 and m["per_chunk_s"] > 0
