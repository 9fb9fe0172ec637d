# Set-up and main entry points. Every target creates (or reuses) the virtual environment
# .venv and installs the CPU build of torch before the package.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SWEEP ?= 1,2,5,10,25,50,100

.PHONY: demo test test-torch-range bench gpu-wheels clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The main job: a short real run on the emulated cluster at its balance point (DDP against
# prophet, replay ResNet-50, time-dilated K=3 as the README's headline is, so that the 2-core
# host measures the schedule rather than itself; about three minutes; skipped, and said so,
# without root and iproute2), then every policy on VGG-16 and ResNet-50, 16 workers, over a
# bandwidth sweep in the simulator.
DEMO_DILATION ?= 3
demo: $(STAMP)
	mkdir -p out
	@if $(BIN)/gradsched bench --check; then \
		$(BIN)/gradsched bench --model replay-resnet50 --batch 96 --balance --dilation $(DEMO_DILATION) \
			--iters 8 --warmup 3 --policy ddp,prophet --plot out/bench-resnet50-balance.png \
			--timeline out/bench-resnet50-timeline.png; \
	fi
	$(BIN)/gradsched simulate --model vgg16 --workers 16 --sweep-bandwidth $(SWEEP) --plot out/vgg16-allreduce.png
	$(BIN)/gradsched simulate --model resnet50 --workers 16 --sweep-bandwidth $(SWEEP) --plot out/resnet50-allreduce.png

test: $(STAMP)
	$(BIN)/python -m pytest

# The subset marked torch_range (every architecture and policy against DDP, generated programs,
# the private-API probes, the NCCL emulation's core case, a bench smoke run, the GPU check on
# CPU with only what the lent machine has) on the floor and the newest torch of pyproject's
# range, each in a virtual environment of its own with no extras (CPU runs of the CUDA builds).
TORCH_RANGE ?= 2.11.0 2.14.1
test-torch-range:
	set -e; for v in $(TORCH_RANGE); do \
		env=.venv-torch$$v; \
		test -x $$env/bin/python || $(PYTHON) -m venv $$env; \
		$$env/bin/python -m pip install --quiet torch==$$v; \
		$$env/bin/python -m pip install --quiet -e '.[bench,plot]' 'pytest>=7.4' 'hypothesis>=6.100' 'numpy>=1.24'; \
		$$env/bin/python -c "import torch; v = torch.__version__.split('+')[0]; assert v == '$$v', v"; \
		$$env/bin/python -m pytest -m torch_range -p no:cacheprovider -q \
			$$(grep -rl --include='test_*.py' 'mark.torch_range' tests | sort); \
	done

bench: $(STAMP)
	$(BIN)/python benchmarks/sim_speed.py

# The wheels the GPU check carries to a lent GPU machine, which has its own CUDA build of torch and
# no package index: msgspec, for Python 3.12 on x86-64 (benchmarks/gpu_check.py --help has the command).
gpu-wheels:
	mkdir -p .whl
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl msgspec==0.23.0

clean:
	rm -rf $(VENV) .venv-torch* out
