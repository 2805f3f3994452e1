"""Every planted bug of ``tools/planted_bugs.py`` still finds the code it
plants into (exactly once) and names test files that exist: a refactor that
moves the code must move the bug too, or the bug class goes unchecked."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location(
    'planted_bugs', ROOT / 'tools' / 'planted_bugs.py')
PLANTED = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(PLANTED)


@pytest.mark.parametrize('bug', PLANTED.BUGS, ids=lambda bug: bug.key)
def test_planted_bug_finds_its_code_and_tests(bug):
    source = (ROOT / bug.path).read_text()
    assert source.count(bug.old) == 1, (bug.key, bug.path)
    assert bug.old != bug.new
    assert all((ROOT / test.split('::')[0]).exists()
               for test in bug.tests), bug.tests  # a file or a node id
