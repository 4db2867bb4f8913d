# The two commands of the quickstart are `make book` and `make test`; the rest are their parts.

# PyTorch's OpenMP threads spin while they wait; with two notebooks sharing two cores that spinning
# slows small matrix products by an order of magnitude. Passive waiting keeps both threads useful.
export OMP_WAIT_POLICY ?= PASSIVE
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
MATHJAX_VERSION ?= 3.2.2

.PHONY: book test env export check-export mathjax html execute bench clean

## Set up the environment and build the book into _build/html.
book: env mathjax html

## Run the whole test suite: unit, property and reference tests, and strict nbval over every notebook.
## Two workers on two cores, one thread each.
test: env
	TRANSFORMER_LIB_PRESET=tiny OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist loadfile \
	    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg tests book

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

env: $(VENV)/.installed

## Export the notebooks' `#| export` cells into transformer_lib/.
export: env
	$(VENV)/bin/nbdev-export

## Fail when exporting again would change transformer_lib/.
check-export: env
	$(PY) -m pytest -q tests/test_export.py

## MathJax 3 from the npm registry, served by the book itself (no network needed to read it).
mathjax: _mathjax/mathjax/tex-chtml.js
_mathjax/mathjax/tex-chtml.js:
	rm -rf _mathjax && mkdir -p _mathjax/tmp
	cd _mathjax/tmp && npm pack --silent mathjax@$(MATHJAX_VERSION) >/dev/null && tar xzf mathjax-*.tgz
	mv _mathjax/tmp/package/es5 _mathjax/mathjax && rm -rf _mathjax/tmp

html: env mathjax
	$(VENV)/bin/jupyter-book build -W --keep-going .

## Run one notebook top to bottom and store its outputs: make execute NB=book/05_attention.ipynb
execute: env
	OMP_NUM_THREADS=1 $(PY) tools/execute.py $(NB)

## Side-by-side speed measurements (each prints ratio=... last).
bench: env
	for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f --quick || exit 1; done

clean:
	rm -rf _build _mathjax
