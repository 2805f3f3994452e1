"""The launchers' config scopes: ``mmstats::`` and a scope whose module the
maintained fork installs under another distribution (``mmseg`` from
``onedl-mmsegmentation``, which mmengine maps to ``mmsegmentation``)."""
import importlib

import pytest
from mmengine.config import Config
from mmengine.config import utils as config_utils

from mmstats.tools.launcher import enable_config_scope


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(config_utils, 'MODULE2PACKAGE',
                        dict(config_utils.MODULE2PACKAGE))
    return config_utils.MODULE2PACKAGE


def test_a_forks_module_resolves_its_scope(tmp_path, monkeypatch, table):
    """A package ``mmseg`` with no ``mmsegmentation`` distribution (as the
    fork installs it): the scope maps to the module and ``mmseg::`` bases
    load from its ``.mim/configs``; mmengine alone refuses them."""
    configs = tmp_path / 'mmseg' / '.mim' / 'configs' / '_base_'
    configs.mkdir(parents=True)
    (tmp_path / 'mmseg' / '__init__.py').write_text('')
    (tmp_path / 'mmseg' / '.mim' /
     'model-index.yml').write_text('Import: []\n')
    (configs / 'head.py').write_text('head = dict(num_classes=19)\n')
    cfg = tmp_path / 'cfg.py'
    cfg.write_text("_base_ = ['mmseg::_base_/head.py']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert table['mmseg'] == 'mmsegmentation'
    with pytest.raises(ModuleNotFoundError, match='mmsegmentation'):
        Config.fromfile(str(cfg))
    enable_config_scope()
    assert table['mmseg'] == 'mmseg' and table['mmstats'] == 'mmstats'
    assert Config.fromfile(str(cfg)).head.num_classes == 19


def test_installed_distributions_keep_their_names(table):
    enable_config_scope()
    assert table['mmseg'] == 'mmsegmentation'  # no module here: unchanged
    assert table['mmaction'] == 'mmaction2'
