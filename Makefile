# Two commands for a newcomer: `make run` (set up, run the default comparison job) and
# `make test` (set up, run the test suite). Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Paddle's parameter-server engine left its wheels after 3.0.0 (3.1.x keeps only the server side):
# parameter-server jobs on Paddle run from a second environment with paddlepaddle 3.0.0
# (`.venv-ps/bin/python -m unitrain ...`; docs/parameter-servers.md, "Which Paddle").
PS_VENV := .venv-ps
PS_STAMP := $(PS_VENV)/.installed

FASHION_MNIST := /usr/share/datasets/fashion-mnist

.PHONY: run test test-slow test-all lint format bench recipe setup ps-env clean fashion-mnist netns slurm etcd chromium corpus bytecode

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in the extra; a looser pin would pull several GB of CUDA packages.
	$(PY) -m pip install --quiet -e '.[paddle,torch,dev,export,quantize,convert,tracking,sweeps,cluster,elastic,hf]'
	# An environment made before unitrain had its own Optuna sweeper keeps hydra-optuna-sweeper
	# 1.3.0, which needs optuna<3 (pip check fails) and registers hydra/sweeper=optuna too.
	if $(PY) -m pip show --quiet hydra-optuna-sweeper 2>/dev/null; then $(PY) -m pip uninstall --quiet --yes hydra-optuna-sweeper; fi
	touch $(STAMP)

setup: $(STAMP)

$(PS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PS_VENV)
	$(PS_VENV)/bin/python -m pip install --quiet --upgrade pip
	# torch too: one sweep (-m backend=paddle,torch) then compares both frameworks' parameter servers.
	$(PS_VENV)/bin/python -m pip install --quiet -e '.[paddle-ps,torch]'
	touch $(PS_STAMP)

ps-env: $(PS_STAMP)

# Debian's dataset-fashion-mnist package (offline, ~30 MB) for data=fashion_mnist and its tests.
# Installed when this runs as root with apt-get; otherwise those tests skip and say why.
fashion-mnist:
	@if [ -f $(FASHION_MNIST)/t10k-labels-idx1-ubyte.gz ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } || \
	  echo "could not install dataset-fashion-mnist: the Fashion-MNIST tests will skip"; \
	else echo "Fashion-MNIST is not installed and this is not root with apt-get: the Fashion-MNIST tests will skip"; fi

# Debian's chromium, headless, for the screenshots of report.html (scripts/render_report.sh), and
# its chromium-driver, through which Selenium draws MLflow's run view (tests/test_tracking.py), as
# root with apt-get; otherwise that test skips.
chromium:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1; } || \
	  echo "could not install chromium and chromium-driver: the MLflow screenshot test will skip"; \
	else echo "chromium or chromium-driver is not installed and this is not root with apt-get: the MLflow screenshot test will skip"; fi

# iproute2 (`ip netns`) for the multi-node tests' separate hosts (scripts/netns_hosts.py), as
# root with apt-get; otherwise those tests skip and say why.
netns:
	@if command -v ip >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 >/dev/null 2>&1; } || \
	  echo "could not install iproute2: the multi-node tests will skip"; \
	else echo "iproute2 is not installed and this is not root with apt-get: the multi-node tests will skip"; fi

# Debian's slurm-wlm and munge for the SLURM sweep tests (scripts/slurm_cluster.py starts a
# one-node cluster from them), as root with apt-get; otherwise those tests skip and say why.
slurm:
	@if command -v slurmctld >/dev/null && command -v munged >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1; } || \
	  echo "could not install slurm-wlm: the SLURM tests will skip"; \
	else echo "slurm-wlm is not installed and this is not root with apt-get: the SLURM tests will skip"; fi

# Debian's etcd-server for Paddle's restarts (dist.max_restarts: paddle.distributed.launch
# restarts only with an etcd master), as root with apt-get; otherwise those tests skip.
etcd:
	@if command -v etcd >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1; } || \
	  echo "could not install etcd-server: Paddle's restart test will skip"; \
	else echo "etcd-server is not installed and this is not root with apt-get: Paddle's restart test will skip"; fi

