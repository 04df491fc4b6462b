import os

import pytest

os.environ.setdefault("NDCOST_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "ndcost"))


@pytest.fixture(scope="session")
def registry():
    from ndcost import manager
    return manager.registry()
