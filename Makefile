# Two entry points for a fresh machine with Python 3.10+ and make:
#   make demo   install, generate the demo profiles, open TensorBoard with the Advisor tab
#   make test   install everything the tests need and run them all
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOGDIR ?= demo_logs
PORT ?= 6006
# Which TensorFlow the demo installs: cpu (tensorflow-cpu) or gpu (tensorflow[and-cuda]);
# by default gpu when nvidia-smi sees a GPU. Only one of the two is ever installed.
TF ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
DEMO_EXTRA_cpu := demo
DEMO_EXTRA_gpu := demo-gpu
# The other flavour is removed first (both provide the `tensorflow` module). Only x86_64
# has a separate tensorflow-cpu package; elsewhere the CPU choice is plain tensorflow.
OTHER_TF_gpu := tensorflow-cpu
OTHER_TF_cpu := $(if $(filter x86_64,$(shell uname -m)),tensorflow,)

.PHONY: demo test browser clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.demo-installed-$(TF): setup.py | $(VENV)/bin/python
	@test -n "$(DEMO_EXTRA_$(TF))" || { echo "TF must be cpu or gpu (got '$(TF)')"; exit 2; }
	$(if $(OTHER_TF_$(TF)),$(PY) -m pip uninstall -y -q $(OTHER_TF_$(TF)) 2>/dev/null || true)
	$(PY) -m pip install -e ".[$(DEMO_EXTRA_$(TF))]"
	rm -f $(VENV)/.demo-installed-*
	touch $@

$(VENV)/.test-installed: setup.py | $(VENV)/bin/python
	$(PY) -m pip install -e ".[test]"
	touch $@

# The browser tests drive Debian's Chromium; install it when we can (root), never download a browser.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: chromium not installed and not root: browser tests will be skipped"; fi; }

# TF_CPP_MIN_LOG_LEVEL=2 keeps TensorFlow's C++ info/warnings (CUDA probing on a CPU-only
# machine) out of the log; errors still show. demo.serve is tensorboard without XProf's
# harmless missing-cache tracebacks (see demo/serve.py).
demo: $(VENV)/.demo-installed-$(TF)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m demo.train --all --logdir $(LOGDIR)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m demo.serve --logdir $(LOGDIR) --host 127.0.0.1 --port $(PORT)

test: $(VENV)/.test-installed browser
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) $(LOGDIR) build tb_gpuadvisor.egg-info
