"""atomic_path: a file is replaced whole or not at all."""

import pytest

from pretextual.core.files import atomic_path


def test_a_finished_write_replaces_the_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_text("new")
        assert target.read_text() == "old"  # untouched until the block ends
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(OSError, match="disk full"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise OSError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
