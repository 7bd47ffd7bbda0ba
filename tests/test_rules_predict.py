"""rules.predict: predict_with_generate needs the packages LLaMA-Factory asks for (read from it)."""

from __future__ import annotations

from llamafactory_rocm.lf.commands import predict_requirements
from llamafactory_rocm.rules.predict import predict_packages
from tests.after_training_helpers import here_ctx, planned_ctx

CONFIG = {"model_name_or_path": "m", "do_predict": True, "predict_with_generate": True}
ALL = frozenset(name.lower().replace("_", "-") for name in predict_requirements())


def test_missing_here_is_an_error_naming_the_extra():
    (finding,) = predict_packages(CONFIG, {}, here_ctx("mi300x", installed=frozenset({"torch"}))).findings
    assert finding.code == "EVAL_PACKAGES_MISSING" and finding.level.value == "error"
    assert '".[eval]"' in finding.fix and all(name in finding.message for name in ALL)


def test_planned_is_a_requirement():
    (finding,) = predict_packages(CONFIG, {}, planned_ctx("mi300x", installed=frozenset())).findings
    assert finding.level.value == "info"


def test_installed_or_not_asked():
    assert not predict_packages(CONFIG, {}, here_ctx("mi300x", installed=ALL)).findings
    assert not predict_packages(
        {**CONFIG, "predict_with_generate": False}, {}, here_ctx("mi300x", installed=frozenset())
    ).findings
    assert not predict_packages(CONFIG, {}, here_ctx("mi300x", installed=None)).findings
