"""Merging a device run's kernels CSV (or one tuning of a variants file) into the committed table, with provenance per run."""
from __future__ import annotations

import csv
import datetime
import json
import shlex
import sys
from pathlib import Path

from policies.kernels.bench_cases import Case, FIELDS, MODELS, policy_bytes
from policies.kernels.inputs import chain, full



# --merge: the rows of one case are identified by these columns (a table without `state_dtype`
# predates the column: its bytes formula is float32 states, so its rows are float32).
MERGE_KEY = ("model", "policy", "B", "T", "tree", "depth", "replayed_tokens", "flush", "mode", "state_dtype")


def _driver(prov: dict) -> str:
    parts = [p.strip() for p in str(prov.get("nvidia_smi", "")).split(",")]
    return parts[1] if len(parts) > 1 else str(prov.get("driver", ""))


def _part(run: str, prov: dict, rows: int) -> dict:
    """One provenance part (calibrate.device.provenance's fields) for the rows of one device run."""
    dt = prov.get("device_time_s")
    if isinstance(dt, dict):  # e.g. {"this_call_command_wall_s": ..., "earlier_call_s": ...}: all device time
        dt = round(sum(v for v in dt.values() if isinstance(v, (int, float))), 1) or None
    if not isinstance(dt, (int, float)):
        dt = prov.get("wall_s")
    return {"run": run, "rows": rows, "gpu": prov.get("gpu", ""), "driver": _driver(prov),
            "torch": prov.get("torch", ""), "triton": prov.get("triton", ""), "cuda": prov.get("cuda", ""),
            "date": prov.get("date", ""), "git_commit": prov.get("git_commit", ""), "command": prov.get("command", ""),
            "tuning": prov.get("tuning", prov.get("dot_precision", "")), "device_time_s": dt, "provenance": prov}


def variant_rows(path: Path, variant: str) -> tuple[list[dict], dict]:
    """One tuning's rows of a `--variants` file (variants.csv, from run_variants) as rows of the kernels
    table, and the provenance of the run that wrote it. run_variants times each case with run_policy
    in graph mode (the table's graph timing), no replayed tokens, commit with a flush; its own columns
    give the times, bytes and pct_of_copy_bw; depth follows from the tree, gbs from bytes and total_us,
    the verify/commit split of bytes from policy_bytes (kept only where it sums to the file's bytes).
    Not in the file, so left empty: extra_mem_bytes, copies."""
    with path.open(newline="") as fh:
        src = [r for r in csv.DictReader(fh) if r["variant"] == variant]
    if not src:
        raise ValueError(f"{path}: no rows of variant {variant!r}")
    rows = []
    for r in src:
        T = int(r["T"])
        parents = tuple(chain(T)) if r["tree"] == "chain" else tuple(full(tuple(int(w) for w in r["tree"].split(","))))
        if len(parents) != T:
            raise ValueError(f"{path}: tree {r['tree']} has {len(parents)} positions, row says T = {T}")
        hk, hv = MODELS.get(r["model"], (0, 0))
        c = Case(r["model"], hk, hv, int(r["B"]), r["tree"], parents, r.get("state_dtype") or "float32")
        vb, cb = policy_bytes(c, r["policy"], 0, True) if hk else (None, None)
        split = vb is not None and vb + cb == int(r["bytes"])
        total = float(r["total_us"])
        rows.append(dict(model=r["model"], policy=r["policy"], B=r["B"], T=r["T"], tree=r["tree"], depth=c.depth,
                         replayed_tokens=0, flush=1, mode="graph", verify_us=r["verify_us"],
                         commit_us=r["commit_us"], total_us=r["total_us"], verify_bytes=vb if split else "",
                         commit_bytes=cb if split else "", bytes=r["bytes"],
                         gbs=round(int(r["bytes"]) / total / 1e3, 1), pct_of_copy_bw=r["pct_of_copy_bw"],
                         extra_mem_bytes="", copies="", state_dtype=c.state_dtype))
        rows[-1] = {k: str(v) for k, v in rows[-1].items()}  # as read from a CSV: merge keys compare strings
    p = path.with_name(f"{path.stem}_provenance.json")
    vprov = json.loads(p.read_text()) if p.exists() else {}
    prov = dict(vprov.get("source_provenance", vprov))
    part = next(iter(vprov.get("parts", [])), {})
    prov.update(device_time_s=part.get("device_time_s", prov.get("device_time_s")), tuning=src[0]["tuning"],
                variant=variant, source_part=part)
    return rows, prov


