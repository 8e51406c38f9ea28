"""Sphinx extension: the built book renders offline, with no errors in the browser's console.

MathJax
-------

Sphinx loads MathJax 3 from a CDN by default; a reader without a network (or a CI browser with
the network off) then sees raw LaTeX. This extension copies MathJax 2.7 from the
``jupyter-server-mathjax`` package (a dependency of the ``book`` extra) into
``_build/html/_static/mathjax`` and points ``mathjax_path`` at it.

The package ships MathJax's combined configuration ``TeX-AMS-MML_HTMLorMML-full`` (TeX input,
HTML-CSS output) and the STIX-Web fonts, which are the ones used. MathJax 2 never looks inside
``pre`` and ``code`` elements, so code and its outputs are left alone.

Theme fixes
-----------
- Jupyter Book registers sphinx-thebe's configuration script twice, so the second copy's
  ``const THEBE_JS_URL`` is a ``SyntaxError`` on every page: identical inline scripts are dropped.
- pydata-sphinx-theme logs "Got invalid theme mode" unless a default colour mode is set: light.
- A displayed equation wider than the text column was cut off (``div.math`` hides its overflow):
  it scrolls sideways instead (``offline_html.css``). ``scripts/check_html.py`` still reports
  any equation wider than the column at desktop width, so that none needs the scroll bar there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

MATHJAX_CONFIG = {
    "tex2jax": {
        "inlineMath": [["\\(", "\\)"]],
        "displayMath": [["\\[", "\\]"]],
        "processEscapes": True,
        "ignoreClass": "tex2jax_ignore|mathjax_ignore",
    },
    "HTML-CSS": {
        "availableFonts": [], "preferredFont": None, "webFont": "STIX-Web", "imageFont": None,
        # MathJax's placeholder font is url('about:blank'), which browsers refuse with a console
        # error on every page; a local() source names the same (absent) font and fetches nothing.
        "styles": {"@font-face": {"font-family": "MathJax_Blank", "src": "local('MathJax_Blank')"}},
    },
    "showMathMenu": False,
    "messageStyle": "none",
}


CSS = """/* offline_html.py: a displayed equation wider than the column scrolls instead of being cut off */
div.math { overflow-x: auto; overflow-y: hidden; }
"""


def mathjax_source() -> Path:
    """The MathJax 2 tree shipped by ``jupyter-server-mathjax``."""
    try:
        import jupyter_server_mathjax
    except ImportError as error:  # pragma: no cover - the book extra installs it
        raise ImportError("the book needs jupyter-server-mathjax (pip install -e '.[book]')") from error
    return Path(jupyter_server_mathjax.__file__).parent / "static"


def _configure(app, config) -> None:
    # relative to _static; the package ships only this combined configuration (TeX in, HTML-CSS out)
    config.mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
    config.mathjax2_config = MATHJAX_CONFIG
    config.mathjax3_config = None  # MathJax 3 settings would be read as a v2 configuration
    config.myst_update_mathjax = False  # ...so MyST must not add its own


def _theme_defaults(app, config) -> None:
    context = dict(config.html_context or {})
    context.setdefault("default_mode", "light")  # read by the theme's page template
    config.html_context = context


def _unique_scripts(app, pagename, templatename, context, doctree) -> None:
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # an inline script is registered once with filename None and once with ""
        key = (getattr(script, "filename", script) or "", tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"][:] = unique  # in place: it is the builder's own list


def _copy(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        shutil.copytree(mathjax_source(), Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)
        (Path(app.outdir) / "_static" / "offline_html.css").write_text(CSS, encoding="utf-8")


def setup(app):
    app.connect("config-inited", _configure, priority=900)
    app.connect("config-inited", _theme_defaults, priority=900)
    app.connect("html-page-context", _unique_scripts, priority=999)  # after the scripts are added
    app.connect("build-finished", _copy)
    app.add_css_file("offline_html.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
