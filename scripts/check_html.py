"""Load every page of the built book in headless Chromium, offline, and check what a reader sees.

Usage: ``python3 scripts/check_html.py [_build/html]`` (``make check-html``).

The pages are served over HTTP from the loopback interface, as a reader's browser gets them from
the book's site. The browser is cut off from every other network (a dead proxy and no DNS), and
for each page the check asserts that:

- the equations are rendered: MathJax produced output for every math element and no raw ``\\(``
  is left in the visible text;
- every image loaded (``naturalWidth > 0``), and every local link, image and script of the page
  points to a file of the build (and to an id on that page, for ``#fragment`` links);
- the console logged no error and the page threw no exception (a script fetched from a CDN
  fails here, since the network is off);
- no table is wider than the page's content column (a column off-screen, as Appendix A's
  verdicts once were), and no displayed equation is wider than the block that holds it (its
  right-hand side cut off or hidden behind a scroll bar);
- the landing page links every chapter of ``_toc.yml``.

A screenshot of each page goes to ``_build/screenshots/``. Chromium is driven through its
DevTools protocol (``websocket-client``); it is the distribution's package (``apt install
chromium``).
"""

from __future__ import annotations

import base64
import functools
import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import websocket
import yaml

ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = (1280, 900)
SKIP_PAGES = {"genindex.html", "search.html"}  # Sphinx's generated index and search pages


