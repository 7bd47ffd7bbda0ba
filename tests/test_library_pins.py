"""Constants the package restates instead of importing (importing the library there would cost start-up
time or pull in a trainer), each pinned to the library's own value or line: a release that changes one
fails here."""

from __future__ import annotations

import inspect
import logging

from llamafactory_rocm.lf.text_only import text_only_llamafactory


def test_file_names_are_peft_and_llamafactorys_own():
    from peft.utils.constants import CONFIG_NAME

    from llamafactory_rocm.dataset.info import INFO_FILE
    from llamafactory_rocm.lf.adapters import ADAPTER_CONFIG

    with text_only_llamafactory():
        from llamafactory.extras.constants import DATA_CONFIG
    assert ADAPTER_CONFIG == CONFIG_NAME and INFO_FILE == DATA_CONFIG


def test_the_label_not_trained_on_and_the_default_verbosity_are_llamafactorys():
    """train/verbosity.py is imported by the start-up hook, so it cannot import LLaMA-Factory."""
    from llamafactory_rocm.train import verbosity

    with text_only_llamafactory():
        from llamafactory.extras import constants
        from llamafactory.extras import logging as lf_logging
    assert verbosity.IGNORE_INDEX == constants.IGNORE_INDEX
    assert verbosity._level({}) == lf_logging._default_log_level == logging.INFO
    assert verbosity._level({verbosity.LF_ENV: "warning"}) == logging.WARNING


def test_the_ray_worker_reads_only_the_cuda_and_ascend_noset_variables():
    """rules/world.py ray_visible_devices: LLaMA-Factory's Ray worker (train/tuner.py
    _setup_env_visible_devices) looks at these two and no AMD one."""
    with text_only_llamafactory():
        from llamafactory.train import tuner
    source = inspect.getsource(tuner)
    start = source.index("RAY_NOSET_VISIBLE_DEVICES_LIST = [")
    listed = source[start : source.index("]", start)]
    assert "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES" in listed
    assert "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES" in listed
    assert "HIP" not in listed and "ROCR" not in listed
