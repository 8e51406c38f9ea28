"""Sphinx extension: ``{{ repository_url }}`` in the book's Markdown pages is the repository's address.

The address is set once, as ``repository: url:`` in ``_config.yml`` (Jupyter Book passes it to
the theme as ``html_theme_options["repository_url"]``, which the launch and source buttons use).
The placeholder is replaced when a page is read, code blocks included, so the landing page's
``git clone`` line always names the configured repository. ``scripts/set_repository.py`` changes
the address everywhere it is repeated outside the book (README, notebooks' install lines, Binder).
"""

from __future__ import annotations

PLACEHOLDER = "{{ repository_url }}"


def _substitute(app, docname, source) -> None:
    url = (app.config.html_theme_options or {}).get("repository_url")
    if PLACEHOLDER in source[0]:
        if not url:
            raise ValueError(f"{docname} uses {PLACEHOLDER} but _config.yml sets no repository: url:")
        source[0] = source[0].replace(PLACEHOLDER, url)


def setup(app):
    app.connect("source-read", _substitute)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