# data=text's default corpus (conf/data/text.yaml): Jane Austen's six novels, 4.0 MB of text files
# in data/corpus/austen (git ignores them), unpacked by scripts/austen_corpus.py from Debian's
# r-cran-janeaustenr, which `apt-get download` fetches without installing R (as root it runs
# apt-get update first when the package lists lack it); otherwise the default-corpus test skips.
CORPUS := data/corpus/austen
corpus:
	@if [ -d $(CORPUS) ]; then :; \
	elif command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then \
	  $(PYTHON) scripts/austen_corpus.py $(CORPUS) || \
	  echo "could not make the default corpus $(CORPUS): its test will skip, and data=text needs data.path"; \
	else echo "no apt-get to fetch r-cran-janeaustenr: the default-corpus test will skip, and data=text needs data.path"; fi

run: $(STAMP) corpus
	$(PY) -m unitrain -m backend=paddle,torch

# JUNIT_DIR: where each pytest run writes a JUnit report (CI: for its list of the slowest tests).
junit = $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/$(1).xml)

# README's test command: every test not marked slow, under 12 minutes on 2 cores. The slow ones
# (wheel install, multi-process jobs, multi-node hosts, quantization, parameter servers, the benchmark harness) run
# with `make test-slow`; CI (.ci/run) runs both. Two at a time, a test file to a worker: one at a
# time kept a 2-core machine less than half busy (process start-ups, imports, Hydra).
test: $(STAMP) $(PS_STAMP) fashion-mnist corpus bytecode
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadfile --durations=10 $(call junit,fast)

# Four at a time on 2 cores (pytest-xdist, a test file to a worker): most of their time is
# processes starting, waiting for each other and ending. With two workers the cores were idle a
# quarter of the time; with three, a sixth (the quantize, ViT, text-export and gallery tests: 1.68
# cores busy, 1.97 with four; the fast tests, shorter, are quickest two at a time). Those that time
# how soon something ends (marked serial) run after them, two at a time: one at a time kept the
# second core mostly idle while they waited for kills and timeouts. One that a neighbour can fail
# (marked alone: it measures how loader processes share the cores) runs by itself, last.
test-slow: $(STAMP) $(PS_STAMP) fashion-mnist netns slurm etcd chromium corpus bytecode
	$(PY) -m pytest -q -m "slow and not serial" -n 4 --dist loadfile --durations=20 $(call junit,slow)
	$(PY) -m pytest -q -m "slow and serial and not alone" -n 2 --dist loadfile --durations=10 $(call junit,serial)
	$(PY) -m pytest -q -m "slow and alone" --durations=5 $(call junit,alone)

test-all: test test-slow

# The project's own modules compiled once: where PYTHONDONTWRITEBYTECODE is set (as in the shells
# of the machines this was measured on) Python writes no bytecode, and every process the tests
# start compiled unitrain's modules again (about 2.5% of a tiny torch job's 5 CPU seconds). Only
# changed files are compiled again; a stale file is still compiled on import, as without this.
bytecode: $(STAMP)
	$(PY) -m compileall -q unitrain backends hydra_plugins tests scripts benchmarks

# ruff's formatter and linter (settings in pyproject.toml); CI runs this before the tests.
lint: $(STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: $(STAMP)
	$(PY) benchmarks/run.py

# README's Fashion-MNIST accuracy: the recipe on both frameworks from the same initial weights,
# then held-out accuracy and the time to 0.90 per framework, each framework at its best
# (backend.tuned: on an AMD CPU, Paddle's MKL AVX2 kernels; torch applies nothing on a CPU).
# Long on a CPU (2-core AVX2 EPYC, measured: torch 1.7 hours for this recipe, Paddle with MKL's
# AVX2 kernels 3.1 hours); a GPU takes minutes. Each run gets its own folder.
recipe: $(STAMP) fashion-mnist
	dir=multirun/recipe-$$(date +%Y%m%d-%H%M%S) && \
	$(PY) -m unitrain -m experiment=fashion_mnist_resnet18 backend=torch,paddle backend.tuned=true hydra.sweep.dir=$$dir && \
	$(PY) -m unitrain.compare $$dir --target-accuracy 0.90

clean:
	rm -rf $(VENV) $(PS_VENV) build dist *.egg-info runs multirun outputs
