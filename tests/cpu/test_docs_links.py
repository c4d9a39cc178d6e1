"""Every relative link in the README, docs/ and the kernel-family READMEs resolves.

A link target must be an existing file or folder inside the repository; a ``#fragment`` (alone, or
after a ``.md`` target) must name a heading of the target, slugged as GitHub renders it. Links inside
fenced code blocks and inline code are not links. External links (``http(s)://``, ``mailto:``) are not
checked (no network in CI).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) or [text](target "title"); images ![alt](target) match too
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def doc_files(root: Path = ROOT) -> list[Path]:
    """The pages whose links are checked: README.md, docs/**/*.md, each kernel family's README.md."""
    files = [root / "README.md"]
    files += sorted((root / "docs").rglob("*.md"))
    files += sorted((root / "src" / "nvgemm" / "templates").glob("*/README.md"))
    return [f for f in files if f.is_file()]


def _prose_lines(text: str, strip_code: bool = True):
    """(line number, line) outside fenced code blocks, with inline code removed unless told not to."""
    fenced = False
    for no, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield no, _INLINE_CODE.sub("", line) if strip_code else line


def links(text: str) -> list[tuple[int, str]]:
    out = []
    for no, line in _prose_lines(text):
        out += [(no, m.group(1)) for m in _LINK.finditer(line)]
        ref = _REF_DEF.match(line)
        if ref:
            out.append((no, ref.group(1)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, markup and punctuation dropped, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _no, line in _prose_lines(path.read_text(encoding="utf-8"), strip_code=False):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Every link of ``page`` that does not resolve, as 'page:line: target (why)'."""
    bad = []
    rel_page = page.relative_to(root)
    for no, target in links(page.read_text(encoding="utf-8")):
        if _EXTERNAL.match(target):
            continue
        path_part, _, frag = target.partition("#")
        where = f"{rel_page}:{no}: {target}"
        dest = (page.parent / path_part).resolve() if path_part else page
        try:
            dest.relative_to(root.resolve())
        except ValueError:
            bad.append(f"{where} (points outside the repository)")
            continue
        if not dest.exists():
            bad.append(f"{where} (no such file)")
            continue
        if frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{where} (no heading with anchor #{frag} in {dest.relative_to(root.resolve())})")
    return bad


def test_docs_pages_exist():
    pages = {p.relative_to(ROOT).as_posix() for p in doc_files()}
    assert "README.md" in pages
    assert any(p.startswith("docs/") for p in pages)
    assert any(p.startswith("src/nvgemm/templates/") for p in pages)


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    bad = broken_links(page)
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_checker_catches_broken_links(tmp_path):
    """The checker itself: a missing file, a missing anchor and an escape from the root are reported;
    code spans, code blocks and external links are left alone."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## The `x` op (CPU)\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n"
        "[ok](docs/a.md) [ok anchor](docs/a.md#the-x-op-cpu) [self](#top) [web](https://example.com/x)\n"
        "[gone](docs/missing.md) [bad anchor](docs/a.md#nope) [out](../outside.md)\n"
        "`[code](docs/none.md)`\n```\n[fenced](docs/none.md)\n```\n",
        encoding="utf-8",
    )
    bad = broken_links(page, root=tmp_path)
    assert [b.split(": ", 1)[1].split(" (")[0] for b in bad] == ["docs/missing.md", "docs/a.md#nope", "../outside.md"]
