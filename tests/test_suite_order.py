"""The files tests/conftest.py starts first exist: a renamed file would drop out of the order unnoticed."""

from pathlib import Path

from tests.conftest import STARTED_FIRST


def test_every_file_started_first_is_a_test_file_here() -> None:
    missing = [name for name in STARTED_FIRST if not (Path(__file__).parent / name).is_file()]
    assert not missing, missing
