"""Look at a page as a browser draws it: Debian's Chromium, headless. Not a test module.

`plot_areas(page)` finds each `<figure id="plot-...">` of a `cloudtrain report` page and says
whether its area of a screenshot is painted. The boxes come from a temporary COPY of the page
with a tiny inline script that writes each figure's `getBoundingClientRect()` into the DOM
(read back with `--dump-dom`; the copy drops the page's Content-Security-Policy, which forbids
scripts); the screenshot is of the page itself, at the same width, as tall as the page. Both
renderings use the same window width and scale factor, so the boxes fit the screenshot.

Painted means drawn in colour: the area holds more than MIN_COLOURS distinct colours and at
least MIN_CHROMATIC of its pixels are clearly not grey. A plot's series, bars and fills are
coloured; a "no data" box, its title and caption are black and grey text on white, and fail.
Chromium must be there: without it this raises (the test fails; it never skips).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

CHROMIUM = "/usr/bin/chromium"
WIDTH = 1280
MIN_COLOURS = 16
MIN_CHROMATIC = 0.002  # of the area's pixels
GREY_SPREAD = 40  # max(r, g, b) - min(r, g, b) above this is a colour, not a grey
TIMEOUT_S = 90
_BOXES_ID = "ct-boxes"
_CSP_RE = re.compile(r'<meta http-equiv="Content-Security-Policy"[^>]*>', re.I)
_BOXES_RE = re.compile(rf'<pre id="{_BOXES_ID}">(?P<json>.*?)</pre>', re.S)
_MEASURE = f"""<script>
(() => {{
  const boxes = {{}};
  for (const fig of document.querySelectorAll('figure[id^="plot-"]')) {{
    const r = fig.getBoundingClientRect();
    boxes[fig.id] = [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height];
  }}
  const height = document.documentElement.scrollHeight;
  const pre = document.createElement("pre");
  pre.id = "{_BOXES_ID}";
  pre.textContent = JSON.stringify({{boxes: boxes, height: height}});
  document.body.appendChild(pre);
}})();
</script>"""


@dataclass(frozen=True)
class PlotArea:
    """One figure's box on the page (CSS pixels = screenshot pixels) and what is drawn there."""

    id: str
    x: int
    y: int
    width: int
    height: int
    colours: int  # distinct colours in the box
    chromatic: float  # the fraction of its pixels that are coloured, not grey

    @property
    def painted(self) -> bool:
        """Whether a plot is drawn there in colour (see the module docstring)."""
        return (
            self.width > 0
            and self.height > 0
            and self.colours > MIN_COLOURS
            and self.chromatic >= MIN_CHROMATIC
        )


def chromium() -> str:
    """The Chromium binary; AssertionError (a failed test, never a skip) when it is missing."""
    found = CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")
    assert found, f"no Chromium at {CHROMIUM} or on PATH: install Debian's chromium package"
    return found


def _chromium(args: list[str], profile: Path, height: int) -> str:
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},{height}",
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return proc.stdout


def measure(page: Path, work: Path) -> tuple[dict[str, tuple[float, ...]], int]:
    """Each plot figure's box (x, y, width, height) and the page's height, from a scripted
    copy of `page` in `work`. Blocks for one Chromium run."""
    text = page.read_text(encoding="utf-8")
    copy = work / "measure.html"
    copy.write_text(_CSP_RE.sub("", text).replace("</body>", _MEASURE + "</body>", 1))
    dom = _chromium(["--dump-dom", copy.as_uri()], work / "profile-measure", 1000)
    m = _BOXES_RE.search(dom)
    assert m, f"the measuring script wrote nothing; the DOM ends: {dom[-1500:]}"
    found = json.loads(html.unescape(m["json"]))
    return {k: tuple(v) for k, v in found["boxes"].items()}, int(found["height"])


def screenshot(page: Path, work: Path, height: int) -> Path:
    """A PNG of `page` (unchanged) WIDTH wide and `height` tall. Blocks for one Chromium run."""
    png = work / "page.png"
    _chromium([f"--screenshot={png}", page.as_uri()], work / "profile-shot", height)
    assert png.is_file(), "chromium wrote no screenshot"
    return png


def plot_areas(page: Path, keep: Path | None = None) -> dict[str, PlotArea]:
    """Every `<figure id="plot-...">` of `page` by id, with its box and whether the screenshot
    has a plot painted there. `keep`: a folder for the screenshot (to look at when a test
    fails). Blocks for two Chromium runs (a few seconds)."""
    from PIL import Image

    with tempfile.TemporaryDirectory(prefix="ct-browser-") as tmp:
        work = Path(tmp)
        boxes, height = measure(page.resolve(), work)
        png = screenshot(page.resolve(), work, max(height, 100))
        if keep is not None:
            shutil.copy(png, keep / "page.png")
        image = Image.open(png).convert("RGB")
        areas = {}
        for fid, (x, y, w, h) in boxes.items():
            left, top = max(0, round(x)), max(0, round(y))
            right, bottom = min(image.width, round(x + w)), min(image.height, round(y + h))
            crop = image.crop((left, top, max(left, right), max(top, bottom)))
            colours, chromatic = _paint(crop)
            areas[fid] = PlotArea(fid, left, top, crop.width, crop.height, colours, chromatic)
        return areas


def _paint(crop: Image.Image) -> tuple[int, float]:
    """(distinct colours, the fraction of pixels that are not grey) of an RGB image."""
    import numpy as np

    rgb = np.asarray(crop, dtype=np.int32).reshape(-1, 3)
    if not len(rgb):
        return 0, 0.0
    packed = (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]
    spread = rgb.max(axis=1) - rgb.min(axis=1)
    return len(np.unique(packed)), float((spread > GREY_SPREAD).mean())
