"""Every committed calibration table has complete provenance; the CLI's errors name the argument."""
import json
from pathlib import Path

import pytest

from calibrate.device.provenance import missing_fields
from core.config import REPO_ROOT, EngineConfig, load_hardware, load_model, load_policy, model_names
from core.tables import HOST_COLUMNS, HOST_POLICY_COLUMNS, TABLES, read_rows
from sim.cli import main as cli

CALIB = REPO_ROOT / "results" / "calibration"
# Folders of layer tables; a folder may instead hold only profile_peak.json (the memory budget's
# measured profile-run peak, e.g. a model whose tables were never measured), checked below.
# layer_kernels/ (calibrate.benches.kernels outputs) is not a model folder: its provenance.json is flat.
MODEL_DIRS = sorted(d for d in CALIB.glob("*/*") if d.is_dir() and d.name in model_names() and any(d.glob("*.csv")))
PEAK_FILES = sorted(CALIB.glob("*/*/profile_peak.json"))


@pytest.mark.parametrize("mdir", MODEL_DIRS, ids=lambda d: f"{d.parent.name}/{d.name}")
def test_committed_tables_have_provenance(mdir: Path):
    prov = json.loads((mdir / "provenance.json").read_text())
    assert prov["model"] == mdir.name and prov["parts"]
    for part in prov["parts"]:
        assert missing_fields(part) == [], f"{mdir}: provenance part lacks {missing_fields(part)}"
        assert part["errors"] == [] and part.get("device_time_s"), part
    measured = {name for part in prov["parts"] for name in part["jobs"]}
    for csv in mdir.glob("*.csv"):
        if csv.stem == "replay_steps":  # whole steps, not a table: replay_provenance.json, checked below
            continue
        assert csv.stem in measured, f"{csv} has no provenance part that measured it"
        columns = {"host": HOST_COLUMNS, "host_policies": HOST_POLICY_COLUMNS}.get(csv.stem, ("mode",))
        assert read_rows(csv, columns)
    if (mdir / "replay_steps.csv").exists():
        replay = json.loads((mdir / "replay_provenance.json").read_text())
        assert missing_fields(replay) == [] and replay["model"] == mdir.name and replay.get("device_time_s"), replay
    for name, spec in TABLES.items():
        assert (mdir / f"{name}.csv").exists() or not spec.required, f"{mdir}: missing {name}.csv"
    assert "activation_peak_bytes" in json.loads((mdir / "memory.json").read_text())


def test_gpu_summary_provenance():
    for gpu in {d.parent for d in MODEL_DIRS}:
        summary = json.loads((gpu / "provenance.json").read_text())
        assert set(summary["models"]) >= {d.name for d in MODEL_DIRS if d.parent == gpu}
        # the GPU's device time is its calls' (the record of where each table came from)
        assert summary["device_time_s"] == pytest.approx(sum(c["device_time_s"] for c in summary["calls"]), abs=0.05)
        assert all(set(c["models"]) <= set(summary["models"]) for c in summary["calls"])


@pytest.mark.parametrize("path", PEAK_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_committed_profile_peaks_have_provenance(path: Path):
    data = json.loads(path.read_text())
    assert data["model"] == path.parent.name
    prov = data["provenance"]
    for key in ("gpu", "driver", "torch", "triton", "date", "git_commit", "command"):
        assert prov.get(key), f"{path}: provenance lacks {key}"
    call = data["device_call"]
    assert 0 < call["job_wall_s"] <= call["device_call_wall_s"]  # the job ran inside the device call
    assert data["points"] and all(p["status"] == "ok" for p in data["points"])


@pytest.mark.skipif(not MODEL_DIRS, reason="no committed calibration tables")
def test_committed_tables_make_a_calibrated_model():
    from policies import make_policy
    from sim.pricing.analytic import AnalyticLatencyModel
    from sim.pricing.calibrated import CalibratedLatencyModel

    for mdir in MODEL_DIRS:
        m, hw = load_model(mdir.name), load_hardware(mdir.parent.name)
        pol = make_policy(m, load_policy("store_all"))
        lm = CalibratedLatencyModel.load(m, hw, pol, EngineConfig(), AnalyticLatencyModel(m, hw, pol, EngineConfig()))
        assert lm is not None
        # The host side is measured (host.csv) only where a step-executor replay wrote it.
        host = set() if (mdir / "host.csv").exists() else {"overhead"}
        assert {k for k, v in lm.sources.by_term.items() if v != "calibrated"} <= {"allreduce", "gdn_verify", "gdn_commit"} | host


@pytest.mark.parametrize("argv,needle", [
    (["calibrate", "measure", "--gpu", "h200", "--part", "9"], "--part must be one of"),
    (["calibrate", "measure", "--gpu", "h200", "--jobs", "gdn,warp"], "--jobs: unknown ['warp']"),
    (["calibrate", "measure", "--gpu", "h200", "--modes", "graph,turbo"], "--modes must be"),
    (["calibrate", "measure", "--gpu", "b200"], "derived from 'h200'"),
    (["calibrate", "validate", "--gpu", "h100"], "'h100'; valid: b200, h200"),
    (["calibrate", "validate", "--gpu", "h200", "--holdout", "1.5"], "--holdout must be in (0, 1)"),
])
def test_cli_errors_name_the_argument(argv, needle, capsys):
    assert cli(argv) == 2
    assert needle in capsys.readouterr().err


# Folders that miss a target, measured: each with the numbers and what would close it (docs/models.md).
# strict: once a re-measurement meets the target, the entry must go.
KNOWN_MISSES = {
    "qwen3.5-27b": "held-out median 5.02%: the token tables on the full grid, but gdn_prefill (25.2%) and the "
                   "attention cores (prefill 14.8%, decode 10.2%) on the coarse one; re-measure those with --grid full",
}


@pytest.mark.parametrize("mdir", [pytest.param(d, marks=pytest.mark.xfail(reason=KNOWN_MISSES[d.name], strict=True))
                                  if d.name in KNOWN_MISSES else d for d in MODEL_DIRS],
                         ids=lambda d: f"{d.parent.name}/{d.name}")
def test_committed_tables_meet_the_accuracy_targets(mdir: Path):
    """Held-out interpolation error of the graph-mode rows (target: median <= 5%; the default
    `pipeline` pricing reads only those, eager rows serve the old `eager_sum` comparison) and the
    graph-mode whole-step anchor, where step_check.csv was measured with the kernels the tables
    time (a later part that re-measured tables makes it stale: the step-executor replay is the
    anchor then)."""
    from calibrate.tables.validate import validate_model

    res = validate_model(mdir, load_model(mdir.name), load_hardware(mdir.parent.name))
    assert res["per_mode"]["graph"]["median_ape_pct"] <= 5.0, res["per_table"]
    parts = json.loads((mdir / "provenance.json").read_text())["parts"]
    step_part = max(i for i, p in enumerate(parts) if "step_check" in p.get("jobs", {}))
    if step_part == len(parts) - 1:
        graph_steps = [s for s in res["step_check"] if s["mode"] == "graph"]
        assert graph_steps and all(abs(s["err_pct"]) <= 10.0 for s in graph_steps), graph_steps
