# The course's commands.  `make lab` and `make test` are the quick start; both create
# .venv when it is absent and install into it.
PYTHON ?= python3
VENV ?= .venv
# The torch to install when the environment has none.  The default is the CPU build; on a
# machine with a GPU use e.g. TORCH="torch" (or install torch yourself first).
TORCH ?= torch==2.13.0
PORT ?= 8888
BIN := $(VENV)/bin
STAMP := $(VENV)/.icl-course-installed
# no browser where there is no display to show it
NO_BROWSER := $(if $(or $(DISPLAY),$(WAYLAND_DISPLAY),$(filter Darwin,$(shell uname -s))),,--no-browser)
# containers and Colab-like machines run as root, which JupyterLab refuses unless told
ALLOW_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

.PHONY: install lab test course notebooks exercises benchmark clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null && echo "torch is already installed: keeping it" \
		|| $(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install -e ".[lab,dev,grading]"
	@touch $@

lab: $(STAMP)
	$(BIN)/jupyter lab --port=$(PORT) $(NO_BROWSER) $(ALLOW_ROOT) --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/chapters

test: $(STAMP)
	$(BIN)/python -m pytest --nbval-lax --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg \
		--durations=15

# Execute every chapter top to bottom and write HTML pages to build/.
course: $(STAMP)
	@mkdir -p build
	$(BIN)/jupyter nbconvert --to html --execute --output-dir build chapters/*.ipynb

# Re-execute the chapters and solutions in place, so that their stored outputs are current.
notebooks: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace chapters/*.ipynb \
		$(wildcard solutions/*.ipynb)

benchmark: $(STAMP)
	$(BIN)/python benchmarks/train_throughput.py

clean:
	rm -rf build .pytest_cache

# Regenerate the learners' notebooks in exercises/ from the answer keys in solutions/.
exercises: $(STAMP)
	$(BIN)/python -m icl_course.exercises
