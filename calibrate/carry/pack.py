"""Build the GPU machine's package carry: the folders `.carry-a/` and `.carry-b/`.

    python -m calibrate.carry.pack --out DIR [--wheels WHEELDIR] [--cache DIR]      (make carry)

The device image has torch and triton but not the packages the calibrator and the kernel benches
import; it reaches no registry, and a device command carries at most 64 MiB of working tree and
carried folders. The wheels pinned in `pins.toml` (versions, sha256; why each:
docs/vllm_kernels.md) are downloaded with pip into the cache folder, or read from WHEELDIR, and
checked against their pins. Too large for one command, they travel in two on one warm machine:
`.carry-a/` (the first) holds the small wheels and part one of the xz-compressed MLIR compiler,
`.carry-b/` (the second) the rest of it, the compressed CuTe DSL runtime, the CUDA 13 library
wheel's other files, FlashInfer's Python files and the other wheels. Each folder gets a copy of
`setup.sh`, which installs it on the device and checks every piece. Both folders are built
under temporary names and renamed into place only when both are whole and fit the limit.
"""
from __future__ import annotations

import argparse
import calendar
import hashlib
import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PINS = Path(__file__).with_name("pins.toml")
SETUP_TEMPLATE = Path(__file__).with_name("setup.sh")
MIB = 1 << 20
# The device tool's limit on what one command takes along: tracked and untracked-not-ignored files
# plus the carried paths (its README, "Limits").
TREE_LIMIT = 64 * MIB
# xz --x86 --lzma2=preset=9e,dict=256MiB: the x86 branch filter helps the shared libraries, and a
# dictionary larger than the 193 MB compiler finds its repeats across the whole file. A smaller input
# gets the smallest power of two that holds it (it compresses the same without the encoder's 2.7 GB).
XZ_PRESET = 9 | lzma.PRESET_EXTREME
XZ_DICT = 256 * MIB


def xz_filters(size: int) -> list[dict]:
    return [{"id": lzma.FILTER_X86},
            {"id": lzma.FILTER_LZMA2, "preset": XZ_PRESET, "dict_size": min(XZ_DICT, 1 << max(size - 1, 4095).bit_length())}]


# pip matches each manylinux tag exactly: these are the ones the pinned binary wheels carry.
PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64")
USES = ("install", "cutlass-libs", "py-only")
FOLDERS = {"a": ".carry-a", "b": ".carry-b"}


class CarryError(Exception):
    """A problem the user fixes (bad input, a wheel that does not match its pin): one line, exit 2."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    file: str
    sha256: str
    folder: str  # "a" or "b"
    use: str  # one of USES
    extra: dict = field(default_factory=dict)  # cutlass-libs: ir, runtime; py-only: empty


@dataclass(frozen=True)
class Pins:
    wheels: tuple[Wheel, ...]
    split_bytes: int

    def one(self, use: str) -> Wheel:
        return next(w for w in self.wheels if w.use == use)


def load_pins(path: Path = PINS) -> Pins:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise CarryError(f"{path}: {e}") from None
    wheels = []
    for i, d in enumerate(data.get("wheel", [])):
        missing = [k for k in ("name", "version", "file", "sha256", "folder", "use") if k not in d]
        if missing:
            raise CarryError(f"{path}: wheel {i + 1} lacks {', '.join(missing)}")
        if d["folder"] not in FOLDERS:
            raise CarryError(f"{path}: {d['name']}: folder must be one of {', '.join(FOLDERS)}, got {d['folder']!r}")
        if d["use"] not in USES:
            raise CarryError(f"{path}: {d['name']}: use must be one of {', '.join(USES)}, got {d['use']!r}")
        extra = {k: v for k, v in d.items() if k not in Wheel.__dataclass_fields__}
        wheels.append(Wheel(**{k: d[k] for k in ("name", "version", "file", "sha256", "folder", "use")}, extra=extra))
    if sum(w.use == "cutlass-libs" for w in wheels) != 1:
        raise CarryError(f"{path}: exactly one wheel must have use = 'cutlass-libs'")
    if not isinstance(data.get("split_bytes"), int) or data["split_bytes"] <= 0:
        raise CarryError(f"{path}: split_bytes must be a positive integer")
    return Pins(tuple(wheels), data["split_bytes"])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def check_wheels(pins: Pins, folder: Path) -> dict[str, Path]:
    """Each pinned wheel's path in `folder`, after checking its sha256 against the pin."""
    out = {}
    for w in pins.wheels:
        p = folder / w.file
        if not p.is_file():
            raise CarryError(f"--wheels: {p} is missing (pinned {w.name}=={w.version})")
        got = sha256_file(p)
        if got != w.sha256:
            raise CarryError(f"{p}: sha256 {got} differs from the pin {w.sha256} ({PINS.name}); "
                             f"delete it to download it again, or update the pin if the version changed")
        out[w.name] = p
    return out


