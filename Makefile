# The README's two commands: `make book` builds the book, `make test` runs the tests.
# Both create a virtual environment in .venv on first use and install what they need into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

# torch.compile and extension caches stay inside the clone (CI starts from a clean one).
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/inductor
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions

.PHONY: book test student clean

$(BIN)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

book: $(BIN)/.installed          ## build the HTML book from the executed notebooks -> _build/html
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "open _build/html/index.html"

test: $(BIN)/.installed          ## unit tests, notebooks on this machine (nbval), reference-run check, book build
	$(BIN)/python -m pytest

student: $(BIN)/.installed       ## student versions of the labs -> student/labs/*.ipynb
	$(BIN)/python scripts/make_student.py

clean:
	rm -rf _build student .cache
