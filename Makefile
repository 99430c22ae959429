# make run: set up, then run a local 3-node cluster in the foreground.
# make test: set up, then run the whole test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run run5 test test-slow lint proto setup front clean-data faults faults-consistency faults-workers faults-consistency-workers soak demo bench bench-quick security simulate costs

# The Go gRPC front end ([node] grpc_front = "go": front/) is built here, into a cache keyed by its sources
# (nameserver/ops/gobuild.py): a clean clone has it before a node or a test needs it. The default
# grpc_front = "auto" uses it when it is built and grpcio when not (saying so in the node's log), so a failed
# Go build warns rather than failing setup; a node set to "go", and the Go front end's tests, then fail
# naming the build's error.
setup: $(STAMP)
	@$(MAKE) --no-print-directory front || echo 'make setup: WARNING: the Go gRPC front end was not built (the error is above). Nodes with the default [node] grpc_front = "auto" serve with grpcio instead (their log says so); one with "go", and the tests of the Go front end, fail until `make front` succeeds.' >&2

front: $(STAMP)
	scripts/ensure-debian-package.sh golang-go go
	$(PY) -m nameserver.ops.gobuild

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

run: setup
	$(PY) -m nameserver.cli.local --nodes 3

run5: setup
	$(PY) -m nameserver.cli.local --nodes 5

demo: setup
	$(PY) -m nameserver.cli.demo

# The short interop version runs too: Apache RocketMQ 5.5.0's brokers and Java clients against a 3-node
# cluster, and the differential's raw probes against the stock 5.5.0 NameServer and ours
# (tests/interop, its tests not marked `interop`; the jars come from Maven Central on first use).
test: setup
	scripts/ensure-debian-package.sh default-jre-headless java   # PySpark (pipeline/) runs on a JVM
	scripts/ensure-debian-package.sh openjdk-17-jdk-headless java javac   # RocketMQ; javac for its test client
	scripts/ensure-debian-package.sh maven mvn
	scripts/ensure-debian-package.sh golang-go go   # porcupine, the linearizability cross-check (tests/linearizability)
	scripts/ensure-debian-package.sh chromium chromium   # the pipeline's HTML report in a real browser
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	RMQ_INTEROP=1 RMQ_LINES=5.x $(PY) -m pytest -q --durations=60 -m 'not slow and not interop'

test-slow: setup
	$(PY) -m pytest -q -m slow

# The long fault suite (docs/faults.md; about 45 minutes, needs root: network namespaces, tmpfs):
# kills, pauses, partitions, delay, full disk, corruption, each for minutes instead of seconds.
# --tb=native: pytest's own traceback rendering crashed (INTERNALERROR, tb_lineno None) on one failure
# of a 300 s scenario and lost its report and the rest of the run.
faults: setup
	FAULTS_LONG=1 LIN_RUN_SECONDS=60 $(PY) -m pytest -q -s --tb=native -rfE tests/faults

# The long consistency run: 20 x 60 s of kills and pauses with recorded histories (docs/consistency.md).
faults-consistency: setup
	LIN_RUNS=20 LIN_RUN_SECONDS=60 $(PY) -m pytest -q -s --tb=native -rfE tests/faults/test_bindings_linearizable.py

# Both again with 2 worker processes a node (docs/faults.md, "With worker processes"): the nemesis also
# SIGKILLs one worker of another node during each fault, and every check waits for the workers back.
faults-workers: setup
	FAULTS_WORKERS=2 FAULTS_LONG=1 LIN_RUN_SECONDS=60 $(PY) -m pytest -q -s --tb=native -rfE tests/faults

faults-consistency-workers: setup
	FAULTS_WORKERS=2 LIN_RUNS=20 LIN_RUN_SECONDS=60 $(PY) -m pytest -q -s --tb=native -rfE \
		tests/faults/test_bindings_linearizable.py

# The soak (tests/soak/soak.py; 60 minutes): mixed load at 70 % of the measured maximum, a fault every 2 minutes,
# memory and descriptors per node every minute; writes data/soak/soak.json and data/soak/soak.png.
soak: setup
	$(PY) -m tests.soak --minutes 60 --out data/soak

