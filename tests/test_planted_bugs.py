"""Every planted bug of ``tools/planted_bugs.py`` still finds the code it
plants into (exactly once) and names test files that exist: a refactor that
moves the code must move the bug too, or the bug class goes unchecked."""
import importlib.util
import pathlib
import subprocess
import sys

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


def _pytest(tmp_path, name, source):
    """Runs pytest as ``plant`` does on one throw-away test file."""
    (tmp_path / name).write_text(source)
    proc = subprocess.run([
        sys.executable, '-m', 'pytest', '-x', '-q', '-rfE', '-p',
        'no:cacheprovider', name
    ],
                          cwd=tmp_path,
                          capture_output=True,
                          text=True)
    return proc.returncode, proc.stdout


def test_only_a_failing_assertion_counts_as_caught(tmp_path):
    assert PLANTED.verdict(
        *_pytest(tmp_path, 'test_a.py', 'def test_a():\n    assert 1 == 2\n'))
    # a plant that breaks the import: pytest exits with 2, nothing failed
    code, out = _pytest(tmp_path, 'test_b.py', 'import no_such_module_x\n')
    assert code == 2 and not PLANTED.verdict(code, out)
    # an import error inside a test is a failure, but proves nothing
    code, out = _pytest(tmp_path, 'test_c.py',
                        'def test_c():\n    import no_such_module_x\n')
    assert code == 1 and not PLANTED.verdict(code, out)
    # an error in a fixture's set-up is no failing assertion
    assert not PLANTED.verdict(1, 'ERROR t.py::a - ValueError\n1 error in 1s')
    assert not PLANTED.verdict(0, '1 passed in 1s')
