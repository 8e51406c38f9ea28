"""pytest set-up shared by the package tests (``tests/``) and nbval's notebook runs (``book/``).

nbval starts each notebook's kernel with this process's environment, so what is set here is what
the notebooks see when they are checked:

* ``TQDM_DISABLE=1``: progress bars are hidden, so the re-executed cells print exactly what the
  committed notebooks store (no progress frames; a reader running a cell still sees its bar).
* Hugging Face's offline switches, before anything imports ``datasets``: nothing may download.
* No ``BOOK_SCALE``/``BOOK_DEVICE``/``BOOK_RESULTS``: the stored outputs are those of ``SCALE = 1``
  on the CPU, whatever a reader's shell has set (``scripts/scale.py`` runs other scales).
"""

import os

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "0")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # no debugger notice on the kernels' stderr
for _name in ("BOOK_SCALE", "BOOK_DEVICE", "BOOK_RESULTS", "BOOK_CHAPTER"):
    os.environ.pop(_name, None)

