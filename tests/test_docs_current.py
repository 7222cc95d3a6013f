"""docs/ (the README's numbers and figures) must come from today's code: a change that moves
results must regenerate them with `make docs`, from a committed tree."""
import json
from pathlib import Path

import pytest

from sim.code_version import code_version

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