class _Links(HTMLParser):
    """Collect ids and the local URLs a page references (links, images, scripts, stylesheets)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.urls: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            url = attrs.get(key)
            if url and tag in ("a", "img", "script", "link", "source"):
                self.urls.append((tag, url))


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def broken_links(html_dir: Path, page: Path, cache: dict[Path, _Links]) -> list[str]:
    """Local URLs of ``page`` that point to no file of the build, or to no id of their target."""
    problems = []
    page = page.resolve()
    if page not in cache:
        cache[page] = _parse(page)
    for tag, url in cache[page].urls:
        parts = urlsplit(url)
        if parts.scheme or parts.netloc or url.startswith(("mailto:", "javascript:", "data:")):
            continue  # external links are not followed: the book must not need them to render
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page.resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.exists() or html_dir.resolve() not in target.parents:
            problems.append(f"<{tag}> {url}: no such file in the build")
            continue
        if parts.fragment and target.suffix == ".html" and tag == "a":
            if target not in cache:
                cache[target] = _parse(target)
            if unquote(parts.fragment) not in cache[target].ids:
                problems.append(f"<a> {url}: no id {parts.fragment!r} in {target.name}")
    return problems


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would drown the report
        pass


class Browser:
    """A headless Chromium with the network off, driven over the DevTools protocol."""

    def __init__(self) -> None:
        binary = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
                      None)
        if binary is None:
            sys.exit("check_html: no Chromium found; install the distribution's package (apt install chromium)")
        self.profile = tempfile.mkdtemp(prefix="check-html-")
        self.process = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-extensions", "--hide-scrollbars", "--disable-quic",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", f"--user-data-dir={self.profile}",
             # Off the network: every request but the loopback's goes to a dead proxy, and no host
             # name resolves.
             "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().count("\n") >= 1:
                break
            time.sleep(0.1)
        else:
            self.close()
            sys.exit("check_html: Chromium did not start")
        port, path = port_file.read_text().split("\n")[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=60, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=VIEWPORT[0], height=VIEWPORT[1],
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, session: bool = False, **params) -> dict:
        message = {"id": next(self.ids), "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == message["id"]:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluating {expression[:60]!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def load(self, url: str, timeout: float = 60.0) -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        deadline = time.time() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.time() > deadline:
                raise RuntimeError(f"{url} did not finish loading in {timeout:.0f} s")
            self.events.append(json.loads(self.ws.recv()))

    def errors(self) -> list[str]:
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append("exception: " + params["exceptionDetails"].get("exception", {}).get(
                    "description", params["exceptionDetails"].get("text", "")).splitlines()[0])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                          for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                if entry.get("url", "").endswith("/favicon.ico"):
                    continue  # the browser asks for one by itself; the book has none
                found.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())
        return found

    def screenshot(self, path: Path, max_height: int = 4000) -> None:
        """The top of the page, up to ``max_height`` pixels (whole pages can be 100,000 high)."""
        height = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]["height"]
        clip = {"x": 0, "y": 0, "width": VIEWPORT[0], "height": min(max(height, VIEWPORT[1]), max_height), "scale": 1}
        data = self.call("Page.captureScreenshot", session=True, format="png", clip=clip,
                         captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


# Waits for MathJax 2 to finish typesetting (or for 20 s), then reports what the reader sees.
PAGE_REPORT = r"""
new Promise(resolve => {
  const report = () => {
    const content = document.querySelector("main") || document.body;
    const walker = document.createTreeWalker(content, NodeFilter.SHOW_TEXT, {acceptNode: node =>
      node.parentElement.closest("script, style, pre, code, textarea, .MathJax_Preview")
        ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
    let text = "";
    while (walker.nextNode()) text += walker.currentNode.nodeValue;
    const raw = [];
    for (const m of text.matchAll(/\\\(|\\\[|\$\$/g)) raw.push(text.slice(Math.max(0, m.index - 30), m.index + 40));
    const column = document.querySelector("main article, main .bd-article, main") || document.body;
    const right = column.getBoundingClientRect().right;
    const wide = [...document.querySelectorAll("main table")]
      .filter(t => t.getBoundingClientRect().width > 0 && t.getBoundingClientRect().right > right + 2)
      .map(t => (t.querySelector("th, td")?.innerText || "").slice(0, 40) +
                ` (table ${Math.round(t.getBoundingClientRect().right)} px > column ${Math.round(right)} px)`);
    // a displayed equation is typeset in span.math inside its block (div.math, overflow hidden)
    const wideMath = [...document.querySelectorAll("main div.math")]
      .map(d => [d, d.querySelector(".MathJax_Display span.math")])
      .filter(([d, m]) => m && d.clientWidth > 0 && m.scrollWidth > d.clientWidth + 2)
      .map(([d, m]) => Array.from(m.textContent || "").slice(0, 30).join("") +
                       ` (equation ${m.scrollWidth} px > block ${d.clientWidth} px)`);
    resolve({
      mathjax: typeof MathJax !== "undefined" && !!MathJax.Hub,
      math: document.querySelectorAll("main .math.notranslate").length,
      rendered: document.querySelectorAll("main .MathJax").length,
      errors: document.querySelectorAll("main .MathJax .merror").length,
      raw: raw.slice(0, 3),
      images: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
      wide: wide,
      wideMath: wideMath,
    });
  };
  const start = Date.now();
  const wait = () => {
    if (typeof MathJax !== "undefined" && MathJax.Hub && MathJax.Hub.queue) {
      MathJax.Hub.Queue(report);
    } else if (Date.now() - start > 20000 || !document.querySelector("main .math.notranslate")) {
      report();
    } else {
      setTimeout(wait, 100);
    }
  };
  wait();
})
"""


def _toc() -> dict:
    return yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))


def toc_chapters() -> list[str]:
    """Every ``chapters:`` entry of ``_toc.yml`` (sections excluded), as paths without suffix."""
    return [c["file"] for part in _toc().get("parts", []) for c in part.get("chapters", [])]


def landing_page_problems(html_dir: Path) -> list[str]:
    """Chapters of ``_toc.yml`` that the landing page's own text does not link to."""
    landing = html_dir / f"{_toc()['root']}.html"
    text = landing.read_text(encoding="utf-8")
    main = text[text.find("<main"): text.find("</main>")] if "<main" in text else text
    linked = {(landing.parent / unquote(urlsplit(h).path)).resolve()
              for h in re.findall(r'href="([^"#]+\.html)[^"]*"', main)}
    return [f"the landing page does not link {chapter}" for chapter in toc_chapters()
            if (html_dir / f"{chapter}.html").resolve() not in linked]


def main(html_dir: Path) -> int:
    html_dir = html_dir.resolve()
    if not (html_dir / "index.html").exists():
        sys.exit(f"check_html: {html_dir} has no index.html; build the book first (make book)")
    shots = html_dir.parent / "screenshots"
    shots.mkdir(exist_ok=True)
    pages = sorted(p for p in html_dir.rglob("*.html")
                   if not ({"_static", "_sources", "_images"} & set(p.relative_to(html_dir).parts))
                   and p.name not in SKIP_PAGES)
    cache = {page: _parse(page) for page in pages}
    problems: dict[str, list[str]] = {}
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = Browser()
    try:
        for page in pages:
            name = page.relative_to(html_dir).as_posix()
            found = broken_links(html_dir, page, cache)
            if re.search(r'http-equiv="refresh"', page.read_text(encoding="utf-8"), re.IGNORECASE):
                # A redirect (the site's index.html): its target is a local link checked above.
                print(f"{'ok  ' if not found else 'FAIL'} {name}: redirect", flush=True)
                if found:
                    problems[name] = found
                continue
            browser.load(base + name)
            report = browser.evaluate(PAGE_REPORT)
            if report["math"] and not report["mathjax"]:
                found.append(f"{report['math']} math elements but MathJax did not load")
            elif report["math"] and report["rendered"] < report["math"]:
                found.append(f"MathJax rendered {report['rendered']} of {report['math']} math elements")
            if report["errors"]:
                found.append(f"{report['errors']} equations failed to typeset")
            found += [f"raw LaTeX left: ...{r}..." for r in report["raw"]]
            found += [f"image did not load: {src}" for src in report["images"]]
            found += [f"table wider than the page: {w}" for w in report["wide"]]
            found += [f"equation wider than the page: {w}" for w in report["wideMath"]]
            found += browser.errors()
            browser.screenshot(shots / (name.replace("/", "__").removesuffix(".html") + ".png"))
            print(f"{'ok  ' if not found else 'FAIL'} {name}: {report['rendered']} equations rendered", flush=True)
            if found:
                problems[name] = found
    finally:
        browser.close()
        server.shutdown()
    landing = landing_page_problems(html_dir)
    if landing:
        problems["landing page"] = landing
    for name, found in problems.items():
        print(f"\n{name}:", *(f"  - {p}" for p in found), sep="\n")
    print(f"\n{len(pages)} pages checked offline, screenshots in {shots}; "
          f"{'no problems' if not problems else f'{len(problems)} with problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html")))
