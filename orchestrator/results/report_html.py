"""``report.html``: the report's markdown as one self-contained page, converted by Python-Markdown.

Self-contained means a reader can mail the file or open it offline: every figure is embedded as a
data URI (an SVG too large for that as its PNG sibling), the CSS is inline, there is no script and
no reference outside the page. Raw HTML in the markdown (a task's failure reason, a note) is shown
as text, never interpreted; a link to anything but a local file is shown as its text and target.
"""

from __future__ import annotations

import base64
import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import markdown
from markdown.treeprocessors import Treeprocessor

#: Over this size an SVG figure is embedded as its PNG sibling instead (long link time series).
SVG_EMBED_MAX_BYTES = 1_500_000
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.45; }
h1, h2, h3 { line-height: 1.2; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; }
th { background: #f3f3f3; } tr:nth-child(even) td { background: #fafafa; }
code { background: #f3f3f3; padding: 0 .2rem; border-radius: 3px; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
"""


def is_local(ref: str) -> bool:
    """A plain relative reference (no scheme, not protocol- or root-relative, no way up)."""
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", ref) and not ref.startswith(("/", "\\")) \
        and ".." not in Path(ref).parts


def data_uri(base_dir: Path, src: str) -> str | None:
    """The local image `src` (relative to `base_dir`) as a data URI: an SVG over
    `SVG_EMBED_MAX_BYTES` with a PNG beside it as the PNG. None if it is not a local file."""
    if not is_local(src):
        return None
    path = base_dir / src
    if path.suffix == ".svg" and path.is_file() and path.stat().st_size > SVG_EMBED_MAX_BYTES \
            and path.with_suffix(".png").is_file():
        path = path.with_suffix(".png")
    mime = {".svg": "image/svg+xml", ".png": "image/png"}.get(path.suffix)
    if mime is None or not path.is_file():
        return None
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


class _SelfContained(Treeprocessor):
    """Embeds local images, turns links to anything but a local file into text, and keeps the
    first level-1 heading as the page's title."""

    def __init__(self, md: markdown.Markdown, base_dir: Path) -> None:
        super().__init__(md)
        self.base_dir = base_dir
        self.title = "report"

    def run(self, root: ET.Element) -> None:
        heading = root.find("h1")
        if heading is not None:
            self.title = "".join(heading.itertext())
        for parent in root.iter():
            for child in list(parent):
                if child.tag == "img":
                    self._image(parent, child)
                elif child.tag == "a" and not is_local(child.get("href", "")):
                    self._as_text(child, f" ({child.get('href', '')})")

    def _image(self, parent: ET.Element, img: ET.Element) -> None:
        src = img.get("src", "")
        uri = data_uri(self.base_dir, src)
        if uri is None:
            img.tag, img.text = "em", f"figure not found: {src}"
            img.attrib.clear()
            return
        img.set("src", uri)
        if parent.tag == "p" and len(parent) == 1 and not (parent.text or "").strip() \
                and not (img.tail or "").strip():
            parent.tag = "figure"

    @staticmethod
    def _as_text(link: ET.Element, suffix: str) -> None:
        link.tag = "span"
        link.attrib.clear()
        if len(link):
            link[-1].tail = (link[-1].tail or "") + suffix
        else:
            link.text = (link.text or "") + suffix


def markdown_to_html(text: str, *, base_dir: Path) -> str:
    """The report's markdown as one self-contained HTML page (see the module's docstring).

    Headings, paragraphs, lists, pipe tables, inline code, bold and links to local files are
    rendered; images are embedded from `base_dir` as data URIs (one that is not a local file is
    shown as its text); raw HTML is escaped.
    """
    md = markdown.Markdown(extensions=["tables"], output_format="html")
    md.preprocessors.deregister("html_block")  # raw HTML stays text: the page runs nothing it quotes
    md.inlinePatterns.deregister("html")
    inliner = _SelfContained(md, base_dir)
    md.treeprocessors.register(inliner, "self_contained", 0)
    body = md.convert(text)
    return "\n".join(['<!DOCTYPE html>', '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      f"<title>{html.escape(inliner.title)}</title>", f"<style>{_CSS}</style>", "</head>",
                      "<body>", body, "</body>", "</html>", ""])
