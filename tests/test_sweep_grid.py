"""Grid YAML -> points: the committed grids, per-workload changes, and bad input."""
from pathlib import Path

import pytest

from core.config import ConfigError, RunConfig
from sim.runs.grid import load_grid, valid_fields

GRIDS = Path(__file__).resolve().parent.parent / "configs" / "grids"
MODELS = ["qwen3.5-35b-a3b", "qwen3.5-397b-a17b"]


def write(tmp_path, text):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return path


def test_paper_grid_is_the_study_grid_plus_deferred_and_the_no_speculation_baseline():
    points = load_grid(GRIDS / "paper.yaml", "sharegpt").points("sharegpt")
    assert len(points) == 180
    assert {p.model for p in points} == set(MODELS)
    assert {p.engine.gmu for p in points} == {0.6, 0.75, 0.9}
    assert {p.client.max_concurrency for p in points} == {1, 8, 32, 64, 128, 256}
    assert {p.policy for p in points} == {"store_all", "reconstruct", "replay", "reconstruct_deferred", "none"}
    # the fixed tree is the speculating policies': a point that drafts nothing has none
    assert {tuple(p.policy_overrides["draft_tree_widths"]) for p in points if p.policy != "none"} == {(1, 1, 1)}
    assert all(p.policy_overrides == {} for p in points if p.policy == "none")
    assert all(p.num_requests == 1000 and p.workload == "sharegpt" and p.client.request_rate is None for p in points)


def test_burstgpt_sweeps_a_poisson_rate_instead_of_concurrency():
    grid = load_grid(GRIDS / "paper.yaml", "burstgpt")
    points = grid.points("burstgpt")
    assert grid.load_axis == "client.request_rate" and len(points) == 180
    assert all(p.client.max_concurrency is None and p.client.burstiness == 1.0 for p in points)
    assert len({p.client.request_rate for p in points}) == 6


def test_trees_grid_has_the_tree_shapes():
    points = load_grid(GRIDS / "trees.yaml", "sharegpt").points("sharegpt")
    shapes = {tuple(p.policy_overrides["draft_tree_widths"]) for p in points}
    assert {(1, 1, 1), (2, 2, 2), (3, 3, 3)} <= shapes
    assert {(1,), (1, 1)} <= shapes  # shorter chains: the engine drafts at most mtp_depth = 3


def test_cli_model_and_hardware_replace_the_grid():
    grid = load_grid(GRIDS / "paper.yaml", "sharegpt", model="qwen3.5-35b-a3b", hardware="b200")
    points = grid.points("sharegpt")
    assert len(points) == 90 and {(p.model, p.hardware) for p in points} == {("qwen3.5-35b-a3b", "b200")}


def test_axes_cross_in_order_and_fixed_values_apply(tmp_path):
    path = write(tmp_path, "fixed: {seed: 7, workload_overrides.output_tokens: 32}\n"
                           "axes: {policy: [replay, store_all], engine.gmu: [0.5, 0.8]}\n")
    points = load_grid(path, "synthetic-fixed").points("synthetic-fixed")
    assert [(p.policy, p.engine.gmu) for p in points] == [("replay", 0.5), ("replay", 0.8), ("store_all", 0.5), ("store_all", 0.8)]
    assert all(p.seed == 7 and p.workload_overrides == {"output_tokens": 32} for p in points)


def test_valid_fields_come_from_run_config():
    fields = valid_fields()
    for name in RunConfig.model_fields:
        assert name == "workload" or any(f == name or f.startswith(name + ".") for f in fields)
    assert {"engine.gmu", "client.max_concurrency", "policy_overrides.draft_tree_widths"} <= set(fields)


@pytest.mark.parametrize("text,expected", [
    ("axes: {engine.gmuu: [0.6]}\n", "unknown grid field 'engine.gmuu'; valid: "),
    ("axes: {concurrency: [1]}\n", "unknown grid field 'concurrency'"),
    ("fixed: {policy_overrides.flush_every: 2}\n", "unknown grid field 'policy_overrides.flush_every'"),
    ("axis: {policy: [replay]}\n", "unknown top-level key(s) ['axis']; valid: description, fixed, axes, workloads"),
    ("axes: {policy: replay}\n", "axis 'policy' must be a non-empty list"),
    ("axes: {policy: [replay, replay]}\n", "axis 'policy' repeats a value"),
    ("axes: {engine.gmu: [0.6, 1.5]}\n", "engine.gmu: Value error, gmu must be in (0, 1], got 1.5"),
    ("axes: {engine.admission: [full_prompt, lazy]}\n", "'full_prompt' or 'first_chunk'"),
    ("axes: {model: [qwen3.5-35b-a3b, gpt-5]}\n", "unknown model 'gpt-5'; valid: qwen3-next-80b-a3b, qwen3.5-27b, qwen3.5-35b-a3b, qwen3.5-35b-a3b-fp8, qwen3.5-397b-a17b, qwen3.5-397b-a17b-fp8"),
    ("axes: {policy: [store_al]}\n", "'store_al'; valid: none, reconstruct, reconstruct_deferred, replay, store_all"),
    ("fixed: {workload: sharegpt}\n", "'workload' cannot be set in a grid; it is chosen with --workload"),
    ("fixed: {seed: 1}\naxes: {seed: [1, 2]}\n", "['seed'] are both fixed and an axis"),
    ("workloads: {sharegpt: {axes: {nope: [1]}}}\n", "workloads.sharegpt: unknown grid field 'nope'"),
    ("workloads: {burstgtp: {fixed: {seed: 1}}}\n", "workloads: unknown workload(s) ['burstgtp']; valid: "),
])
def test_bad_grid_names_the_problem(tmp_path, text, expected):
    with pytest.raises(ConfigError) as err:
        load_grid(write(tmp_path, text), "sharegpt").points("sharegpt")
    assert expected in str(err.value)


def test_missing_grid_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_grid(tmp_path / "nope.yaml", "sharegpt")
