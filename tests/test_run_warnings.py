"""Legal but surprising: a run whose every request was rejected, or whose statistics cover one
request, says so on stderr and in its summary (a sweep names how many points did)."""
import json

from sim.cli import main as cli
from sim.engine.metrics import run_warnings
from sim.engine.request import Request, Status
from workloads.base import RequestSpec


def _requests(statuses: list[Status], reason: str = "exceeds_pool") -> list[Request]:
    out = []
    for i, status in enumerate(statuses):
        r = Request(RequestSpec(i, 100, 10), float(i))
        r.status = status
        r.reject_reason = reason if status is Status.REJECTED else ""
        out.append(r)
    return out


def test_every_request_rejected_is_a_warning():
    assert run_warnings(_requests([Status.REJECTED] * 3)) == [
        "every request was rejected (3 exceeds_pool): the run measured nothing"]
    assert run_warnings(_requests([Status.REJECTED, Status.REJECTED, Status.FINISHED, Status.FINISHED])) == [
        "2 of 4 requests were rejected (2 exceeds_pool): the statistics cover the others"]
    assert run_warnings(_requests([Status.FINISHED, Status.FINISHED])) == []


def test_statistics_of_one_request_are_a_warning():
    one = ["the latency statistics cover one completed request (num_requests and the measure window leave one): "
           "each mean and percentile is that request's value"]
    assert run_warnings(_requests([Status.FINISHED])) == one
    assert run_warnings(_requests([Status.REJECTED, Status.FINISHED]))[1:] == one  # one of two completed
    # four requests, the first and last quarter left out: two measured
    assert run_warnings(_requests([Status.FINISHED] * 4), 0.25, 0.25) == []
    # two, the first half left out: one measured
    assert run_warnings(_requests([Status.FINISHED] * 2), 0.5) == one


def test_run_says_so_on_stderr_and_in_the_summary(tmp_path, capsys):
    assert cli(["run", "--num-requests", "1", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "specsim run: warning: the latency statistics cover one completed request" in err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["warnings"] == [err.split("warning: ")[1].split("\n")[0]]
    assert cli(["run", "--num-requests", "2", "--out", str(tmp_path / "r2")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert json.loads((tmp_path / "r2" / "summary.json").read_text())["warnings"] == []


def test_a_sweep_counts_its_points_with_warnings(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    grid.write_text("fixed: {client.max_concurrency: 1}\naxes:\n  num_requests: [1, 2]\n")
    assert cli(["sweep", "--workload", "synthetic-fixed", "--grid", str(grid), "--jobs", "1", "--no-progress",
                "--out", str(tmp_path / "s")]) == 0
    err = capsys.readouterr().err
    assert ("specsim sweep: warning: 1 point(s) ran but the latency statistics cover one completed request" in err
            and "(first: num_requests=1)" in err)
