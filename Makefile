# Every target sets up .venv on first use, so a fresh clone needs only `make quick` or `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch 2.13.0 CPU is the build the loopback machines carry; override for a CUDA build.
TORCH_SPEC ?= torch==2.13.0
# jax: the jax backend (~620 MB of jaxlib), so `make test` covers it on a fresh clone.
EXTRAS ?= mpi,mpi-wheel,plot,test,jax
# One rank per core (at least 2): more ranks than cores measures the scheduler; NP=4 asks for it.
NP ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2); [ $$n -ge 2 ] && echo $$n || echo 2)
BACKEND ?=
ARGS ?=
# STYLE=nccl-tests or STYLE=osu: the tables in that tool's layout (run --style; nccl-tests
# measures both placements).
STYLE ?=
# Open MPI refuses root and more ranks than cores unless told.
MPIRUN_FLAGS ?= $(shell [ "$$(id -u)" = 0 ] && $(VENV)/bin/mpirun --version 2>/dev/null | grep -q "Open MPI" && echo --allow-run-as-root)

.PHONY: install quick collectives moe moe-decode moe-skew pairs moe-shootout overlap scaling inswitch ceilings model model-check gpu-check test list bench-overhead c-loop bench-fidelity two-hosts clean
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@# Bytecode once, here: where PYTHONDONTWRITEBYTECODE is set, every rank of every launch
	@# would compile the package again (about 0.5 s of CPU a launch on 2 cores).
	$(PY) -m compileall -q commbench >/dev/null
	touch $@

# Standard suites: on the loopback they start $(NP) local ranks; under mpirun/srun/torchrun
# (e.g. `srun make collectives NP=`) they join the launch instead.
quick: install
	$(PY) -m commbench run quick $(if $(NP),--np $(NP)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS)

collectives: install
	$(PY) -m commbench run collectives $(if $(NP),--np $(NP)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS)

# MoE suites, full DeepSeek-V3 shape (`make moe`: about 14 s on a quiet 2-core loopback, 2 ranks,
# December 2026; about 1.5 minutes at load average 7).
# MOE_TOKENS scales the tokens per rank down for a slower host.
MOE_TOKENS ?=
moe: install
	$(PY) -m commbench run moe $(if $(NP),--np $(NP)) $(if $(MOE_TOKENS),--param moe.tokens=$(MOE_TOKENS)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS)

moe-skew: install
	$(PY) -m commbench run $@ $(if $(NP),--np $(NP)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS)

# Every pair of ranks on this host (rank mode: one host has one node); on a cluster run
# `commbench run pairs` under mpirun/srun, one rank per node (docs/health.md).
pairs: install
	$(PY) -m commbench run $@ $(if $(NP),--np $(NP)) --pairs-mode $(or $(PAIRS_MODE),rank) $(if $(BACKEND),--backend $(BACKEND)) $(ARGS)

