"""The pretextual command itself: its version."""

import importlib.metadata

import pytest

from pretextual.cli import main


def test_version_names_the_installed_package(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"pretextual {importlib.metadata.version('pretextual')}\n"