# The attack suite at full size (docs/operations.md, "The attack suite"): tens of thousands of
# connections, 5-million-topic bodies, default limits; make test runs its short version.
security: setup
	SECURITY_LONG=1 $(PY) -m pytest -q tests/security

# The benchmark suite beside etcd and a gRPC echo ceiling, ours with one worker process per core and without;
# issue 27's remoting yardsticks (the stock RocketMQ NameServer, worker_processes 1 vs 2 and a projection
# to 16 cores, read replicas); then the remoting port's every load beside the stock NameServer
# (docs/benchmarks.md; about 50 minutes).
bench: interop-setup
	scripts/ensure-debian-package.sh golang-go go   # the remoting benchmark's load generator
	mkdir -p data && $(PY) -m bench --worker-processes $$(nproc) --recovery-workers 0,$$(nproc) --json data/bench.json --report data/bench.md
	$(PY) -m tests.interop.bench_remoting --json data/bench-remoting.json --report data/bench-remoting.md

# The fleet simulator's two long runs (docs/scaling.md, "Simulator runs"; about 12 minutes): 1,000 brokers
# with 50,000 topics at time x2, then 3,000 with 150,000 at the real periods, each against a fresh 3-node
# cluster; the load from bench/loadgen's fleet mode (Go, built on first use into ~/.cache). Writes
# data/fleet-s1000.json and data/fleet-s3000.json, each with its chart beside it (.html).
simulate: setup
	scripts/ensure-debian-package.sh golang-go go
	mkdir -p data
	$(PY) -m bench.fleet --preset s1000 --json data/fleet-s1000.json --html data/fleet-s1000.html
	$(PY) -m bench.fleet --preset s3000 --json data/fleet-s3000.json --html data/fleet-s3000.html

# Every part of the suite with short loads (a smoke run; the cores part needs the stock jars and Go).
bench-quick: interop-setup
	scripts/ensure-debian-package.sh golang-go go
	$(PY) -m bench --quick

# The per-operation costs the capacity model (nsctl plan) reads: CPU, bytes and memory per operation on a
# real 3-node cluster (bench/costs.py, docs/scaling.md; 15-25 minutes). make bench runs it too.
costs: setup
	scripts/ensure-debian-package.sh golang-go go   # bench/loadgen, the remoting load
	mkdir -p data && $(PY) -m bench --only costs --costs-file data/costs.json --report data/costs.md

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

proto: setup
	PYTHON=$(PY) scripts/gen_proto.sh

clean-data:
	rm -rf data/local-3 data/local-5

# Apache RocketMQ's own brokers, clients and mqadmin (4.9.x and 5.x, jars from Maven Central cached in
# tests/interop/.jars) against a real 3-node cluster: tests/interop. interop-setup only fetches the jars.
.PHONY: interop interop-setup rocketmq-tour bench-remoting
interop-setup: setup
	scripts/ensure-debian-package.sh openjdk-17-jdk-headless java javac   # brokers; javac for the test client
	scripts/ensure-debian-package.sh maven mvn
	$(PY) -m tests.interop.jars

# With `make run` going in another terminal: a real broker, producer, consumer and mqadmin against it
# (README, "With real RocketMQ"). `.venv/bin/python -m tests.interop.tour mqadmin CMD ...` runs any mqadmin.
rocketmq-tour: interop-setup
	$(PY) -m tests.interop.tour

# The remoting port beside Apache RocketMQ's stock NameServer per core, per node and per machine, driven by
# the compiled load generator (bench/loadgen/, Go; built on first use into ~/.cache), with each server's CPU
# per operation (docs/benchmarks.md, "Remoting with a compiled load generator"; about 8 minutes).
bench-remoting: interop-setup
	scripts/ensure-debian-package.sh golang-go go
	mkdir -p data && $(PY) -m tests.interop.bench_remoting --json data/bench-remoting.json --report data/bench-remoting.md

interop: interop-setup
	RMQ_INTEROP=1 $(PY) -m pytest -q --timeout 900 tests/interop -m 'interop or not interop'
