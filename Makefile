# Two entry points for a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := demo

.PHONY: demo test test-fast lint venv clean i18n

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first, pinned, so that no dependency pulls a multi-GB CUDA build; everything else from the lock file.
$(VENV)/.installed: $(BIN)/python pyproject.toml requirements.lock
	$(BIN)/pip install --quiet -c requirements.lock torch==2.13.0
	$(BIN)/pip install --quiet -c requirements.lock -e '.[test,autoround,lerobot,served,cluster]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	rm -rf $(DEMO)
	$(BIN)/release fixture tiny --out $(DEMO)/fixture
	$(BIN)/release campaign --source $(DEMO)/fixture/source --observations $(DEMO)/fixture/observations --dist $(DEMO)/dist
	$(BIN)/release push --dist $(DEMO)/dist --target $(DEMO)/hub --dry-run
	$(BIN)/release push --dist $(DEMO)/dist --target $(DEMO)/hub
	@echo
	@echo "Results: $(DEMO)/dist/<repo>/ (provenance.json, verification/, results/; the delivered builds' checkpoint"
	@echo "         and README.md), $(DEMO)/dist/campaign.json (the campaign's finished steps),"
	@echo "         $(DEMO)/dist/tables/ (fidelity, ranking, attribution: CSV + tables.json),"
	@echo "         $(DEMO)/dist/selection.json (the selection rule of builds/release.yaml applied),"
	@echo "         $(DEMO)/hub/np-cr/<repo>/ (the local push target); tiny source, observations and ModelOpt's"
	@echo "         reference export (what the builds were verified against) in $(DEMO)/fixture/"

# Extract translatable strings from templates/ and release/publish/card/, merge them into the Korean catalog, compile.
i18n: venv
	$(BIN)/pybabel extract -F babel.cfg -k _ --no-location --omit-header -o locales/messages.pot .
	$(BIN)/pybabel update -i locales/messages.pot -d locales -l ko --ignore-obsolete --no-fuzzy-matching
	$(BIN)/pybabel compile -d locales -l ko --statistics

lint: venv
	$(BIN)/ruff check release tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

# The edit loop: the same checks without the end-to-end items (marked slow in tests/conftest.py). Not a substitute
# for `make test`, which CI runs.
test-fast: lint
	$(BIN)/pytest -m "not slow"

clean:
	rm -rf $(VENV) $(DEMO) dist .cache
