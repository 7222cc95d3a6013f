"""A clone is all a user has: no tracked file may point at a document or folder outside it."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Names of the background documents the project started from, and the folder beside the
# repository that held them: none of them ships with a clone.
OUTSIDE = re.compile(r"\.\./shared|\bshared/data\b|DESIGN\.md|ANCHORS\.md|VLLM_FACTS\.md|STYLE\.md|KINDS\.md|METHOD\.md")
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".json", ".csv", "Makefile", ".ci/run")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / n for n in names if n.endswith(TEXT) and (REPO / n).is_file()]


def test_no_file_refers_outside_the_repository():
    me = Path(__file__).resolve()
    hits = [f"{p.relative_to(REPO)}:{i}" for p in tracked_text_files() if p.resolve() != me
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, hits


def test_docs_links_resolve_inside_the_repository():
    """Every relative link in docs/ and the README names a file of the clone."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = []
    for md in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target in link.findall(md.read_text()):
            if re.match(r"https?://|mailto:", target):
                continue
            path = (md.parent / target).resolve()
            if not path.exists() or REPO not in path.parents and path != REPO:
                broken.append(f"{md.relative_to(REPO)} -> {target}")
    assert not broken, broken


# How the project was built is not the reader's business: no work periods, rounds or numbered issues of
# ours (an issue of another project, such as vLLM's, is a source and is named with its project).
BUILD_HISTORY = re.compile(r"(?i)\bsessions?\b|(?<!vllm )(?<!vllm's )\bissue[ -]?#?\d+|\bround[ -]?\d+\b")


def test_no_file_tells_how_the_project_was_built():
    me = Path(__file__).resolve()
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()[:80]}" for p in tracked_text_files() if p.resolve() != me
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if BUILD_HISTORY.search(line)]
    assert not hits, hits
