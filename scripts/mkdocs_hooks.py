"""mkdocs hooks of the documentation site (mkdocs.yml): pages that other work adds join the nav
only when their file exists, so the strict build neither fails on a missing page nor leaves a new
one out of the nav."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: (title, page, the nav section it joins, the page it follows there).
OPTIONAL_PAGES = (("Kernel datapaths (tc)", "datapaths.md", "Topics", "data-plane.md"),)


def on_config(config: Any, **_: Any) -> Any:
    """Insert every `OPTIONAL_PAGES` entry whose file is in docs_dir into its nav section."""
    for title, page, section, after in OPTIONAL_PAGES:
        if not (Path(config["docs_dir"]) / page).exists():
            continue
        for entry in config["nav"]:
            if isinstance(entry, dict) and section in entry:
                items = entry[section]
                pages = [next(iter(item.values())) for item in items]
                at = pages.index(after) + 1 if after in pages else len(items)
                items.insert(at, {title: page})
    return config
