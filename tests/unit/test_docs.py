"""The docs hold together: every relative link resolves, and the prose cites no issue
numbers or commit hashes (docs state what is true now, not when it changed).

Checked in every Markdown file of the repository (README.md, benchmarks/README.md, docs/,
perseus/profiles/ …): inline links ``[text](target)`` outside code blocks, with their ``#anchor``
when the target is a Markdown file (GitHub's heading slugs), and references to documents
written as code, e.g. ``docs/emulator.md``, which is how the README names most of them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import REPO

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DOC_REFERENCE = re.compile(r"`(docs/[^`\s]*?\.md)(#[^`\s]*)?`")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
FENCE = re.compile(r"^\s*(```|~~~)")
HISTORY = re.compile(
    r"issue [0-9]+|\b(?=[0-9]*[a-f])[0-9a-f]{7,40}\b"
    r"|\b(?:as before|a run here|with this tree|the previous scheduler)\b",
    re.IGNORECASE,
)
"""An issue number; a commit hash (7 to 40 hex digits with a letter among them: a byte count
such as 8388608 is not one); words that tell how a thing came to be instead of what it is."""


def _markdown_files() -> list[Path]:
    """Markdown files git tracks or would track (untracked, not ignored) in the checkout."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:  # not a git checkout (a source tarball): walk the tree
        return sorted(p for p in REPO.rglob("*.md") if ".git" not in p.parts)
    return sorted({REPO / line for line in out.stdout.splitlines() if (REPO / line).is_file()})


def _prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, …)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(path):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def _problem(source: Path, number: int, target: str, base: Path) -> str | None:
    """Why `target`, linked from `source`, does not resolve (None: it does)."""
    path_part, _, anchor = target.partition("#")
    resolved = source if not path_part else (base / path_part).resolve()
    where = f"{source.relative_to(REPO)}:{number}: {target}"
    if not resolved.exists():
        return f"{where} (no such file: {os.path.relpath(resolved, REPO)})"
    is_doc = resolved.suffix == ".md" and resolved.is_file()
    if anchor and is_doc and anchor.lower() not in anchors(resolved):
        return f"{where} (no heading #{anchor} in {resolved.name})"
    return None


def test_slug_follows_github() -> None:
    assert slug("`bench_solver.py`: our frontier solver vs lowtime 0.3.0") == (
        "bench_solverpy-our-frontier-solver-vs-lowtime-030"
    )
    assert slug("What was read on a real H100") == "what-was-read-on-a-real-h100"


def test_every_relative_link_resolves() -> None:
    files = _markdown_files()
    assert any(f.name == "README.md" and f.parent == REPO for f in files)
    problems: list[str] = []
    for source in files:
        for number, line in _prose_lines(source):
            for match in LINK.finditer(line):
                target = match.group(1)
                if EXTERNAL.match(target):
                    continue
                problem = _problem(source, number, target, source.parent)
                if problem:
                    problems.append(problem)
            for match in DOC_REFERENCE.finditer(line):
                target = match.group(1) + (match.group(2) or "")
                problem = _problem(source, number, target, REPO)
                if problem:
                    problems.append(problem)
    assert not problems, "Links that do not resolve:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "doc",
    [
        "README.md",
        *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")),
        "benchmarks/README.md",
    ],
)
def test_docs_state_what_is_without_issue_numbers_hashes_or_history(doc: str) -> None:
    hits = [
        f"{doc}:{number}: {match.group(0)!r} in {line.strip()[:80]!r}"
        for number, line in enumerate((REPO / doc).read_text(encoding="utf-8").splitlines(), 1)
        for match in HISTORY.finditer(line)
    ]
    assert not hits, "Docs state what is true now, without issue numbers or hashes:\n" + "\n".join(
        hits
    )
