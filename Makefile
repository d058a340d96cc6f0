# Two entry points for a fresh machine with Python 3.10+ and make:
#   make demo   install, generate the demo profiles, open TensorBoard with the Advisor tab
#               (PORT=6006 by default; profiles made before are kept: RETRAIN=1 trains again)
#   make test   install everything the tests need and run them all (~8 GB, ~13 min on 2 cores)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOGDIR ?= demo_logs
PORT ?= 6006
# Non-empty: train every demo scenario again, even those whose profiles are already in LOGDIR.
RETRAIN ?=
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

# The port is checked first, so a busy one fails at once, not after the training.
# TF_CPP_MIN_LOG_LEVEL=2 keeps TensorFlow's C++ info/warnings (CUDA probing on a CPU-only
# machine) out of the log; errors still show. demo.train and demo.serve drop TensorFlow's
# start-up notices (absl's banner, oneDNN's "custom operations are on": see demo/quiet.py), and
# demo.serve is tensorboard without XProf's harmless missing-cache tracebacks (see demo/serve.py).
demo: $(VENV)/.demo-installed-$(TF)
	@$(PY) -m demo.serve --check-port --host 127.0.0.1 --port $(PORT)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m demo.train --all --logdir $(LOGDIR) $(if $(RETRAIN),--retrain)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m demo.serve --logdir $(LOGDIR) --host 127.0.0.1 --port $(PORT)

test: $(VENV)/.test-installed browser
	$(PY) -m pytest -q

# Also the C extensions a build compiled into the tree (setup.py build_ext --inplace, pip install -e).
clean:
	rm -rf $(VENV) $(LOGDIR) build dist tb_gpuadvisor.egg-info
	find tb_gpuadvisor -name '*.so' -delete
