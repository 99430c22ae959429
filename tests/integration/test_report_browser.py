"""The pipeline's HTML report as people see it: opened in a real headless browser (Debian's Chromium,
installed by `make test`), with the screenshot checked for every chart having rendered. A copy of the
report whose chart images are broken is the control: the same check must fail on it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from PIL import Image

from pipeline.report import ReportOptions, run_report
from pipeline.synth import FleetSpec, generate

pytestmark = pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")

# The bar colours pipeline/charts.py draws with, one or more per chart.
CHART_COLOURS = {"#4c72b0": "bytes per type", "#d62728": "sessions, flapping, topic deletions",
                 "#2ca02c": "topic creations", "#8172b2": "hot keys", "#9ecae1": "steady brokers"}


def _chromium() -> str:
    found = shutil.which("chromium")
    assert found, "chromium missing: make test installs Debian's chromium (scripts/ensure-debian-package.sh)"
    return found


def screenshot(html: str, png: str) -> Image.Image:
    res = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--window-size=1200,12000", f"--screenshot={png}", f"file://{html}"],
                         capture_output=True, text=True, timeout=120, cwd=os.path.dirname(png))
    assert res.returncode == 0 and os.path.exists(png), res.stderr[-2000:]
    return Image.open(png).convert("RGB")


def colour_pixels(image: Image.Image) -> dict[str, int]:
    """Pixels of each chart colour (within a small tolerance: anti-aliasing and scaling)."""
    wanted = {c: tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in CHART_COLOURS}
    counts = dict.fromkeys(CHART_COLOURS, 0)
    for n, pixel in image.getcolors(maxcolors=1 << 24) or []:
        for name, rgb in wanted.items():
            if all(abs(a - b) <= 6 for a, b in zip(pixel, rgb, strict=True)):
                counts[name] += n
    return counts


# `make test-slow` (25 s): make test builds the same report and checks its tables and charts
# (tests/unit/test_pipeline_spark.py, tests/integration/test_pipeline.py); this one renders it in Chromium.
@pytest.mark.slow
def test_the_report_renders_its_charts_in_a_real_browser(spark, tmp_path) -> None:
    log = str(tmp_path / "log")
    generate(log, FleetSpec(records=12_000, clusters=2, groups_per_cluster=4, topics_per_group=12,
                            flappy_fraction=0.3, seed=11))
    out = str(tmp_path / "report")
    run_report(spark, log, out, ReportOptions(top=10))
    html = os.path.join(out, "report.html")
    with open(html) as f:
        page = f.read()
    charts = re.findall(r"<img alt='([^']+)' src='data:image/png;base64,", page)
    assert len(charts) == 6, charts

    shown = colour_pixels(screenshot(html, str(tmp_path / "report.png")))
    assert all(n >= 300 for n in shown.values()), {CHART_COLOURS[c]: n for c, n in shown.items()}

    # Control: the same page with its images broken shows none of the charts' colours.
    broken = os.path.join(out, "broken.html")
    with open(broken, "w") as f:
        f.write(re.sub(r"base64,[A-Za-z0-9+/=]+", "base64,AAAA", page))
    none = colour_pixels(screenshot(broken, str(tmp_path / "broken.png")))
    assert all(n < 50 for n in none.values()), none
