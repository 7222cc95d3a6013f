"""Every named workload runs through `specsim run`: the run serves exactly the workload's requests."""
import csv
import json
from pathlib import Path

import pytest

from sim.cli import main as cli
from workloads import load_workload, workload_names

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
PATHS = {  # workloads whose data the user supplies: files in the published schemas (tests/data/README.md)
    "spec-bench": DATA / "spec_bench_question_sample.jsonl",
    "azure-conv": DATA / "azure_llm_2023_conv_sample.csv",
    "azure-code": DATA / "azure_llm_2023_code_sample.csv",
    "burstgpt": DATA / "burstgpt_sample.csv",
}


@pytest.mark.parametrize("name", workload_names())
def test_specsim_run_accepts_workload(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECSIM_CACHE_DIR", str(tmp_path / "cache"))
    args = ["run", "--workload", name, "--num-requests", "12", "--concurrency", "4", "--out", str(tmp_path / "run")]
    if name in PATHS:
        args += ["--set", f"workload_overrides.path={PATHS[name]}"]
    if name == "sharegpt":  # the whole file is tokenised by the slow test; 300 conversations suffice here
        args += ["--set", "workload_overrides.max_conversations=300"]
    assert cli(args) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    overrides = {"path": str(PATHS[name])} if name in PATHS else {}
    if name == "sharegpt":
        overrides["max_conversations"] = 300
    specs = load_workload(name, 12, 0, overrides).requests
    with open(tmp_path / "run" / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    # every request of the sample, at its lengths, completed with its whole output
    assert [(int(r["prompt_tokens"]), int(r["output_tokens"])) for r in rows] == [
        (s.prompt_tokens, s.output_tokens) for s in specs]
    assert all(r["status"] == "finished" and r["generated_tokens"] == r["output_tokens"] for r in rows)
    assert summary["completed"] == 12 and summary["rejected"] == 0 and summary["workload"] == name
    assert summary["total_output_tokens"] == sum(s.output_tokens for s in specs)
