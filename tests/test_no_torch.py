"""The simulator must import and run with torch and triton absent (a laptop sweep)."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton"):
                raise ImportError(f"{name} is blocked in this test")
    sys.meta_path.insert(0, Block())
    import sim.cli, sim.runs.run, sim.runs.sweep, sim.figures.cli, sim.runs.report, sim.pricing.calibrated, workloads, policies
    from core.config import RunConfig
    from sim.runs.run import simulate
    s = simulate(RunConfig(num_requests=20, client={"max_concurrency": 4}))
    assert s["completed"] == 20 and s["latency_source"] in ("calibrated", "mixed"), s["latency_source"]
    assert not any(m.split(".")[0] in ("torch", "triton") for m in sys.modules)
    print("ok")
""")


def test_simulator_runs_without_torch_or_triton():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
