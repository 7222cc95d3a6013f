"""The GPU machine's package carry (calibrate/carry/pack.py, setup.sh) on tiny fake wheels: the
folders it builds, the size limit, and the generated setup.sh run in bash (pip from this interpreter,
no network) for both stages, including the missing and corrupt pieces it must refuse."""
from __future__ import annotations

import base64
import hashlib
import lzma
import os
import random
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from calibrate.carry import pack as C

IR = "nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.fake.so"
RT = "nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so"
SPLIT = 100_000


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal pure-Python wheel pip installs: the files, METADATA, WHEEL and RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = dict(files)
    files[f"{dist}.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{dist}.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for n, d in files.items()]
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n").encode()
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            z.writestr(n, d)
    return path


@pytest.fixture
def fake(tmp_path):
    """Fake pinned wheels, their Pins, and the checked {name: path}."""
    rnd = random.Random(0)
    wd = tmp_path / "wheels"
    wd.mkdir()
    specs = [
        ("alpha", "a", "install", {"alpha.py": b"VALUE = 'alpha'\n"}, {}),
        ("beta", "b", "install", {"beta.py": b"VALUE = 'beta'\n"}, {}),
        ("fake-cutlass-libs", "b", "cutlass-libs", {
            IR: rnd.randbytes(250_000), RT: rnd.randbytes(40_000),
            "nvidia_cutlass_dsl/dsl_packages/cutlass_probe.py": b"OK = 1\n",
            "nvidia_cutlass_dsl/cu13/include/CuteDSLRuntime.h": b"// header\n"}, {"ir": IR, "runtime": RT}),
        ("fake-flashinfer", "b", "py-only", {
            "flashinfer/__init__.py": b"raise ImportError('the top-level __init__ ran')\n",
            "flashinfer/cute_dsl/__init__.py": b"raise ImportError('cute_dsl/__init__ ran')\n",
            "flashinfer/cute_dsl/kernel.py": b"X = 7\n",
            "flashinfer/gdn_prefill.py": b"from .cute_dsl.kernel import X\n",
            "flashinfer/tuning.json": b"{}\n",
            "flashinfer/data/kernel.cu": b"__global__ void k() {}\n"},
         {"empty": ["flashinfer/__init__.py", "flashinfer/cute_dsl/__init__.py"]}),
        ("fake-vllm", "a", "py-only", {
            "vllm/__init__.py": b"raise ImportError('vllm/__init__ ran')\n",
            "vllm/v1/sample/kernel.py": b"K = 'topk'\n",
            "vllm/_C.abi3.so": b"\x7fELF",
            "vllm/README.md": b"# x\n"}, {"empty": ["vllm/__init__.py"]}),
    ]
    wheels = []
    for name, folder, use, files, extra in specs:
        p = make_wheel(wd, name, "1.0", files)
        wheels.append(C.Wheel(name, "1.0", p.name, C.sha256_file(p), folder, use, extra))
    pins = C.Pins(tuple(wheels), SPLIT)
    return pins, C.check_wheels(pins, wd), tmp_path


def built(fake) -> tuple[Path, Path, Path]:
    pins, wheels, tmp = fake
    repo = tmp / "repo"
    C.build(pins, wheels, repo, tree=0, log=lambda s: None)
    return repo, repo / ".carry-a", repo / ".carry-b"


def source(repo: Path, stage: str, tmp: Path, then: str = "") -> subprocess.CompletedProcess:
    """`source .carry-<stage>/setup.sh <stage> || exit 3`, then `then`, in bash from the repo root."""
    env = dict(os.environ, CARRY_SITE=str(tmp / "site"), CARRY_STASH=str(tmp / "stash"), CARRY_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    script = f"source .carry-{stage}/setup.sh {stage} || exit 3\necho \"PYTHONPATH=$PYTHONPATH\"\n{then}"
    return subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=120)


def test_xz_split_join_round_trip(tmp_path):
    data = random.Random(1).randbytes(50_000) + bytes(100_000)
    C.xz_write(tmp_path / "x.xz", [data[:70_000], data[70_000:]], len(data))
    C.split(tmp_path / "x.xz", 1000, tmp_path / "p1", tmp_path / "p2")
    assert (tmp_path / "p1").stat().st_size == 1000
    assert lzma.decompress((tmp_path / "p1").read_bytes() + (tmp_path / "p2").read_bytes()) == data
    # the dictionary: the smallest power of two holding the input, at most 256 MiB
    assert C.xz_filters(100)[1]["dict_size"] == 4096
    assert C.xz_filters(5 * C.MIB + 1)[1]["dict_size"] == 8 * C.MIB
    assert C.xz_filters(193_177_432)[1]["dict_size"] == 256 * C.MIB


def test_build_folders(fake):
    repo, a, b = built(fake)
    assert sorted(p.name for p in a.iterdir()) == ["MANIFEST.sha256", "alpha-1.0-py3-none-any.whl",
                                                    "ir.xz.part1", "setup.sh", "vllm_py.tar.xz"]
    assert sorted(p.name for p in b.iterdir()) == [
        "MANIFEST.sha256", "beta-1.0-py3-none-any.whl", "cu13_small.tar.xz", "flashinfer_py.tar.xz",
        "ir.xz.part2", "part1.sha256", "rt.xz", "setup.sh", "sha.txt"]
    assert (a / "ir.xz.part1").stat().st_size == SPLIT
    assert not list(repo.glob(".carry-build-*"))
    with zipfile.ZipFile(fake[1]["fake-cutlass-libs"]) as z:
        want = {m: hashlib.sha256(z.read(m)).hexdigest() for m in (IR, RT)}
        ir = z.read(IR)
    assert (b / "sha.txt").read_text() == f"{want[IR]}  {IR}\n{want[RT]}  {RT}\n"
    assert lzma.decompress((a / "ir.xz.part1").read_bytes() + (b / "ir.xz.part2").read_bytes()) == ir
    setup = (a / "setup.sh").read_text()
    assert setup == (b / "setup.sh").read_text() and IR in setup and not re.search(r"@[A-Z]+@", setup)
    # the same wheels give the same bytes
    first = {p.name: p.read_bytes() for p in b.iterdir()}
    C.build(fake[0], fake[1], repo, tree=0, log=lambda s: None)
    assert {p.name: p.read_bytes() for p in b.iterdir()} == first


def test_size_limit_replaces_nothing(fake):
    repo, a, b = built(fake)
    before = (b / "MANIFEST.sha256").read_text()
    lines = []
    with pytest.raises(C.CarryError, match=r"over the device's 1 MiB a command: \.carry-a"):
        C.build(fake[0], fake[1], repo, tree=C.MIB - 50_000, limit=C.MIB, log=lines.append)
    assert any(re.match(r"\.carry-b: 0\.\d\d MiB \+ working tree 0\.95 MiB", s) for s in lines)
    assert (b / "MANIFEST.sha256").read_text() == before and not list(repo.glob(".carry-build-*"))


def test_wheel_hash_and_missing_wheel(fake, tmp_path, capsys):
    pins, wheels, _ = fake
    bad = C.Pins((C.Wheel(**{**pins.wheels[0].__dict__, "sha256": "0" * 64}),) + pins.wheels[1:], SPLIT)
    with pytest.raises(C.CarryError, match=r"alpha-1\.0-py3-none-any\.whl: sha256 [0-9a-f]{64} differs from the pin 0{64}"):
        C.check_wheels(bad, wheels["alpha"].parent)
    empty = tmp_path / "none"
    empty.mkdir()
    assert C.main(["--out", str(tmp_path / "o"), "--wheels", str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("carry_pack: --wheels: ") and "is missing (pinned " in err
    assert not (tmp_path / "o").exists()


def test_setup_installs_both_stages(fake):
    repo, a, b = built(fake)
    tmp = fake[2]
    site = tmp / "site"
    r = source(repo, "a", tmp, "\"$CARRY_PYTHON\" -c 'import alpha, vllm.v1.sample.kernel as k; print(alpha.VALUE, k.K)'")
    assert r.returncode == 0, r.stderr
    assert f"PYTHONPATH={site}:{repo}\n" in r.stdout and "alpha topk\n" in r.stdout
    assert (site / "vllm/__init__.py").read_bytes() == b"" and not (site / "vllm/_C.abi3.so").exists()
    assert (tmp / "stash" / "ir.xz.part1").read_bytes() == (a / "ir.xz.part1").read_bytes()
    check = ("\"$CARRY_PYTHON\" -c 'import importlib.metadata as m, alpha, beta, cutlass_probe, flashinfer.gdn_prefill as g;"
             " print(beta.VALUE, cutlass_probe.OK, g.X, m.version(\"fake-flashinfer\"))'")
    r = source(repo, "b", tmp, check)
    assert r.returncode == 0, r.stderr
    assert f"PYTHONPATH={site}:{site}/nvidia_cutlass_dsl/dsl_packages:{repo}\n" in r.stdout
    assert "beta 1 7 1.0\n" in r.stdout
    with zipfile.ZipFile(fake[1]["fake-cutlass-libs"]) as z:
        assert (site / IR).read_bytes() == z.read(IR) and (site / RT).read_bytes() == z.read(RT)
    assert (site / "nvidia_cutlass_dsl/cu13/include/CuteDSLRuntime.h").is_file()
    assert (site / "flashinfer/tuning.json").is_file() and not (site / "flashinfer/data").exists()
    assert (site / "flashinfer/__init__.py").read_bytes() == b""
    # once more on the same machine: the same result
    assert source(repo, "b", tmp, check).returncode == 0


def _remanifest(folder: Path) -> None:
    (folder / "MANIFEST.sha256").unlink()
    C._write_manifest(folder)


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("case, message", [
    ("part2 flipped", "ir.xz.part2: FAILED"),
    ("part2 missing", "ir.xz.part2: FAILED open or read"),
    ("no stage a", "ir.xz.part1 is missing: source .carry-a/setup.sh a first"),
    ("part1 flipped in the stash", "is not the part one of this build"),
    ("part2 corrupt, manifest agreeing", "the MLIR compiler did not decompress"),
    ("part2 cut short, manifest agreeing", "the compressed data ends early"),
    ("library differs from sha.txt", "the decompressed libraries' sha256 do not match sha.txt"),
])
def test_setup_refuses_missing_or_corrupt_pieces(fake, case, message):
    repo, a, b = built(fake)
    tmp = fake[2]
    if case != "no stage a":
        assert source(repo, "a", tmp).returncode == 0
    part2 = b / "ir.xz.part2"
    if case == "part2 flipped":
        _flip(part2, 1000)
    elif case == "part2 missing":
        part2.unlink()
    elif case == "part1 flipped in the stash":
        _flip(tmp / "stash" / "ir.xz.part1", 5000)
    elif case == "part2 corrupt, manifest agreeing":
        _flip(part2, 1000)
        _remanifest(b)
    elif case == "part2 cut short, manifest agreeing":
        part2.write_bytes(part2.read_bytes()[:-2000])
        _remanifest(b)
    elif case == "library differs from sha.txt":
        (b / "sha.txt").write_text("0" * 8 + (b / "sha.txt").read_text()[8:])
        _remanifest(b)
    r = source(repo, "b", tmp, "echo after")
    assert r.returncode == 3, r.stdout + r.stderr
    assert message in r.stderr and "setup.sh b: " in r.stderr and "after" not in r.stdout


def test_setup_must_be_sourced_with_a_stage(fake):
    repo, a, _ = built(fake)
    r = subprocess.run(["bash", str(a / "setup.sh"), "a"], capture_output=True, text=True)
    assert r.returncode == 2 and "source it" in r.stderr
    r = source(repo, "a", fake[2])
    assert r.returncode == 0
    r = subprocess.run(["bash", "-c", "source .carry-a/setup.sh c; echo rc=$?"], cwd=repo, capture_output=True, text=True)
    assert "rc=2" in r.stdout and "stage must be a or b, got 'c'" in r.stderr


def test_tree_bytes_counts_what_travels(tmp_path):
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (tmp_path / ".gitignore").write_text("/ignored/\n")
    (tmp_path / "tracked").write_bytes(b"x" * 1000)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "t"], check=True)
    (tmp_path / "untracked").write_bytes(b"y" * 300)
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "big").write_bytes(b"z" * 10_000)
    assert C.tree_bytes(tmp_path) == 1000 + 300 + len("/ignored/\n")


def test_pins_file_and_docs_agree():
    pins = C.load_pins()
    doc = (C.REPO / "docs" / "vllm_kernels.md").read_text()
    section = doc.split("## Carrying the CuTe DSL packages to the device", 1)[1].split("\n## ", 1)[0]
    for w in pins.wheels:
        assert re.search(rf"^\| {re.escape(w.name)} \| {re.escape(w.version)} \| {w.folder} \|", section, re.M), w.name
        assert w.file.startswith(w.name.replace("-", "_") + "-" + w.version + "-")
        assert re.fullmatch(r"[0-9a-f]{64}", w.sha256)
    libs = pins.one("cutlass-libs")
    assert libs.extra["ir"].endswith(".cu13.cpython-312-x86_64-linux-gnu.so")
    assert "cp312" in libs.file or "py3" in libs.file
    assert len({w.name for w in pins.wheels}) == len(pins.wheels)