def download(pins: Pins, cache: Path, python: str = sys.executable) -> None:
    """pip-downloads the pinned wheels the cache does not hold yet (CPython 3.12, x86-64 Linux: the device's)."""
    missing = [w for w in pins.wheels if not (cache / w.file).is_file()]
    if not missing:
        return
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)],
           "--disable-pip-version-check", "-q", "-d", str(cache), *[f"{w.name}=={w.version}" for w in missing]]
    print(f"downloading {len(missing)} wheels into {cache}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise CarryError("pip download failed (above); or pass --wheels DIR holding the pinned files")


def xz_write(dst: Path, chunks, size: int) -> None:
    """Compresses an iterable of byte chunks, `size` bytes in all, into dst."""
    comp = lzma.LZMACompressor(format=lzma.FORMAT_XZ, filters=xz_filters(size))
    with open(dst, "wb") as f:
        for c in chunks:
            f.write(comp.compress(c))
        f.write(comp.flush())


def _zip_chunks(zf: zipfile.ZipFile, member: str):
    with zf.open(member) as src:
        while chunk := src.read(MIB):
            yield chunk


def tar_xz(dst: Path, zf: zipfile.ZipFile, members: list[str], emptied: frozenset[str] = frozenset()) -> None:
    """The zip's `members` as an xz-compressed tar (sorted, the wheel's times, owner 0): the same wheel
    gives the same bytes. Members in `emptied` go in as empty files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name in sorted(members):
            info = zf.getinfo(name)
            data = b"" if name in emptied else zf.read(name)
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime = len(data), calendar.timegm(info.date_time + (0, 0, 0))
            ti.mode = (info.external_attr >> 16) & 0o777 or 0o644
            t.addfile(ti, io.BytesIO(data))
    xz_write(dst, [buf.getvalue()], buf.tell())


def split(src: Path, first: int, part1: Path, part2: Path) -> None:
    """src's first `first` bytes into part1, the rest into part2."""
    with open(src, "rb") as f, open(part1, "wb") as a, open(part2, "wb") as b:
        a.write(f.read(first))
        shutil.copyfileobj(f, b, MIB)


def _wheel_members(zf: zipfile.ZipFile) -> list[str]:
    return [n for n in zf.namelist() if not n.endswith("/")]


def _build_libs(w: Wheel, path: Path, a: Path, b: Path, split_bytes: int, log) -> None:
    """The CUDA 13 library wheel: its two libraries compressed (the compiler split between a and b),
    their sha256 in b/sha.txt, the rest of the wheel as b/cu13_small.tar.xz."""
    ir, rt = w.extra["ir"], w.extra["runtime"]
    with zipfile.ZipFile(path) as zf:
        names = _wheel_members(zf)
        for m in (ir, rt):
            if m not in names:
                raise CarryError(f"{path.name}: has no {m} (the pin's ir/runtime paths)")
        lib_sha = {}
        for m in (ir, rt):
            h = hashlib.sha256()
            with zf.open(m) as src:
                while chunk := src.read(MIB):
                    h.update(chunk)
            lib_sha[m] = h.hexdigest()
        ir_xz = b / "ir.xz"

        def job(m: str, dst: Path):
            t0 = time.time()
            with zipfile.ZipFile(path) as z:  # one handle per thread
                xz_write(dst, _zip_chunks(z, m), z.getinfo(m).file_size)
            log(f"  {Path(m).name}: {zf.getinfo(m).file_size / 1e6:.1f} MB -> {dst.stat().st_size / 1e6:.1f} MB"
                f" in {time.time() - t0:.0f} s")

        # lzma releases the GIL while it compresses: the two libraries at once on two cores
        with ThreadPoolExecutor(max_workers=2) as ex:
            jobs = [ex.submit(job, ir, ir_xz), ex.submit(job, rt, b / "rt.xz")]
            tar_xz(b / "cu13_small.tar.xz", zf, [n for n in names if n not in (ir, rt) and not n.endswith("/RECORD")])
            for j in jobs:
                j.result()
    if ir_xz.stat().st_size <= split_bytes:
        raise CarryError(f"{ir}: compresses to {ir_xz.stat().st_size} bytes, not more than split_bytes "
                         f"{split_bytes}: lower split_bytes in {PINS.name}")
    split(ir_xz, split_bytes, a / "ir.xz.part1", b / "ir.xz.part2")
    ir_xz.unlink()
    (b / "part1.sha256").write_text(f"{sha256_file(a / 'ir.xz.part1')}  ir.xz.part1\n")
    (b / "sha.txt").write_text("".join(f"{lib_sha[m]}  {m}\n" for m in (ir, rt)))


def py_archive(members: list[str]) -> str:
    """The archive a py-only wheel travels as, named for its top-level package (the first folder
    most of its Python files are in): `flashinfer_py.tar.xz` for flashinfer-python."""
    tops = Counter(n.split("/")[0] for n in members if n.endswith(".py") and "/" in n)
    if not tops:
        raise CarryError("a py-only wheel holds no package of Python files")
    return f"{tops.most_common(1)[0][0]}_py.tar.xz"


def _build_py_only(w: Wheel, path: Path, folder: Path) -> None:
    """A wheel's .py and .json files and its metadata (provenance reads its version), without RECORD:
    what the benches run of it is Python (FlashInfer's CuTe DSL kernels, vLLM's Triton sampler); its
    compiled extensions, CUDA sources and headers stay home."""
    with zipfile.ZipFile(path) as zf:
        names = _wheel_members(zf)
        keep = [n for n in names if n.endswith((".py", ".json"))
                or (".dist-info/" in n and not n.endswith("/RECORD"))]
        emptied = frozenset(w.extra.get("empty", ()))
        if emptied - set(keep):
            raise CarryError(f"{path.name}: has no {', '.join(sorted(emptied - set(keep)))} (the pin's empty list)")
        tar_xz(folder / py_archive(keep), zf, keep, emptied)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_bytes(repo: Path = REPO) -> int:
    """Bytes of what every device command takes along besides its carried paths: tracked and
    untracked-not-ignored files (and shared/, where the checkout has one)."""
    r = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True)
    if r.returncode != 0:
        raise CarryError(f"{repo}: not a git checkout ({r.stderr.decode().strip()}); the size check needs one")
    files = {repo / n for n in r.stdout.decode().split("\0") if n}
    if (repo / "shared").is_dir():
        files |= {p for p in (repo / "shared").rglob("*")}
    return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())


