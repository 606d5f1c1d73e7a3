# GPU Systems Lab. `make lab` to learn, `make test` to check everything.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
PORT   ?= 8888
STAMP  := $(VENV)/.gpulab-installed

.PHONY: lab test test-gpu setup release bench clean

# Containers often run as root, which Jupyter refuses without --allow-root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.port=$(PORT) --ServerApp.root_dir="$(CURDIR)" \
		--LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb $(LAB_ARGS)

test: $(STAMP)
	$(PY) -m grader release --check
	$(PY) -m pytest -n 2 --dist worksteal

# Re-execute every lesson and solution on the GPU (needs a CUDA machine).
test-gpu: $(STAMP)
	GPULAB_DEVICE=cuda $(PY) -m pytest tests/test_notebooks_execute.py -m "slow or gpu" -p no:xdist

release: $(STAMP)
	$(PY) -m grader release

setup: $(STAMP)

# Setup: a venv from the standard library; torch only if missing (a user's own build is kept).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_PIN)
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .gpulab build *.egg-info
