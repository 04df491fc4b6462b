import os

import pytest

os.environ.setdefault("NDCOST_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "ndcost"))


@pytest.fixture(scope="session")
def registry():
    from ndcost import manager
    return manager.registry()


@pytest.fixture
def fresh(monkeypatch):
    """The process-wide plugin set reloaded for this test and forgotten after it."""
    from ndcost import manager
    monkeypatch.delenv("NDCOST_STRICT_PLUGINS", raising=False)
    manager.reset()
    yield
    manager.reset()
