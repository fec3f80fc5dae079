"""The published asv dashboard opens in headless Chromium and draws its graphs.

Builds a tiny asv project in a temporary git repository (three commits, one `track_`
benchmark whose value changes per commit), records results for each commit with the
`existing` environment, runs `asv publish` with this repository's asv.conf.json settings for
the html (so a broken config fails here), makes the pages offline-capable with
`impl.ci.dashboard` (asv's pages load their JavaScript from CDNs this machine cannot
reach), serves the html on loopback (port 0) and loads the benchmark's graph page in
headless Chromium: the DOM must hold the flot canvases and the
screenshot must not be blank. Skipped with a reason where Chromium is not installed
(`apt-get install -y chromium`; .ci/run installs it).
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from impl.ci import dashboard
from tests.support import asv_tiny as tiny

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BENCH = tiny.BENCH
VALUES = ("10", "12", "7")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)"
    ),
    pytest.mark.skipif(
        shutil.which("npm") is None and not dashboard.cache_dir().exists(),
        reason="npm not installed: the dashboard's JavaScript cannot be fetched",
    ),
]


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A tiny project with results for three commits, published; the html directory."""
    repo = tmp_path_factory.mktemp("asvrepo")
    commits = tiny.project(repo, len(VALUES))
    for commit, value in zip(commits, VALUES, strict=True):
        tiny.record(repo, "tiny-machine", commit, value)
    tiny.asv(repo, "publish")
    html = repo / json.loads((repo / "asv.conf.json").read_text())["html_dir"]
    assert (html / "index.html").exists()
    replaced = dashboard.vendor(html)
    assert len(replaced) == len(dashboard.ASSETS), "asv's pages name other CDN assets now"
    assert "https://code.jquery.com" not in (html / "index.html").read_text()
    return html


@pytest.fixture(scope="module")
def server(published: Path):
    """http.server over the published html on 127.0.0.1, port 0; its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(published))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,900",
        "--virtual-time-budget=15000",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _png_pixels(path: Path) -> np.ndarray:
    """The screenshot's RGB pixels (Pillow comes with matplotlib, the notebooks extra)."""
    image = pytest.importorskip("PIL.Image", reason="Pillow not installed (notebooks extra)")
    with image.open(path) as png:
        return np.asarray(png.convert("RGB"), dtype=np.int32)


@pytest.mark.slow
def test_graph_page_draws_the_graph(server: str, tmp_path: Path) -> None:
    """The benchmark's page renders a flot graph of the three results."""
    url = f"{server}/#{BENCH}"
    dom = _chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "flot-base" in dom.stdout, "no flot canvas in the rendered DOM:\n" + dom.stdout[:2000]
    assert BENCH in dom.stdout

    shot = tmp_path / "graph.png"
    done = _chromium(tmp_path, f"--screenshot={shot}", url)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    pixels = _png_pixels(shot)
    assert pixels.std() > 10, "the screenshot is blank"
    # The graph area holds coloured (non-grey) pixels: the plotted line and points.
    spread = pixels.max(axis=2) - pixels.min(axis=2)
    assert (spread > 60).sum() > 100, "no coloured pixels: the graph was not drawn"


@pytest.mark.heavy
def test_front_page_lists_the_benchmark(server: str, tmp_path: Path) -> None:
    """The dashboard's front page (the summary grid) shows the benchmark."""
    dom = _chromium(tmp_path, "--dump-dom", f"{server}/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Tiny" in dom.stdout or "tiny" in dom.stdout
    assert "bench_tiny" in dom.stdout


HISTORY_BENCH = "history.Instructions.track_instructions"
#: counts the points each flot plot is handed, into <body data-points>, once flot has loaded
COUNT_POINTS = """<script>
(function () {
  var plot = $.plot;
  $.plot = function (where, series, options) {
    var most = Number(document.body.getAttribute("data-points") || 0);
    series.forEach(function (s) {
      var shown = (s.data || []).filter(function (p) { return p && p[1] !== null; }).length;
      most = Math.max(most, shown);
    });
    document.body.setAttribute("data-points", String(most));
    return plot.apply(this, arguments);
  };
  Object.keys(plot).forEach(function (key) { $.plot[key] = plot[key]; });
})();
</script>
"""


def _measured(results: Path, benchmark: str) -> int:
    """Commits of the committed history with a value of `benchmark` (for any parameter)."""
    count = 0
    for path in (results / "hotpath-history").glob("*-*.json"):
        if path.name == "machine.json":
            continue
        entry = json.loads(path.read_text())["results"].get(benchmark)
        if entry and any(value is not None for value in entry[0] or []):
            count += 1
    return count


@pytest.fixture(scope="module")
def history_server(tmp_path_factory):
    """The committed history (asv.history.json) published into a temporary html dir, with
    COUNT_POINTS added to its page, served on 127.0.0.1; (base URL, commits measured)."""
    root = tiny.ROOT
    html = tmp_path_factory.mktemp("history-html")
    command = [sys.executable, "-m", "asv", "publish", "--config", "asv.history.json"]
    done = subprocess.run(
        [*command, "--html-dir", str(html)], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    dashboard.vendor(html)
    page = html / "index.html"
    page.write_text(page.read_text().replace("</head>", COUNT_POINTS + "</head>", 1))
    handler = functools.partial(_QuietHandler, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield (
            f"http://127.0.0.1:{httpd.server_address[1]}",
            _measured(root / "benchmarks" / "results", HISTORY_BENCH),
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.mark.slow
def test_committed_history_graph_has_a_point_per_commit(history_server, tmp_path: Path) -> None:
    """The instruction-count graph of the committed history is drawn with one point for each
    commit that has a count."""
    url, measured = history_server
    assert measured >= 2, "benchmarks/results holds fewer than two measured commits"
    dom = _chromium(tmp_path, "--dump-dom", f"{url}/#{HISTORY_BENCH}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "flot-base" in dom.stdout, "no flot canvas in the rendered DOM"
    found = re.search(r'data-points="(\d+)"', dom.stdout)
    assert found, "the page drew no plot"
    assert int(found.group(1)) >= measured, (found.group(1), measured)