# Decode runs DeepEP's low-latency mode, which is the device path's (gloo on CPU tensors,
# nccl on GPUs); mpi's host path has the normal mode only.
DECODE_BACKEND ?= $(shell test -n "$$(ls /proc/driver/nvidia/gpus 2>/dev/null)" && echo nccl || echo gloo)
moe-decode: install
	$(PY) -m commbench run $@ $(if $(NP),--np $(NP)) --backend $(or $(BACKEND),$(DECODE_BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS)

# The dispatcher shoot-out (commbench/suites/moe-shootout.toml, docs/moe.md "The shoot-out"):
# every dispatcher over the named workloads, 3 repeats each in a fresh launch. The dispatchers
# split over backends, so it is one run per backend: mpi (the host paths: deepep-normal, alltoall,
# allgather, mpi-alltoallw, mpi-alltoallv), then the torch engines on $(DECODE_BACKEND) (gloo on CPU:
# deepep-normal, alltoall, allgather, low-latency; nccl with a GPU adds deepep, deepep-ll, pplx);
# what a backend cannot run is skipped with why. One report over both runs:
# $(SHOOTOUT_DIR)/report/report.md, written from the runs that left rows even when one failed
# (its exit status is make's). SHOOTOUT_BACKENDS="gloo" runs one. At world 2 on a 2-core host
# about 2 minutes at load average 3, 4 minutes at 7.5 (December 2026).
SHOOTOUT_STAMP := $(shell date +%Y%m%d-%H%M%S)
SHOOTOUT_DIR ?= results/moe-shootout-$(SHOOTOUT_STAMP)
SHOOTOUT_BACKENDS ?= mpi $(DECODE_BACKEND)
moe-shootout: install
	status=0; runs=; for b in $(SHOOTOUT_BACKENDS); do \
	  $(PY) -m commbench run $@ $(if $(NP),--np $(NP)) --backend $$b --repeat 3 --out $(SHOOTOUT_DIR)/$$b $(ARGS) || status=$$?; \
	  test -f $(SHOOTOUT_DIR)/$$b/rows.jsonl && runs="$$runs $(SHOOTOUT_DIR)/$$b"; \
	done; \
	if [ -n "$$runs" ]; then $(PY) -m commbench report $$runs --out $(SHOOTOUT_DIR)/report || status=$$?; fi; \
	exit $$status

# All-reduce overlapped with a matmul (commbench/suites/overlap.toml: about 1 minute on a quiet 2-core
# loopback, 3-4 minutes while other jobs share its cores, and then read the rows' warnings).
# 2 ranks unless NP is given: each rank's compute needs a core of its own, and more ranks
# than cores measures the scheduler, not the overlap. `make overlap BACKEND=gloo` for gloo.
overlap: NP = 2
overlap: install
	$(PY) -m commbench run $@ $(if $(NP),--np $(NP)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS)

# Weak scaling over every rank count the launch allows, with the efficiency table. It needs two
# rank counts at least: NP=2 (a 2-core host) gives one, and the run says so (NP=4 or a cluster).
scaling: install
	$(PY) -m commbench run scaling $(if $(NP),--np $(NP)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS)

# In-switch reductions and algorithm variants against ring. On the loopback, `run --np`
# launches each variant itself; under a cluster launcher (`srun make inswitch NP=`) each rank
# loops over the variants, one launch each, all joining one result directory.
INSWITCH_OUT ?= results/inswitch-$(or $(SLURM_JOB_ID),$(shell date +%Y%m%d-%H%M))
inswitch: install
ifeq ($(NP),)
	for v in $$($(PY) -m commbench run inswitch --list-variants); do \
	  $(PY) -m commbench run inswitch --variant $$v --out $(INSWITCH_OUT) $(if $(BACKEND),--backend $(BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS) || exit $$?; done
	$(PY) -m commbench report $(INSWITCH_OUT) $(if $(STYLE),--style $(STYLE))
else
	$(PY) -m commbench run inswitch --np $(NP) $(if $(BACKEND),--backend $(BACKEND)) $(if $(STYLE),--style $(STYLE)) $(ARGS)
endif

ceilings: install
	$(PY) -m commbench ceilings $(ARGS)

# What-if: DeepSeek-V3 dispatch/combine at EP 8..256 (512 and 1024 are listed as left out: 256 experts),
# then all_reduce algorithms at 8..1024 GPUs, on GB300 NVL72 vs HGX H100. Worlds above one rack run
# in equal parts per rack (128 = 2 x 64 of 72 GPUs; docs/model.md).
model: install
	$(PY) -m commbench model --kind moe --profile gb300-nvl72,h100-hgx $(ARGS)
	$(PY) -m commbench model --kind all_reduce --profile gb300-nvl72,h100-hgx --sizes 1G --algos ring,tree,inswitch,hierarchical $(ARGS)

# The what-if model against the published figures it ships with (commbench/data/published.toml;
# docs/model.md): published, projected and their ratio per row, a line per class (collective x
# tier x fabric, each MoE stack); exits 1 where the verdict fails: under 90 % of the held-out
# rows within 1.5x, or a class with no held-out row or its median outside 0.8-1.25 (the shipped
# table fails the 90 % and three classes, each named in docs/model.md "What the table says").
model-check: install
	$(PY) -m commbench model --against $(ARGS)

# Every GPU path one GPU allows (a probe of what blocks the host behind a hold, nccl with and
# without CUDA graphs, a barrier, cupy buffers, moe, the HBM probe, two ranks sharing the GPU),
# one table, within 6 minutes of its start (docs/gpu.md). It runs on the GPU machine as it is:
# no venv, no pip, no network; GPU_PY, an interpreter that has a CUDA torch, runs this
# checkout in place. Without a CUDA device it prints one line saying so and exits 0 here
# (tools/gpu_check.py itself exits 3). `make gpu-check ARGS="--only moe,hbm"` reruns steps.
GPU_PY ?= python3
gpu-check:
	@PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PY) tools/gpu_check.py $(ARGS); rc=$$?; \
	if [ $$rc -eq 3 ]; then exit 0; fi; exit $$rc

list: install
	$(PY) -m commbench list

# Harness overhead: commbench's 8 B all_reduce p50 next to a bare mpi4py loop, 2 ranks.
bench-overhead: install
	$(VENV)/bin/mpirun $(MPIRUN_FLAGS) -np 2 $(PY) tools/bench_overhead.py

# C reference loop (tools/c_loop.c): plain blocking MPI_Allreduce/MPI_Alltoall, page-aligned
# buffers, mean time per op; `mpirun -np 2 build/c_loop -m back_to_back|barrier`. The shared
# library is the same loop for tools/bench_fidelity.py to call in-process.
MPICC ?= $(VENV)/bin/mpicc
c-loop: install build/c_loop build/libc_loop.so

build/c_loop: tools/c_loop.c $(VENV)/.installed
	mkdir -p build
	$(MPICC) -O2 -o $@ tools/c_loop.c

build/libc_loop.so: tools/c_loop.c $(VENV)/.installed
	mkdir -p build
	$(MPICC) -O2 -shared -fPIC -DCB_NO_MAIN -o $@ tools/c_loop.c

# Measurement fidelity: the C loop, a bare mpi4py loop and commbench's harness, paired per
# size in one 2-rank launch, both timing methods, all_reduce and all_to_all, 8 B..16 MiB.
FIDELITY_ARGS ?=
bench-fidelity: install c-loop
	$(VENV)/bin/mpirun $(MPIRUN_FLAGS) -np 2 $(PY) tools/bench_fidelity.py --lib build/libc_loop.so $(FIDELITY_ARGS)

# The regression gate, checked (docs/verdicts.md): ROUNDS rounds of A B P runs, 3 a side, each
# judged by compare --fail-on-regression; prints how often it was right. ~2 minutes a round.
ROUNDS ?= 20
.PHONY: ab-gate
ab-gate: install
	$(PY) tools/ab_gate.py --rounds $(ROUNDS) --out results/ab-gate $(ARGS)

# The tests in TEST_JOBS processes (pytest-xdist; TEST_JOBS=0: in this one), then the few that
# measure time alone (`serial`), the long forms of cases aside: under 12 minutes on 2 cores.
# 3 on 2 cores: most tests wait on the ranks they start (start-up, bounds, signals), so a third
# process fills the cores those waits leave idle.
# (pytest exits 5 where ARGS selects none of a part.)
TEST_JOBS ?= 3
test: install
	$(PY) -m pytest -q -n $(TEST_JOBS) -m "not slow and not serial" $(ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -q -m "serial and not slow" $(ARGS) || [ $$? -eq 5 ]

# The unit tests alone (no test that starts processes, none that needs the cores to itself):
# under 1 minute on 2 cores. `make test` runs these and the rest.
.PHONY: test-fast test-slow
# 2 processes: these tests compute and never wait, so a third only adds its own collection
# (about 6 s of CPU).
FAST_JOBS ?= 2
test-fast: install
	$(PY) -m pytest -q -n $(FAST_JOBS) -m "not multirank and not slow and not serial" $(ARGS) || [ $$? -eq 5 ]

# What `make test` leaves out (the `slow` marker): the long forms of cases it runs in a short
# form, and the long end-to-end cases tests/slow_cases.py lists, each with why. About 8
# minutes on 2 cores (74 tests, December 2026).
test-slow: install
	$(PY) -m pytest -q -n $(TEST_JOBS) -m slow $(ARGS) || [ $$? -eq 5 ]

# Two hosts on this machine (network namespaces, root only; tools/twohosts.py): 2 and 4 ranks
# across them on mpi and gloo, checks on, each run's hosts and nodes; then the alpha-beta fit
# over a link limited to 20 Mbit/s with 10 ms each way, next to what that link implies.
# Exits 3, saying why, where namespaces cannot be made. About 2 minutes on 2 cores.
two-hosts: install
	$(PY) tools/twohosts.py demo $(ARGS)
	$(PY) tools/twohosts.py link

# The pairs verdict against known truth (tools/pairs_trials.py, docs/two-hosts.md): five
# namespace hosts, every link at 200 Mbit/s; one link at a third, one host's every link at a
# third, nothing slowed; how many runs the verdict got right, against 9 of 10, 9 of 10 and
# 19 of 20. About 12 minutes on 2 cores; exits 1 when a target is missed, 3 where namespaces
# cannot be made. PAIRS_TRIALS=a=1,b=1,c=1 for one run of each.
PAIRS_TRIALS ?= a=10,b=10,c=20
.PHONY: pairs-trials
pairs-trials: install
	$(PY) tools/pairs_trials.py --trials $(PAIRS_TRIALS) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
