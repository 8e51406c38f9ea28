# The book's two commands: `make book` (the main job) and `make test`.
# Both install the project first (editable, with the book and test extras) if needed.
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install -e ".[book,test]"
NBVAL = --nbval --nbval-sanitize-with nbval_sanitize.cfg --nbval-cell-timeout=600

.PHONY: install book test execute clean

install:
	$(PIP_INSTALL)

book: install
	jupyter-book build . -W --keep-going

test: install
	$(PYTHON) -m pytest tests book $(NBVAL)

# Re-execute notebooks in place exactly as nbval checks them: `make execute` (all) or
# `make execute NB=book/01_why_transformers.ipynb`.
execute:
	$(PYTHON) scripts/execute_notebooks.py $(NB)

clean:
	rm -rf _build
