import pytest


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@pytest.fixture
def clean_mmengine():
    """Drop mmengine's global singletons (MessageHub, Visualizer, scope,
    loggers) after a test that built a Runner, like RunnerTestCase does."""
    yield
    from mmengine.logging import MMLogger
    from mmengine.utils import ManagerMixin
    for logger in MMLogger._instance_dict.values():
        for handler in list(logger.handlers):
            handler.close()
            logger.removeHandler(handler)
    for cls in _subclasses(ManagerMixin):
        cls._instance_dict.clear()
