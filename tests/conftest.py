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
