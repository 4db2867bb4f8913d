# The two commands of the quickstart are `make book` and `make test`; the rest are their parts (CI also runs
# `make test-colab-versions`, the second pass under Colab's versions).

# PyTorch's OpenMP threads spin while they wait; with two notebooks sharing two cores that spinning
# slows small matrix products by an order of magnitude. Passive waiting keeps both threads useful.
export OMP_WAIT_POLICY ?= PASSIVE
# The first of Python 3.11, 3.12 and 3.13 that runs here (`PYTHON=python3.13 make book` chooses). A name that only
# exists as a pyenv shim for a version not selected fails to run, so each is tried, not just looked up.
ifndef PYTHON
PYTHON := $(shell for p in python3.11 python3.12 python3.13; do $$p -c "" 2>/dev/null && { echo $$p; break; }; done)
endif
ifeq ($(strip $(PYTHON)),)
$(error no Python 3.11, 3.12 or 3.13 found; install one, or name it: make PYTHON=/path/to/python3.x)
endif
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch 2.13.0 for Python 3.11 (the CPU build where pip finds one, as CI does); for another Python, what
# requirements.txt's range allows.
PYTHON_VERSION := $(shell $(PYTHON) -c "import sys; print('%d.%d' % sys.version_info[:2])")
TORCH_SPEC ?= $(if $(filter 3.11,$(PYTHON_VERSION)),torch==2.13.0,torch>=2.11)

.PHONY: book test test-browser test-other-kernels test-colab-versions env-colab colab env export check-export html execute bench clean gpu-data

## Set up the environment and build the book into _build/html.
book: env html

NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# One worker a core, one thread each (WORKERS=4 make test to choose); workers take whole files, the longest first
# (conftest.py orders them by tests/durations.json).
# (The cores this process may use; not nproc, which answers OMP_NUM_THREADS when it is set.)
WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count())" 2>/dev/null || echo 2)
PYTEST = TRANSFORMER_LIB_PRESET=tiny OMP_NUM_THREADS=1 $(PY) -m pytest -n $(WORKERS) --dist loadfile \
          --no-loadscope-reorder --durations=12 --junitxml=_build/junit-$@.xml
# Another numerical path through the same maths: PyTorch's kernels without hand-vectorised code and MKL's
# matrix products on its reproducible AVX path (no fused multiply-add, unlike the AVX2 and AVX-512 paths it
# takes by default). Stored outputs must not depend on the path, so both runs compare the same ones. (MKL's SSE2
# path, MKL_CBWR=COMPATIBLE, is a third one, about three times slower at matrix products: the seed sweep of
# tools/margins.py runs that.)
OTHER_KERNELS ?= ATEN_CPU_CAPABILITY=default MKL_CBWR=AVX

## Run the whole test suite once: ruff, the unit, property and reference tests, and strict nbval over every
## notebook, on one worker a core with one thread each.
test: env
	$(VENV)/bin/ruff check .
	$(PYTEST) $(NBVAL) --ignore=tests/browser tests book

## The built book in headless Chromium (tests/browser): what a reader's browser shows. Needs Debian's `chromium`.
test-browser: html
	$(PY) -m pytest -q tests/browser

## Every notebook again with the math kernels on another path, against the same stored outputs, and the Colab-like
## runs beside it, in this environment (CI runs this pass under Colab's versions: `make test-colab-versions`).
test-other-kernels: env
	@echo "== every notebook again, math kernels on another path: $(OTHER_KERNELS)"
	$(OTHER_KERNELS) $(PY) -c "import torch; print('CPU kernels:', torch.backends.cpu.get_cpu_capability())"
	@# the Colab-like runs share the cores with this pass: they fill the time its workers would spend idle
	@mkdir -p _build; $(MAKE) --no-print-directory colab > _build/colab.log 2>&1 & colab=$$!; \
	$(OTHER_KERNELS) $(PYTEST) $(NBVAL) book; status=$$?; \
	wait $$colab; colab_status=$$?; echo "== Colab-like runs"; cat _build/colab.log; \
	test $$status -eq 0 && test $$colab_status -eq 0

## Chapters as a Colab reader first runs them: each notebook alone in an empty folder, in a fresh Python holding
## only torch, numpy, matplotlib and ipykernel, its set-up cell cloning the repository (served from this commit).
## The longest first: two at a time, the two short ones share a core while chapter 13 trains on the other.
## Their Python and torch are this environment's unless named: CI names Colab's (COLAB_PYTHON, COLAB_TORCH).
COLAB_NOTEBOOKS ?= book/13_translator.ipynb book/01_tokens.ipynb book/10_transformer.ipynb
COLAB_PYTHON ?= $(PYTHON)
COLAB_TORCH ?= $(TORCH_SPEC)
## The runtime's packages are hard links of those installed in this environment (or COLAB_PACKAGES_FROM's), where
## its Python and torch are the same: the same files without unpacking torch again.
COLAB_PACKAGES_FROM ?= $(PY)
colab: env
	TRANSFORMER_LIB_PRESET=tiny OMP_NUM_THREADS=1 $(PY) tools/colab_run.py --python "$(COLAB_PYTHON)" \
	  --torch "$(COLAB_TORCH)" --packages-from "$(COLAB_PACKAGES_FROM)" $(COLAB_NOTEBOOKS)

