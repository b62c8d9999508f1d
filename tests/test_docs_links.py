"""Every markdown link and image (and HTML <img>) in README.md and docs/*.md that points into the repository names
a file that exists, resolved relative to the page that holds it (as GitHub resolves it); links to the web are not
followed."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img [^>]*src=\"([^\"]+)\"")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def local_targets(text: str) -> list[str]:
    """The link and image targets of a page outside its code blocks, without web links and #anchors."""
    text = FENCE.sub("", text)
    found = [(link or img).split("#")[0] for link, img in LINK.findall(text)]
    return [t for t in found if t and not re.match(r"[a-z]+:", t)]


def test_targets_are_found():
    text = '![a](../x.png) [b](y.md#z) [c](https://e.org) [d](#top) <img src="f.png" width="9">\n```\n[e](no.md)\n```\n'
    assert local_targets(text) == ["../x.png", "y.md", "f.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_image_resolves_from_its_page(page):
    broken = [t for t in local_targets(page.read_text()) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to files that do not exist from where it is: {broken}"
