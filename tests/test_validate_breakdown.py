"""Where a request's time goes (sim.validate.breakdown): client queue, API server, engine queue,
prefill, decode; from requests.csv, summing to the client's TTFT and latency."""
import csv

import pytest

from sim.engine.metrics import request_rows
from sim.validate.breakdown import PARTS, published_bounds, time_breakdown
from test_engine_scenarios import DT, by_id, scenario, specs


def write_rows(path, requests):
    rows = request_rows(requests)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_each_part_is_its_own_interval(tmp_path):
    """Three requests at t = 0, two slots in the client, one running request in the engine: the
    third waits in the client's queue, the second in the engine's; each reaches the engine a round
    trip after its send."""
    rt = 0.25 * DT
    res, s = scenario(specs((100, 4), (100, 4), (100, 4)), mtp_depth=0, concurrency=2, max_seqs=1, round_trip_s=rt)
    r = by_id(res)
    assert all(x.engine_s == pytest.approx(x.send_s + rt) for x in res.requests)
    assert r[1].first_scheduled_s - r[1].engine_s == pytest.approx(r[0].finish_s - rt)  # engine queue behind request 0
    assert r[2].send_s == pytest.approx(r[0].finish_s)  # client queue until request 0's slot frees

    b = time_breakdown(write_rows(tmp_path / "requests.csv", res.requests))
    assert set(b) == {*PARTS, "requests"} and b["requests"] == 3
    assert b["frontend_s"] == pytest.approx(rt)
    assert b["client_queue_s"] == pytest.approx(r[2].send_s / 3)
    assert b["engine_queue_s"] == pytest.approx(sum(x.first_scheduled_s - x.engine_s for x in res.requests) / 3)
    # API server + engine queue + prefill is the client's TTFT, the decode the rest of its latency
    assert b["frontend_s"] + b["engine_queue_s"] + b["prefill_s"] == pytest.approx(s["ttft_mean_s"])
    assert b["decode_s"] == pytest.approx(s["e2e_mean_s"] - s["ttft_mean_s"])


def test_unfinished_requests_are_left_out_and_published_bounds_follow_the_means(tmp_path):
    res, _ = scenario(specs((100, 2)), mtp_depth=0)
    path = write_rows(tmp_path / "requests.csv", res.requests)
    rows = list(csv.DictReader(path.open()))
    rows.append({**rows[0], "request_id": "1", "status": "rejected"})
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert time_breakdown(path)["requests"] == 1
    assert published_bounds({"ttft_mean_ms": 4072.64, "latency_mean_s": 30.19}) == pytest.approx(
        {"ttft_s": 4.07264, "decode_s": 30.19 - 4.07264})
