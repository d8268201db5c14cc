# Everything installs into .venv; a fresh clone needs only python3 (3.11+), make and, for
# the CDK parts, Node.js 20.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check test scale lint synth policies lock bench clean

$(STAMP): requirements.txt functions/requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sluice run examples/reviews.jsonl --out out

# while you work: lint, then the unit and infra tests that need no local cloud, no moto, no
# subprocess, no network and no seconds of their own; `make test` runs every one of them
check: lint
	$(BIN)/pytest tests/unit tests/infra -n 2 -q -m "not scale and not bundling and not cloud and not subprocess and not moto and not slow and not synth"

# everything, as CI runs it; the bundling and install tests need PyPI; the scale runs go last and alone:
# they measure, and would slow everything beside them
test: $(STAMP)
	$(BIN)/pytest -n 2 --dist loadgroup -q
	$(BIN)/pytest -q -m "bundling or install"
	$(BIN)/pytest -q -s -m scale

scale: $(STAMP)
	$(BIN)/pytest -q -s -m scale

# the core and infra are held to --strict; local, tests and bench to the defaults in pyproject.toml
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy functions sluice_local infra tests bench examples
	$(BIN)/mypy --strict --cache-dir .mypy_cache/strict functions infra

synth: $(STAMP)
	npx --yes aws-cdk@2 synth -c env=dev

# the local cloud's IAM statements, from the synthesized dev stack
policies: $(STAMP)
	$(BIN)/python -m sluice_local.iam

# the Lambda asset's dependencies, every one pinned with its hashes, resolved for the runtime
# (Python 3.12 on x86_64 Linux, wheels only) rather than for this machine
lock: $(STAMP)
	$(BIN)/uv pip compile functions/requirements.txt --output-file functions/requirements.lock \
		--generate-hashes --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
		--only-binary :all: --custom-compile-command "make lock" --quiet

clean:
	rm -rf $(VENV) cdk.out out .pytest_cache
