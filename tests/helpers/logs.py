"""Read what mmengine logs in a test."""
import contextlib
import logging
from typing import Iterator, List


@contextlib.contextmanager
def mmengine_logs(caplog, level: int = logging.WARNING) -> Iterator[None]:
    """Let ``caplog`` see the records of mmengine's current logger.

    ``print_log(msg, 'current')`` writes to ``MMLogger``'s current
    instance, which does not propagate to the root logger ``caplog``
    listens on; this attaches ``caplog``'s handler to it meanwhile.

    Args:
        caplog: pytest's ``caplog`` fixture.
        level (int): Lowest level recorded. Defaults to WARNING.
    """
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    old_level = caplog.handler.level
    caplog.handler.setLevel(level)
    logger.addHandler(caplog.handler)
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)
        caplog.handler.setLevel(old_level)


def warnings_logged(caplog) -> List[str]:
    """Messages of the WARNING (or worse) records ``caplog`` holds."""
    return [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
    ]
