# GPU Systems Lab. `make lab` to learn, `make test` to check everything.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
PORT   ?= 8888
STAMP  := $(VENV)/.gpulab-installed

# setuptools explains editable installs in a banner on every setup; the install is standard, so hush it.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: lab test test-notebooks test-gpu gpu-check test-triton36 test-torch211 setup release bench clean

# Containers often run as root, which Jupyter refuses without --allow-root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

# Your work lives in $(WORKSPACE)/ (git-ignored): copies of the lessons, labs and drills, made on first use and
# never overwritten, so the tracked notebooks stay as shipped and `git pull` updates the course. With
# gpulab/jupyter/lab/overrides.json JupyterLab saves widget state (the drills' boxes show after a restart).
WORKSPACE ?= workspace
KERNEL_CONFIG := $(VENV)/etc/ipython/ipython_kernel_config.py
lab: $(STAMP) $(KERNEL_CONFIG)
	GPULAB_WORKSPACE="$(WORKSPACE)" $(PY) -m gpulab.workspace
	GPULAB_WORKSPACE="$(WORKSPACE)" $(VENV)/bin/jupyter lab --ServerApp.port=$(PORT) --ServerApp.root_dir="$(CURDIR)" \
		--LabApp.default_url=/lab/tree/$(WORKSPACE)/notebooks/00_start_here.ipynb \
		--LabApp.app_settings_dir="$(CURDIR)/gpulab/jupyter/lab" $(LAB_ARGS)

# The kernels' settings (gpulab/jupyter/ipython_kernel_config.py: no warning about local TCP on every start).
$(KERNEL_CONFIG): gpulab/jupyter/ipython_kernel_config.py | $(STAMP)
	mkdir -p "$(@D)"
	cp $< $@

# The notebook lane runs beside the unit tests, on one worker: most of the unit tests' time is spent waiting
# (sandboxes starting, ranks meeting, deadlines expiring), and the notebooks fill it. Its report follows theirs.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m grader release --check
	mkdir -p .gpulab
	$(MAKE) --no-print-directory test-notebooks NOTEBOOK_WORKERS=1 > .gpulab/test-notebooks.log 2>&1 & lane=$$!; \
	$(PY) -m pytest -n 2 --dist worksteal; units=$$?; \
	wait $$lane; notebooks=$$?; \
	echo "--- the notebook lane (make test-notebooks):"; cat .gpulab/test-notebooks.log; \
	test $$units -eq 0 -a $$notebooks -eq 0

# Every lesson and solution re-executed top to bottom under nbval, each notebook in one kernel (--dist
# loadfile keeps a notebook's cells on one worker, in order). --nbval-lax: a cell fails on an error, and
# outputs are compared only where a cell says `# NBVAL_CHECK_OUTPUT`; tests/nbval_sanitize.cfg masks what
# varies (times, rates, addresses, device names). GPULAB_STRICT=1 makes a failed inline check raise. The
# notebooks' DEVICE = "auto" picks the GPU where there is one: the GPU lane runs the same command.
NOTEBOOKS ?= notebooks solutions
NOTEBOOK_WORKERS ?= 2
NBVAL := --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600
test-notebooks: $(STAMP)
	GPULAB_STRICT=1 MPLBACKEND=Agg $(PY) -m pytest $(NBVAL) -n $(NOTEBOOK_WORKERS) --dist loadfile -p no:cacheprovider \
		$(NOTEBOOKS)

# The GPU check: one command for an offline GPU machine with nothing but python3 + torch/Triton/NumPy (no
# venv, no pip, no Jupyter, no install of this project). Options go in ARGS, e.g.
# `make gpu-check ARGS="--budget 1200 --out /tmp/gpu"`; the CPU smoke run: `make gpu-check ARGS="--device cpu --tiny"`.
ARGS ?=
gpu-check:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) benchmarks/gpu_check.py $(ARGS)

# Everything the GPU check can do, with no time limit: every lesson and solution re-executed on the GPU too
# (papermill when it is importable, else each notebook's code cells in order). No venv needed.
test-gpu:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) benchmarks/gpu_check.py --budget 0 $(ARGS)

# The kernel tests (CPU interpreter and the compile check for every target GPU) against Triton 3.6, the GPU machines'
# version, in a side venv: not part of `make test`. numpy < 2.4: Triton 3.6's interpreter needs it.
VENV36        ?= .venv-triton36
TRITON36_PIN  ?= triton==3.6.0
KERNEL_TESTS  ?= tests/test_checks_02.py tests/test_checks_03.py tests/test_checks_04.py \
                 tests/test_checks_05.py tests/test_checks_08.py tests/test_checks_15.py tests/test_compile_targets.py \
                 tests/test_int8_decode.py
test-triton36: $(VENV36)/.gpulab-installed
	$(VENV36)/bin/python -c "import triton; print('Triton', triton.__version__)"
	$(VENV36)/bin/python -m pytest $(KERNEL_TESTS) -n 2 --dist worksteal

$(VENV36)/.gpulab-installed: pyproject.toml
	test -x $(VENV36)/bin/python || $(PYTHON) -m venv $(VENV36)
	$(VENV36)/bin/python -m pip install --quiet --upgrade pip
	$(VENV36)/bin/python -c "import torch" 2>/dev/null || $(VENV36)/bin/python -m pip install --quiet $(TORCH_PIN)
	$(QUIET_EDITABLE) $(VENV36)/bin/python -m pip install --quiet -e ".[test]" "$(TRITON36_PIN)" "numpy<2.4"
	touch $@

# The whole suite with the GPU machines' versions, torch 2.11 + Triton 3.6, in a side venv: not part of
# `make test` (torch 2.11 comes as a CUDA build, about 5 GB; it runs on the CPU here like any other).
VENV211       ?= .venv-torch211
TORCH211_PIN  ?= torch==2.11.0
test-torch211: $(VENV211)/.gpulab-installed
	$(VENV211)/bin/python -c "import torch, triton; print('torch', torch.__version__, 'Triton', triton.__version__)"
	$(VENV211)/bin/python -m ruff check .
	$(VENV211)/bin/python -m grader release --check
	$(VENV211)/bin/python -m pytest -n 2 --dist worksteal

$(VENV211)/.gpulab-installed: pyproject.toml
	test -x $(VENV211)/bin/python || $(PYTHON) -m venv $(VENV211)
	$(VENV211)/bin/python -m pip install --quiet --upgrade pip
	$(VENV211)/bin/python -m pip install --quiet "$(TORCH211_PIN)" "$(TRITON36_PIN)" "numpy<2.4"
	$(QUIET_EDITABLE) $(VENV211)/bin/python -m pip install --quiet -e ".[test]" "$(TORCH211_PIN)" "$(TRITON36_PIN)" "numpy<2.4"
	touch $@

release: $(STAMP)
	$(PY) -m grader release

setup: $(STAMP)

# Setup: a venv from the standard library; torch only if missing (a user's own build is kept).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_PIN)
	$(QUIET_EDITABLE) $(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) $(VENV36) $(VENV211) .pytest_cache .gpulab build *.egg-info
