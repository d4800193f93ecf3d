# The README's two commands: `make book` builds the book, `make test` runs the tests.
# Both create a virtual environment in .venv on first use and install what they need into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

# Every cache and scratch file stays inside the clone's .cache/ (git-ignored; `make clean`
# removes it), so a run leaves nothing elsewhere. TMPDIR matters most: Inductor puts its
# precompiled C++ headers (~150 MB) in tempfile.gettempdir()/torchinductor_<user>/precompiled_headers
# whatever TORCHINDUCTOR_CACHE_DIR says, and the notebooks' scratch folders go there too.
# conftest.py (at the root) sets the same variables for a bare `pytest`.
CACHE := $(CURDIR)/.cache
export TMPDIR := $(CACHE)/tmp
export TORCHINDUCTOR_CACHE_DIR := $(CACHE)/inductor
export TORCH_EXTENSIONS_DIR := $(CACHE)/torch_extensions
export TRITON_CACHE_DIR := $(CACHE)/triton
export XDG_CACHE_HOME := $(CACHE)/xdg
export MPLCONFIGDIR := $(CACHE)/matplotlib
export IPYTHONDIR := $(CACHE)/ipython
export JUPYTER_RUNTIME_DIR := $(CACHE)/jupyter_runtime
$(shell mkdir -p $(TMPDIR))

.PHONY: book book-student pdf test student generate clean

# A .venv that is a link to an environment made elsewhere (shared between clones) is not this
# clone's to rebuild: `python -m venv` cannot write through the link, and a newer requirements
# file here says nothing about it. It is used as it is (install into it where it lives).
$(BIN)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	@if [ -L $(VENV) ]; then \
	  echo "$(VENV) links to $$(readlink $(VENV)): a shared environment, used as it is"; \
	else \
	  $(PYTHON) -m venv $(VENV) && \
	  $(BIN)/python -m pip install -q --upgrade pip && \
	  $(BIN)/python -m pip install -q -r requirements-dev.txt && \
	  touch $@; \
	fi

book: $(BIN)/.installed          ## build the HTML book from the executed notebooks -> _build/html
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "open _build/html/index.html"

book-student: $(BIN)/.installed  ## the book with the labs' student editions (no solutions) -> _build/html-student
	$(BIN)/python scripts/make_student.py --book $(CACHE)/student-book
	$(BIN)/jupyter-book build $(CACHE)/student-book -W -n --keep-going
	rm -rf _build/html-student && mkdir -p _build && cp -r $(CACHE)/student-book/_build/html _build/html-student
	@echo "open _build/html-student/index.html"

pdf: $(BIN)/.installed           ## the whole book as one PDF (headless Chromium) -> _build/pdf/, linked by the HTML book
	$(BIN)/python scripts/book_pdf.py
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "open _build/pdf/pytorch-performance-course.pdf (the HTML book links it)"

test: $(BIN)/.installed          ## unit tests, notebooks on this machine (nbval), reference-run check, book build
	$(BIN)/python -m pytest

generate: $(BIN)/.installed      ## rewrite what is generated: the pages' #@save modules, then the map (docs/ARCHITECTURE.md, __init__ docstrings)
	$(BIN)/python scripts/export_pages.py
	$(BIN)/python scripts/architecture.py

# PYTHONPATH: this clone's perflab, also where .venv links to another clone's environment (whose
# editable install is that clone's perflab)
student: $(BIN)/.installed       ## student versions of the labs -> student/labs/*.ipynb
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(BIN)/python scripts/make_student.py

clean:
	rm -rf _build student .cache
