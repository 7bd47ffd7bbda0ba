"""lf/patching.py: the undo stack every patch-and-restore of the package goes through, and the set-up around
a call into LLaMA-Factory (environment restored, logs quiet, Hub offline)."""

from __future__ import annotations

import logging
import os
import types

import pytest

from llamafactory_rocm.lf.patching import Patches, llamafactory_call


class Base:
    name = "base"


class Child(Base):
    pass


def test_every_change_is_undone_last_first_even_when_the_call_raises():
    module = types.SimpleNamespace(step="stock")
    table = {"kept": 1}
    order: list[str] = []
    os.environ.pop("LFR_PATCHING_TEST", None)
    with pytest.raises(RuntimeError), Patches() as patches:
        assert patches.setattr(module, "step", "patched") == "stock"  # what a wrapper calls on
        patches.setattr(module, "step", "patched twice")
        patches.setitem(table, "kept", 2)
        patches.setitem(table, "added", 3)
        patches.delitem(table, "kept")
        patches.setenv("LFR_PATCHING_TEST", "1")
        patches.callback(order.append, "first registered")
        patches.callback(order.append, "last registered")
        assert (module.step, table, os.environ["LFR_PATCHING_TEST"]) == ("patched twice", {"added": 3}, "1")
        raise RuntimeError("the call failed")
    assert module.step == "stock" and table == {"kept": 1}
    assert "LFR_PATCHING_TEST" not in os.environ
    assert order == ["last registered", "first registered"]


def test_an_inherited_class_attribute_is_removed_again_not_copied_onto_the_subclass():
    with Patches() as patches:
        patches.setattr(Child, "name", "child")
        assert Child.name == "child" and Base.name == "base"
    assert "name" not in vars(Child) and Child.name == "base"


def test_a_missing_name_raises_unless_told_and_is_then_removed_again():
    module = types.SimpleNamespace()
    with Patches() as patches:
        with pytest.raises(AttributeError):
            patches.setattr(module, "absent", 1)
        assert patches.setattr(module, "absent", 1, raising=False) is None
        assert module.absent == 1
    assert not hasattr(module, "absent")


def test_the_call_set_up_restores_the_environment_and_the_log_levels_and_keeps_the_hub_offline():
    import huggingface_hub.constants as hub
    import transformers

    logger = logging.getLogger("llamafactory")
    with Patches() as online:
        online.setattr(hub, "HF_HUB_OFFLINE", False)  # the user's setting, whatever CI's is
        before = (dict(os.environ), logger.level, transformers.utils.logging.get_verbosity(), hub.HF_HUB_OFFLINE)
        with llamafactory_call() as patches:
            os.environ["LFR_SET_BY_THE_PARSER"] = "1"  # get_train_args sets variables of its own
            assert os.environ["LLAMAFACTORY_VERBOSITY"] == "ERROR" and logger.level == logging.ERROR
            assert transformers.utils.logging.get_verbosity() == transformers.utils.logging.ERROR
            assert hub.HF_HUB_OFFLINE is True
            assert isinstance(patches, Patches)
        after = (dict(os.environ), logger.level, transformers.utils.logging.get_verbosity(), hub.HF_HUB_OFFLINE)
        assert after == before
