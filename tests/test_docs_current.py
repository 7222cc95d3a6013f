"""docs/ (the README's numbers and figures) must come from today's code: a change that moves
results must regenerate them with `make docs`, from a committed tree."""
import json
from pathlib import Path

import pytest

from sim.runs.code_version import code_version

DOCS = Path(__file__).resolve().parents[1] / "docs"
SWEEPS = sorted((DOCS / "sweeps").glob("*/sweep.json"))


def test_docs_hold_sweeps():
    assert SWEEPS, "docs/sweeps/*/sweep.json missing: run `make docs`"


@pytest.mark.parametrize("manifest", SWEEPS, ids=lambda p: p.parent.name)
def test_docs_made_by_this_code_version(manifest):
    m = json.loads(manifest.read_text())
    hardware = m["grid_fixed"].get("hardware", "h200")
    assert m["code_versions"] == [code_version(hardware)], (
        f"{manifest.relative_to(DOCS.parent)} was made by code version {m['code_versions']}, today's is "
        f"{code_version(hardware)}: run `make docs` from a committed tree")


@pytest.mark.parametrize("manifest", SWEEPS, ids=lambda p: p.parent.name)
def test_docs_made_from_a_committed_tree(manifest):
    git = json.loads(manifest.read_text())["git"]
    assert git and not git.endswith("+dirty"), f"{manifest.relative_to(DOCS.parent)}: made at {git!r}"


SPEED = DOCS / "bench" / "sim_speed.json"  # make docs's run of `specsim bench`


def test_docs_speed_made_by_this_code_version_from_a_committed_tree():
    b = json.loads(SPEED.read_text())
    assert b["code_version"] == code_version("h200"), (
        f"docs/bench was made by code version {b['code_version']}, today's is {code_version('h200')}: run `make docs`")
    assert b["commit"] and not b["commit"].endswith("+dirty"), f"docs/bench: made at {b['commit']!r}"


PLAN = DOCS / "plan" / "plan.json"  # specsim plan's worked example (make plan-example)


def test_docs_plan_made_by_this_code_version_from_a_committed_tree():
    m = json.loads(PLAN.read_text())
    assert m["code_version"] == code_version(m["hardware"]), (
        f"docs/plan was made by code version {m['code_version']}, today's is {code_version(m['hardware'])}: "
        "run `make plan-example` from a committed tree")
    assert m["git"] and not m["git"].endswith("+dirty"), f"docs/plan: made at {m['git']!r}"


def test_docs_plan_capacity_agrees_with_its_dense_rate_sweep():
    m = json.loads(PLAN.read_text())
    check, tol = m["dense_check"], m["search"]["tolerance"]
    plan, dense = check["plan_capacity_rps"], check["dense_capacity_rps"]
    assert check["agrees"] and abs(plan - dense) <= tol * max(plan, dense), check
