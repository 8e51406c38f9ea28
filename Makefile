# The book's two commands: `make book` (the main job) and `make test`.
# Both install the project first (editable, with the book and test extras) if needed.
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install -e ".[book,test]"
NBVAL = --nbval --nbval-sanitize-with nbval_sanitize.cfg --nbval-cell-timeout=600
# PyTorch's and the math libraries' generic CPU kernels: another summation order, as on another CPU.
PORTABLE_ENV = ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41

.PHONY: install book test test-portable lint check-html bench execute clean

install:
	$(PIP_INSTALL)

book: install
	jupyter-book build . -W --keep-going

# Two workers (pytest-xdist): a test module or a notebook stays in one worker, its cells in order.
test: install
	$(PYTHON) -m pytest tests book $(NBVAL) -n 2 --dist loadscope

# The notebooks again, as a machine with other CPU kernels would run them (see CONTRIBUTING.md);
# two notebooks at a time (each in its own kernel; a notebook's cells stay together in order).
test-portable: install
	$(PORTABLE_ENV) $(PYTHON) -m pytest book $(NBVAL) -n 2 --dist loadscope

lint:
	$(PYTHON) -m ruff check .

# The built book in headless Chromium with the network off: equations rendered, images and links
# resolve, no console errors; screenshots in _build/screenshots (run `make book` first).
check-html:
	$(PYTHON) scripts/check_html.py _build/html

# Re-run the benchmarks and store their tables in benchmarks/results/, which Appendix B renders.
# Run it on a quiet machine; the tables record the machine they ran on.
bench: install
	$(PYTHON) benchmarks/run_all.py

# Re-execute notebooks in place exactly as nbval checks them: `make execute` (all) or
# `make execute NB=book/01_why_transformers.ipynb`.
execute:
	$(PYTHON) scripts/execute_notebooks.py $(NB)

clean:
	rm -rf _build
