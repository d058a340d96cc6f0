# Two entry points for a fresh machine with Python 3.10+ and make:
#   make demo   install, generate the demo profiles, open TensorBoard with the Advisor tab
#   make test   install everything the tests need and run them all
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOGDIR ?= demo_logs
PORT ?= 6006

.PHONY: demo test browser clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.demo-installed: setup.py | $(VENV)/bin/python
	$(PY) -m pip install -e ".[demo]"
	touch $@

$(VENV)/.test-installed: setup.py | $(VENV)/bin/python
	$(PY) -m pip install -e ".[test]"
	touch $@

# The browser tests drive Debian's Chromium; install it when we can (root), never download a browser.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: chromium not installed and not root: browser tests will be skipped"; fi; }

demo: $(VENV)/.demo-installed
	$(PY) -m demo.train --all --logdir $(LOGDIR)
	$(VENV)/bin/tensorboard --logdir $(LOGDIR) --host 127.0.0.1 --port $(PORT)

test: $(VENV)/.test-installed browser
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) $(LOGDIR)
