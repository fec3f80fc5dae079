"""Make a published asv dashboard work offline: serve its JavaScript and CSS from the html dir.

asv 0.6's pages load jQuery, flot, bootstrap, md5 and stupidtable from public CDNs; on a
machine without internet access (this project's CI) the pages then show only "Make sure you
have an active internet connection". `python -m impl.ci.dashboard [HTML_DIR]` (run by `make
dashboard` after `asv publish`) fetches the same library versions once with `npm pack` (the
npm registry is reachable where the CDNs are not), caches them under
~/.cache/hotpath/asv-vendor, copies them to HTML_DIR/vendor/ and points the pages at them.
Where npm has no minified build (flot 0.8.3) the unminified file is used; stupidtable 1.0.1
is only on npm as 1.1.3 (same API). Subresource-integrity attributes of rewritten tags are
dropped, since the local copies are not byte-identical to the CDN's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

#: CDN URL -> (npm package@version, file inside the package tarball)
ASSETS: dict[str, tuple[str, str]] = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery@3.3.1", "dist/jquery.min.js"),
    **{
        f"https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot{part}.min.js": (
            "flot@0.8.3",
            f"jquery.flot{part}.js",
        )
        for part in ("", ".time", ".selection", ".categories")
    },
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": (
        "flot-orderbars@1.0.0",
        "js/jquery.flot.orderBars.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": (
        "stupid-table-plugin@1.1.3",
        "stupidtable.min.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": (
        "blueimp-md5@2.19.0",
        "js/md5.min.js",
    ),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": (
        "bootstrap@3.1.1",
        "dist/js/bootstrap.min.js",
    ),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": (
        "bootstrap@3.1.1",
        "dist/css/bootstrap.min.css",
    ),
}
#: the glyph fonts bootstrap's CSS loads relative to itself (../fonts/)
FONTS = ("bootstrap@3.1.1", "dist/fonts/")
_URL = re.compile(r"""(?P<attr>src|href)=(?P<q>["'])(?P<url>https://[^"']+)(?P=q)""")
_SRI = re.compile(r"""\s+(?:integrity|crossorigin|referrerpolicy)=(["'])[^"']*\1""")


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hotpath" / "asv-vendor"


def package(spec: str) -> Path:
    """The unpacked npm package `spec` (name@version) in the cache; fetched with `npm pack`."""
    target = cache_dir() / spec
    if (target / "package.json").exists():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "npm not found: cannot fetch the dashboard's JavaScript (apt-get install npm)"
        )
    download = cache_dir() / "tarballs"
    download.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "pack", "--silent", "--pack-destination", str(download), spec],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"npm pack {spec} failed:\n{done.stderr[-2000:]}")
    tarball = download / done.stdout.strip().splitlines()[-1]
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(staging, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    (staging / "package").rename(target)
    staging.rmdir()
    return target


def local_path(url: str) -> str:
    """Where a CDN URL's copy lives, relative to the html directory (host and path kept)."""
    return "vendor/" + url.removeprefix("https://")


def vendor(html_dir: Path) -> list[str]:
    """Copy the CDN assets into `html_dir`/vendor and rewrite its pages; the URLs replaced."""
    replaced: set[str] = set()
    for url, (spec, inner) in ASSETS.items():
        destination = html_dir / local_path(url)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package(spec) / inner, destination)
        if inner.endswith(".css"):
            fonts = destination.parent.parent / "fonts"
            shutil.copytree(package(FONTS[0]) / FONTS[1], fonts, dirs_exist_ok=True)

    def swap(match: re.Match) -> str:
        url = match["url"]
        if url not in ASSETS:
            return match[0]
        replaced.add(url)
        return f"{match['attr']}={match['q']}{local_path(url)}{match['q']}"

    for page in html_dir.glob("*.html"):
        text = page.read_text()
        lines = []
        for line in text.splitlines(keepends=True):
            new = _URL.sub(swap, line)
            lines.append(_SRI.sub("", new) if new != line else line)
        page.write_text("".join(lines))
    return sorted(replaced)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    html_dir = Path(args[0] if args else ".asv/html")
    if not (html_dir / "index.html").exists():
        print(f"{html_dir}/index.html not found: run `asv publish` first", file=sys.stderr)
        return 2
    replaced = vendor(html_dir)
    print(f"dashboard: {len(replaced)} CDN assets now served from {html_dir}/vendor/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
