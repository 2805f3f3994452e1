import pytest

from mmstats.stats import reporting
from tests.helpers.runner import clear_mmengine_singletons


@pytest.fixture(autouse=True)
def _fresh_reporting():
    """No pending value, phase or suspension leaks between tests (live
    collectors stay: module-level ones such as training_stats' own)."""
    reporting.reset()
    yield
    reporting.reset()


@pytest.fixture
def clean_mmengine():
    """Drop mmengine's global singletons (MessageHub, Visualizer, scope,
    loggers) after a test that built a Runner, like RunnerTestCase does."""
    yield
    clear_mmengine_singletons()
