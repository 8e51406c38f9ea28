# The book's two commands: `make book` (the main job) and `make test`.
# Both install the project first (editable, with the book and test extras) if needed.
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install -e ".[book,test]"
NBVAL = --nbval --nbval-sanitize-with nbval_sanitize.cfg --nbval-cell-timeout=600
# PyTorch's and the math libraries' generic CPU kernels: another summation order, as on another CPU.
PORTABLE_ENV = ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41

.PHONY: install book test test-native lint check-html bench execute scale clean

install:
	$(PIP_INSTALL)

book: install
	jupyter-book build . -W --keep-going

# The package tests, then every notebook once, with PyTorch's and the math libraries' generic CPU
# kernels: they sum floats in another order, as another reader's CPU would, so a stored output
# that passes here is portable (see CONTRIBUTING.md). The package tests keep this machine's kernels
# (torch.compile's CPU code generation does not build under the generic ones). Two workers
# (pytest-xdist): a test module or a notebook stays in one worker, its cells in order, and each
# notebook's kernel runs one thread (NOTEBOOK_ENV): two kernels of two OpenMP threads each on two
# cores spin against each other (a Chapter 4 training cell took 21 s with one thread, over 300 s
# with two, under load).
NOTEBOOK_ENV = OMP_NUM_THREADS=1
test: install
	$(PYTHON) -m pytest tests -n 2 --dist loadscope
	$(PORTABLE_ENV) $(NOTEBOOK_ENV) $(PYTHON) -m pytest book $(NBVAL) -n 2 --dist loadscope

# Everything with this machine's own (fastest) kernels, in one run.
test-native: install
	$(NOTEBOOK_ENV) $(PYTHON) -m pytest tests book $(NBVAL) -n 2 --dist loadscope

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

# Run notebooks at another scale into _build/scale (book/ is never written) and record their
# headline numbers in book/results/scale/ (Appendix C): `make scale SCALE=2`,
# `make scale SCALE=4 DEVICE=cuda NB=book/10_bert.ipynb`. Default: every notebook, $$BOOK_SCALE or 2.
scale: install
	$(PYTHON) scripts/scale.py $(if $(SCALE),--scale $(SCALE)) $(if $(DEVICE),--device $(DEVICE)) $(NB)

clean:
	rm -rf _build
