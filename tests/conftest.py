import os
import sys

# Before anything imports grpc: this process forks only to exec (node processes, Spark's JVM, tools), so
# gRPC's fork handlers are not needed, and in grpcio >= 1.80 they can kill a child forked while a
# channel is active before it execs (grpc/grpc#43055: "epoll_wait error: Bad file descriptor"). PySpark
# forks with preexec_fn to start its JVM, which then exited "before sending its port number".
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster import Cluster  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _stopped_nodes_reaped():
    """Teardowns stop clusters without waiting for them (Cluster.stop): the session waits at its end.
    tests/cluster.py is imported as `cluster` and as `tests.cluster`: two lists of stopped nodes."""
    yield
    for name in ("cluster", "tests.cluster"):
        if name in sys.modules:
            sys.modules[name].reap_stopped()


@pytest.fixture
def make_cluster(tmp_path):
    """Factory for real multi-process clusters; every one started is stopped at the end."""
    made: list[Cluster] = []

    def make(size: int = 3, start: bool = True, **settings) -> Cluster:
        root = tmp_path / f"cluster{len(made)}"
        root.mkdir()
        c = Cluster(str(root), size, **settings)
        made.append(c)
        if start:
            c.start()
        return c

    yield make
    for c in made:
        c.stop(wait=False)


@pytest.fixture(scope="session")
def spark():
    """One local[2] Spark session for every Spark test of the run (tests/unit/test_pipeline_spark.py,
    tests/integration/test_pipeline.py): starting one costs seconds, and its JVM's first jobs are slow.
    The JVM compiles with C1 only: the tests' short jobs finish ~20% sooner than with C2 warming up."""
    from pipeline.session import spark_session

    session = spark_session("local[2]", "test-pipeline", {"spark.sql.shuffle.partitions": "4",
                                                          "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"})
    yield session
    session.stop()
