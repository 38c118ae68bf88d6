# The course's commands.  `make lab` and `make test` are the quick start; both create
# .venv when it is absent and install into it.  Learners need only `make lab`, which installs
# the course and JupyterLab; `make test` and the instructor's targets add the test and grading
# tools (nbgrader).
PYTHON ?= python3
VENV ?= .venv
# The torch to install when the environment has none.  For this pin, PyPI serves Linux the CUDA
# build (several GB) and macOS and Windows a CPU build.  For a CPU-only build on Linux, take it
# from PyTorch's own index: make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (or install torch into .venv yourself first: it is kept).
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
PORT ?= 8888
BIN := $(VENV)/bin
STAMP := $(VENV)/.icl-course-installed
LAB_STAMP := $(VENV)/.icl-course-lab-installed
# JupyterLab for learners runs with this configuration: nbgrader's menus and panels are switched
# off even when `make test` has installed nbgrader into the same environment.
LEARNER_CONFIG := $(CURDIR)/config/jupyter-learner
# no browser where there is no display to show it
NO_BROWSER := $(if $(or $(DISPLAY),$(WAYLAND_DISPLAY),$(filter Darwin,$(shell uname -s))),,--no-browser)
# containers and Colab-like machines run as root, which JupyterLab refuses unless told
ALLOW_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

.PHONY: install install-lab lab instructor-lab lint test test-fast test-lower-bounds site serve-site course notebooks exercises benchmark clean

install: $(STAMP)
install-lab: $(LAB_STAMP)

# torch first, and only when none is importable: the CUDA or CPU build a user chose stays.
define INSTALL_TORCH
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null && echo "torch is already installed: keeping it" \
		|| $(BIN)/python -m pip install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
endef

$(LAB_STAMP): pyproject.toml
	$(INSTALL_TORCH)
	$(BIN)/python -m pip install -e ".[lab]"
	@touch $@

$(STAMP): pyproject.toml
	$(INSTALL_TORCH)
	$(BIN)/python -m pip install -e ".[lab,dev,grading,site]"
	@touch $@ $(LAB_STAMP)

lab: $(LAB_STAMP)
	JUPYTER_CONFIG_DIR=$(LEARNER_CONFIG) $(BIN)/jupyter lab --port=$(PORT) $(NO_BROWSER) $(ALLOW_ROOT) \
		--ServerApp.root_dir=. --LabApp.default_url=/lab/tree/chapters

# The instructor's JupyterLab, with nbgrader's formgrader and assignment panels.
instructor-lab: $(STAMP)
	$(BIN)/jupyter lab --port=$(PORT) $(NO_BROWSER) $(ALLOW_ROOT) --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/solutions

# pyflakes, pycodestyle and import order (the rule set is in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check icl_course tests benchmarks research chapters solutions

# everything: the linter, the package's tests and every chapter and answer key under nbval
test: lint
	$(BIN)/python -m pytest --nbval-lax --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg \
		--durations=15

# The lowest versions of numpy, matplotlib, ipywidgets and tqdm that pyproject.toml promises, in an
# environment of their own: the package's tests and every chapter (grading needs nbgrader: not here).
LOWER := .venv-lower-bounds
test-lower-bounds:
	@test -x $(LOWER)/bin/python || $(PYTHON) -m venv $(LOWER)
	$(LOWER)/bin/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(LOWER)/bin/python -m pip install -q $$($(PYTHON) tests/lower_bounds.py) "pytest>=7.4" "pyyaml>=6.0" \
		"nbformat>=5.9" "nbval>=0.11" "ipykernel>=6.20" "tomli>=2.0; python_version < '3.11'"
	$(LOWER)/bin/python -m pip install -q --no-deps -e .
	$(LOWER)/bin/python -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env \
		--nbval-sanitize-with tests/sanitize.cfg -m "not slow" \
		--ignore=tests/test_grade.py --ignore=tests/test_exercises.py tests chapters

# while working: the package's tests without the slow ones (no notebooks, no grading runs)
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow" -q

# The course as a static website in build/site (open build/site/index.html): the chapters with their
# stored outputs, search, the notation card, the references and the list of exercises.
site: $(STAMP)
	$(BIN)/python site/build.py

# The same, then served on http://127.0.0.1:8000 (SITE_PORT=...) until Ctrl-C: search shows its
# snippets only over a server, as browsers refuse its fetches from file://.
SITE_PORT ?= 8000
serve-site: $(STAMP)
	$(BIN)/python site/build.py --serve --port $(SITE_PORT)

# Execute every chapter top to bottom and write HTML pages to build/.
course: $(STAMP)
	@mkdir -p build
	$(BIN)/jupyter nbconvert --to html --execute --output-dir build chapters/*.ipynb

# Re-execute the chapters and solutions in place, so that their stored outputs are current.
notebooks: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.record_timing=False \
		chapters/*.ipynb $(wildcard solutions/*.ipynb)
	$(BIN)/python tests/strip_volatile.py chapters/*.ipynb $(wildcard solutions/*.ipynb)

benchmark: $(STAMP)
	$(BIN)/python benchmarks/train_throughput.py

clean:
	rm -rf build .pytest_cache

# Regenerate the learners' notebooks in exercises/ from the answer keys in solutions/.
exercises: $(STAMP)
	$(BIN)/python -m icl_course.grading.exercises
