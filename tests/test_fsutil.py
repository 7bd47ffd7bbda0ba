"""Writes that never leave a half-written file, and never change what they do not own."""

from __future__ import annotations

import os
import stat

import pytest

from llamafactory_rocm.fsutil import atomic_write_text


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "dataset_info.json"
    path.write_text("old")
    path.chmod(0o664)
    atomic_write_text(path, "new")
    assert (path.read_text(), mode(path)) == ("new", 0o664)


def test_a_new_file_gets_the_umasks_permissions_as_open_would_give(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "new.yaml", "x")
    finally:
        os.umask(old)
    assert mode(tmp_path / "new.yaml") == 0o644


def test_through_a_symlink_the_file_it_points_to_gets_the_text(tmp_path):
    real = tmp_path / "shared" / "dataset_info.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "dataset_info.json"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_read_only_file_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "dataset_info.json"
    path.write_text("old")
    path.chmod(0o444)
    with pytest.raises(PermissionError, match="read-only"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["dataset_info.json"]


def test_without_overwrite_even_a_dangling_link_is_left_alone(tmp_path):
    link = tmp_path / "out.yaml"
    link.symlink_to(tmp_path / "nowhere.yaml")
    with pytest.raises(FileExistsError):
        atomic_write_text(link, "x", overwrite=False)
    assert link.is_symlink() and not (tmp_path / "nowhere.yaml").exists()


def test_a_loop_of_links_is_an_os_error_and_nothing_is_written(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "a", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