## Colab's versions, as its runtime reported them in 2026-08 (CONTRIBUTING): Python 3.13 and torch 2.11, in an
## environment of their own (.venv-colab). A Python 3.13 on the PATH, else pyenv's.
COLAB_VERSIONS_PYTHON ?= $(shell for p in python3.13 $$(pyenv root 2>/dev/null)/versions/3.13*/bin/python3.13; do \
                           $$p -c "" 2>/dev/null && { echo $$p; break; }; done)
COLAB_VERSIONS_TORCH ?= torch==2.11.0
COLAB_VENV ?= .venv-colab

env-colab:
	@test -n "$(COLAB_VERSIONS_PYTHON)" || { echo "no Python 3.13 found; name one: COLAB_VERSIONS_PYTHON=..."; exit 1; }
	$(MAKE) --no-print-directory env VENV=$(COLAB_VENV) PYTHON=$(COLAB_VERSIONS_PYTHON) TORCH_SPEC=$(COLAB_VERSIONS_TORCH)

## CI's second pass, under Colab's versions: the library's tests, and every notebook with its kernel's math on the
## other path (OTHER_KERNELS, through NOTEBOOK_KERNEL_ENV: conftest.py) against the same stored outputs, with the
## Colab-like runs beside it (they fill the time its workers would spend idle). One pass for both keeps the two
## cores busy to its end.
test-colab-versions: env-colab
	$(COLAB_VENV)/bin/python -c "import platform, torch; print('Python', platform.python_version(), 'torch', torch.__version__)"
	$(OTHER_KERNELS) $(COLAB_VENV)/bin/python -c "import torch; print('the notebooks\' CPU kernels:', \
	  torch.backends.cpu.get_cpu_capability())"
	@mkdir -p _build; $(MAKE) --no-print-directory colab COLAB_PYTHON=$(COLAB_VENV)/bin/python \
	  COLAB_TORCH=$(COLAB_VERSIONS_TORCH) COLAB_PACKAGES_FROM=$(COLAB_VENV)/bin/python > _build/colab.log 2>&1 & colab=$$!; \
	NOTEBOOK_KERNEL_ENV="$(OTHER_KERNELS)" TRANSFORMER_LIB_PRESET=tiny OMP_NUM_THREADS=1 $(COLAB_VENV)/bin/python -m pytest \
	  -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=12 --junitxml=_build/junit-$@.xml \
	  -q $(NBVAL) --ignore=tests/browser \
	  tests book; status=$$?; \
	wait $$colab; colab_status=$$?; echo "== Colab-like runs"; cat _build/colab.log; \
	test $$status -eq 0 && test $$colab_status -eq 0

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -r requirements.txt
	@# the editable install writes transformer_lib.egg-info into the tree: one environment at a time (CI makes two
	@# at once), where flock(1) is there to say so
	$(if $(shell command -v flock),flock pyproject.toml) $(PY) -m pip install --quiet --no-deps -e .
	@# tools/ on the path, so that nbdev-export finds its export processor (pyproject.toml, `export_procs`)
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'book_tools.pth')\
	.write_text('$(CURDIR)/tools\n')"
	touch $@

env: $(VENV)/.installed

## Export the notebooks' `#| export` cells into transformer_lib/.
export: env
	$(VENV)/bin/nbdev-export

## Fail when exporting again would change transformer_lib/.
check-export: env
	$(PY) -m pytest -q tests/test_export.py

## The book, from the stored outputs. MathJax comes with it (sphinx-mathjax-offline), so it reads offline. Then the
## browser translator of appendix E: its scripts and the shipped model's weights (tools/web_model.py).
html: env
	$(VENV)/bin/jupyter-book build -W --keep-going .
	$(PY) tools/web_model.py _build/html

## Run one notebook top to bottom and store its outputs: make execute NB=book/05_attention.ipynb
## (chapter 13 trains the tiny preset unless TRANSFORMER_LIB_PRESET names another)
execute: env
	OMP_NUM_THREADS=1 TRANSFORMER_LIB_PRESET=$${TRANSFORMER_LIB_PRESET:-tiny} $(PY) tools/execute.py $(NB)

## Side-by-side speed measurements, quickly: the benchmarks that print ratio=... last (the peers' training runs
## and the batches' helper module are not timings).
bench: env
	for f in $$(grep -l 'ratio=' benchmarks/*.py); do echo "== $$f"; $(PY) $$f --quick || exit 1; done

## Copy the Multi30k files into data/multi30k, a folder inside the tree that git ignores, for a machine that sees only
## the tree (tools/gpu_session.py reads them there): make gpu-data GPU_DATA_FROM=folder-of-the-six-files
GPU_DATA_FROM ?= ../shared/data/multi30k
gpu-data:
	mkdir -p data/multi30k
	cp $(GPU_DATA_FROM)/*.gz $(GPU_DATA_FROM)/SHA256SUMS data/multi30k/

clean:
	rm -rf _build
