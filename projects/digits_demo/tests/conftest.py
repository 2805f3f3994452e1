# The core suite's fixtures (run pytest from the repository root).
from tests.conftest import clean_mmengine  # noqa: F401