def drop_rows(path: Path, drops: list[str]) -> tuple[list[dict], dict]:
    """A kernels CSV's rows and provenance, less the rows matching any of `drops` ("POLICY@TREE" or
    "POLICY@TREE@REPLAYED"); each pattern must match at least one row."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    p = path.with_name(f"{path.stem}_provenance.json")
    prov = json.loads(p.read_text()) if p.exists() else {}
    keep = rows
    for d in drops:
        parts = d.split("@")
        if len(parts) not in (2, 3):
            raise ValueError(f"--merge-drop takes POLICY@TREE[@REPLAYED], got {d!r}")

        def hit(r: dict, parts=parts) -> bool:
            return r["policy"] == parts[0] and r["tree"] == parts[1] and \
                (len(parts) == 2 or str(r["replayed_tokens"]) == parts[2])
        if not any(hit(r) for r in keep):
            raise ValueError(f"--merge-drop {d!r} matches no row of {path}")
        keep = [r for r in keep if not hit(r)]
    return keep, {**prov, "dropped_before_merge": list(drops)}


def merge(out_csv: Path, new_csv: Path, run: str, base_run: str, notes: list[str] | None = None,
          new: tuple[list[dict], dict] | None = None, keep_runs: tuple[str, ...] = (),
          command: str = "", part_extra: dict | None = None) -> dict[str, int]:
    """Rows of new_csv (run `run`) replace the rows of out_csv with the same MERGE_KEY; out_csv's other
    rows stay (in place, then the new keys in new_csv's order). A `run` column names each row's run
    (out_csv rows without one: `base_run`). STEM_provenance.json beside each file: out's becomes
    {"parts": [one per run, with that run's whole provenance], "merge": ...}. Returns rows per run.
    `new`: (rows, provenance) to merge instead of reading new_csv (e.g. variant_rows); `keep_runs`: runs whose
    rows must not be replaced (ValueError); `part_extra`: fields added to the new run's part."""
    def read(path: Path) -> tuple[list[str], list[dict]]:
        with path.open(newline="") as fh:
            r = csv.DictReader(fh)
            return list(r.fieldnames or []), list(r)

    def prov_of(path: Path) -> dict:
        p = path.with_name(f"{path.stem}_provenance.json")
        return json.loads(p.read_text()) if p.exists() else {}

    def key(r: dict) -> tuple:
        return tuple(r.get(k) or ("float32" if k == "state_dtype" else "") for k in MERGE_KEY)

    old_fields, old = read(out_csv)
    if new is None:
        new_fields, new_rows = read(new_csv)
        new_prov = prov_of(new_csv)
    else:
        new_rows, new_prov = new
        new_fields = list(FIELDS)
    new = new_rows
    for r in old:
        r["state_dtype"] = r.get("state_dtype") or "float32"
        r["run"] = r.get("run") or base_run
    for r in new:
        r["state_dtype"] = r.get("state_dtype") or "float32"
        r["run"] = run
    fresh = {key(r): r for r in new}
    if len(fresh) != len(new):
        raise ValueError(f"{new_csv}: rows repeat a key ({', '.join(MERGE_KEY)})")
    kept = sorted({r["run"] for r in old if r["run"] in keep_runs and key(r) in fresh})
    if kept:
        raise ValueError(f"{new_csv}: would replace rows of run(s) {', '.join(kept)} (kept)")
    merged, used = [], set()
    for r in old:
        k = key(r)
        if k in fresh:
            if k not in used:
                merged.append(fresh[k])
                used.add(k)
        else:
            merged.append(r)
    merged += [r for r in new if key(r) not in used]
    fields = [f for f in FIELDS if f in old_fields or f in new_fields or f == "state_dtype"]
    fields += [f for f in old_fields + new_fields if f not in fields and f != "run"] + ["run"]
    counts: dict[str, int] = {}
    for r in merged:
        counts[r["run"]] = counts.get(r["run"], 0) + 1
    old_prov = prov_of(out_csv)
    parts = [p for p in old_prov.get("parts", []) if p["run"] != run] if "parts" in old_prov \
        else [_part(base_run, old_prov, 0)]
    parts.append({**_part(run, new_prov, 0), **(part_extra or {})})
    for p in parts:
        p["rows"] = counts.get(p["run"], 0)
    merges = old_prov.get("merge", {}).get("history", []) if "parts" in old_prov else []
    merges.append({"run": run, "from": str(new_csv), "replaced": len(used), "added": len(fresh) - len(used),
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "notes": list(notes or [])})
    prov = {"parts": parts,
            "merge": {"key": list(MERGE_KEY), "rule": "a later run's row replaces an earlier run's row of the "
                      "same key; column `run` names each row's part", "command": command or shlex.join(["python3", "-m", "policies.kernels.bench"] + sys.argv[1:]),
                      "history": merges}}
    with out_csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(merged)
    out_csv.with_name(f"{out_csv.stem}_provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    return counts
