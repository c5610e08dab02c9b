"""``cranectl`` run in process, as a user runs it, and what its plots must be."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

from cranectl.__main__ import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    """``cranectl ARGV...``: its exit code (its output goes to the test's capsys)."""
    monkeypatch.setattr(sys, "argv", ["cranectl", *argv])
    # the process's logging stays as the test session has it: configured here, it would cache every module's
    # logger on first use, and later tests' log captures would see nothing
    monkeypatch.setattr("cranectl.__main__.configure_logging", lambda *_: None)
    with pytest.raises(SystemExit) as done:
        main()
    return int(done.value.code or 0)


def assert_plot_and_page(png: Path, page: Path) -> str:
    """``png`` is a whole PNG image (it decodes) and ``page`` a self-contained HTML page embedding that very image;
    the page's text is returned."""
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC)
    import matplotlib.image

    height, width = matplotlib.image.imread(str(png)).shape[:2]  # decodes: a whole image, not a header
    assert height > 100
    assert width > 100
    html = page.read_text()
    assert f"data:image/png;base64,{base64.b64encode(data).decode()}" in html  # the same plot, embedded
    assert "src='http" not in html  # nothing fetched from elsewhere
    return html
