"""The layering of docs/architecture.md: the cores (``mmstats/stats``,
``mmstats/precise_bn``) import nothing of mmengine's Runner or of the hooks;
Runner-facing code lives under ``mmstats/hooks``."""
import ast
import pathlib

import pytest

import mmstats

ROOT = pathlib.Path(mmstats.__file__).parent
CORES = sorted(
    p for core in ('stats', 'precise_bn') for p in (ROOT / core).glob('*.py'))
FORBIDDEN = ('mmengine.runner', 'mmstats.hooks', 'mmengine.hooks')


def imported_modules(path: pathlib.Path) -> list:
    """Absolute names of the modules ``path`` imports (relative ones
    resolved against its package)."""
    package = f'mmstats.{path.parent.name}'
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit('.', node.level - 1)[0]
                names.append(f'{base}.{node.module}' if node.module else base)
            else:
                names.append(node.module)
    return names


@pytest.mark.parametrize(
    'path', CORES, ids=lambda p: f'{p.parent.name}/'
    f'{p.name}')
def test_cores_do_not_import_runners_or_hooks(path):
    bad = [
        name for name in imported_modules(path)
        if name.startswith(FORBIDDEN) or name == 'mmstats.hooks'
    ]
    assert not bad, f'{path.name} imports {bad}'


def test_the_check_sees_relative_imports(tmp_path):
    fake = tmp_path / 'stats' / 'x.py'
    fake.parent.mkdir()
    fake.write_text('from ..hooks import StatsCollectorHook\n'
                    'from mmengine.runner import Runner\n')
    assert imported_modules(fake) == ['mmstats.hooks', 'mmengine.runner']