def _write_setup(pins: Pins, folder: Path) -> None:
    libs = pins.one("cutlass-libs")
    text = SETUP_TEMPLATE.read_text().replace("@IR@", libs.extra["ir"]).replace("@RUNTIME@", libs.extra["runtime"])
    (folder / "setup.sh").write_text(text)


def _write_manifest(folder: Path) -> None:
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    (folder / "MANIFEST.sha256").write_text("".join(f"{sha256_file(folder / f)}  {f}\n" for f in files))


def build(pins: Pins, wheels: dict[str, Path], out: Path, tree: int, limit: int = TREE_LIMIT,
          log=print) -> dict[str, int]:
    """Builds out/.carry-a and out/.carry-b from the checked wheels; {folder name: bytes}.
    Nothing replaces the old folders unless both new ones are whole and each, with `tree` bytes
    of working tree, fits `limit`."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".carry-build-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    a, b = tmp / "a", tmp / "b"
    a.mkdir(parents=True)
    b.mkdir()
    try:
        for w in pins.wheels:
            if w.use == "install":
                shutil.copy2(wheels[w.name], (a if w.folder == "a" else b) / w.file)
        log("compressing the CuTe DSL libraries and the py-only wheels' Python files (xz -9e: minutes)")
        with ThreadPoolExecutor(max_workers=1) as ex:
            py = [ex.submit(_build_py_only, w, wheels[w.name], a if w.folder == "a" else b)
                  for w in pins.wheels if w.use == "py-only"]
            _build_libs(pins.one("cutlass-libs"), wheels[pins.one("cutlass-libs").name], a, b, pins.split_bytes, log)
            for job in py:
                job.result()
        sizes = {}
        for key, folder in (("a", a), ("b", b)):
            _write_setup(pins, folder)
            _write_manifest(folder)
            sizes[FOLDERS[key]] = folder_bytes(folder)
        for name, n in sizes.items():
            log(f"{name}: {n / MIB:.2f} MiB + working tree {tree / MIB:.2f} MiB = {(n + tree) / MIB:.2f} MiB"
                f" of {limit / MIB:.0f} MiB a command")
        over = [f"{name} ({(n + tree) / MIB:.2f} MiB)" for name, n in sizes.items() if n + tree > limit]
        if over:
            raise CarryError(f"over the device's {limit / MIB:.0f} MiB a command: {', '.join(over)}; "
                             f"nothing replaced")
        for key, folder in (("a", a), ("b", b)):
            dst = out / FOLDERS[key]
            shutil.rmtree(dst, ignore_errors=True)
            folder.rename(dst)
        return sizes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.carry.pack", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder to write .carry-a/ and .carry-b/ into "
                    "(the repository root, where the device command runs)")
    ap.add_argument("--wheels", type=Path, help="folder holding the pinned wheels (no download)")
    ap.add_argument("--cache", type=Path, default=REPO / ".carry-wheels",
                    help="where pip downloads the wheels not yet there (default: .carry-wheels/)")
    a = ap.parse_args(argv)
    try:
        if a.out.exists() and not a.out.is_dir():
            raise CarryError(f"--out: {a.out} is not a folder")
        pins = load_pins()
        if a.wheels is not None:
            if not a.wheels.is_dir():
                raise CarryError(f"--wheels: {a.wheels} is not a folder")
            folder = a.wheels
        else:
            download(pins, a.cache)
            folder = a.cache
        wheels = check_wheels(pins, folder)
        print(f"{len(wheels)} wheels match their pins ({folder})", flush=True)
        build(pins, wheels, a.out, tree_bytes(), log=lambda s: print(s, flush=True))
    except CarryError as e:
        print(f"carry_pack: {e}", file=sys.stderr)
        return 2
    print("device commands (run from the repository root):\n"
          "  first,  carry [\".carry-a\"]: source .carry-a/setup.sh a || exit 3; ...\n"
          "  second, carry [\".carry-b\"], on the same warm machine within its idle time:"
          " source .carry-b/setup.sh b || exit 3; ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
