# botgw: the two set-up commands are `make run` and `make test`.
.PHONY: install run stop test lint bench clean

install:
	bash scripts/install.sh

run: install
	bash scripts/run_local.sh start

stop:
	bash scripts/run_local.sh stop

test:
	BOTGW_INSTALL_BROWSER=1 bash scripts/install.sh
	bash scripts/install_ops_tools.sh
	.venv/bin/ruff check .
	bash scripts/pip_audit.sh
	# two processes, a test file at a time; then the checks of the whole run, which run even when a test failed
	status=0; \
	.venv/bin/python -m pytest -v -p no:cacheprovider --durations=15 -n 2 --dist loadfile -m "not after_everything" \
		|| status=$$?; \
	.venv/bin/python -m pytest -v -p no:cacheprovider -m after_everything || status=$$?; \
	exit $$status

lint: install
	.venv/bin/ruff check .

bench: install
	.venv/bin/python bench/ingest.py

# What `make run` made: the run folder, .run or PLAYGROUND_RUN_DIR as scripts/run_local.sh reads it (Redis's data,
# the simulator's state, the knowledge store, the page's files, the logs). Not .venv, the engine's venv or the tiny
# model in ~/.cache/botgw (installed, shared with `make test`), nor test-artifacts (made by `make test`).
clean: stop
	rm -rf -- "$${PLAYGROUND_RUN_DIR:-.run}"
