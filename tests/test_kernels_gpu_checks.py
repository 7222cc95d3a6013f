"""Every kernel measurement runs the GPU tests first and records their result: a bench whose
tests fail writes the failure into its provenance and measures nothing."""
import json

import pytest

from policies.kernels import bench
from policies.kernels.gpu_checks import run_gpu_tests


def test_run_gpu_tests_reports_pass_and_failure(tmp_path):
    (tmp_path / "test_ok.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_a():\n    pass\n")
    (tmp_path / "test_bad.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_b():\n    assert 0\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    ok = run_gpu_tests(tmp_path, ("test_ok.py",))
    assert ok["passed"] and ok["returncode"] == 0 and "1 passed" in ok["summary"]
    bad = run_gpu_tests(tmp_path, ("test_ok.py", "test_bad.py"))
    assert not bad["passed"] and "1 failed, 1 passed" in bad["summary"]


def test_bench_stops_before_measuring_when_the_gpu_tests_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REHEARSAL", True)  # no GPU here: the bench's CPU rehearsal path
    monkeypatch.setattr(bench, "environment", lambda args: {"gpu": "none"})
    monkeypatch.setattr(bench, "run_gpu_tests", lambda **kw: {"passed": False, "summary": "1 failed"})
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: pytest.fail("measured after the GPU tests failed"))
    assert bench.main(["--out", str(tmp_path)]) == 1
    prov = json.loads((tmp_path / "kernels_provenance.json").read_text())
    assert prov == {"gpu": "none", "gpu_tests": {"passed": False, "summary": "1 failed"}}
    assert not (tmp_path / "kernels.csv").exists()


def test_gpu_tests_split_over_processes_add_up(tmp_path):
    (tmp_path / "test_ok.py").write_text("import pytest\n\n" + "".join(
        f"@pytest.mark.gpu\ndef test_{i}():\n    pass\n\n" for i in range(3)))
    (tmp_path / "test_bad.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_b():\n    assert 0\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    ok = run_gpu_tests(tmp_path, ("test_ok.py",), jobs=2)
    assert ok["passed"] and ok["summary"] == "3 passed (2 processes)", ok
    bad = run_gpu_tests(tmp_path, ("test_ok.py", "test_bad.py"), jobs=3)
    assert not bad["passed"] and bad["summary"] == "1 failed, 3 passed (3 processes)", bad
    assert any("test_b" in ln for ln in bad["failures"])
