"""Every patch-and-restore of the package in one undo stack, and the set-up every LLaMA-Factory call here runs in.

The dry runs swap a name in LLaMA-Factory's or transformers' modules for the length of one call (a step
recorded, a load stopped, a device answer given) and must put everything back, last change first, whatever
the call raised. ``Patches`` is that undo stack, modelled on pytest's ``MonkeyPatch`` (``setattr``,
``setitem``, ``setenv``, undone in reverse order): a ``contextlib.ExitStack``, so a context a
step enters (``warnings.catch_warnings``, ``redirect_stdout``) and a patch it makes unwind in one order.

``llamafactory_call`` is the set-up the parser and the dry runs share: the environment restored after
(``get_train_args`` sets variables), LLaMA-Factory's and transformers' logs quiet, and the Hub offline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, MutableMapping
from typing import Any

_NOTSET = object()


class Patches(contextlib.ExitStack):
    """An undo stack: each change records how to undo it; leaving the ``with`` (or ``undo()``) undoes them all,
    the last first. A name an owner did not hold itself (a class attribute inherited, a key not in a mapping)
    is removed again rather than set."""

    def setattr(self, owner: Any, name: str, value: Any, *, raising: bool = True) -> Any:
        """``owner.name = value`` until undone; returns the value it replaced (what a wrapper calls on).
        ``raising=False``: an owner without the name gets it, and loses it again when undone."""
        current = getattr(owner, name, _NOTSET)
        if current is _NOTSET and raising:
            raise AttributeError(f"{owner!r} has no attribute {name!r}")
        # a class's own attribute is put back; one it inherits is deleted again (pytest's MonkeyPatch does so)
        own = vars(owner).get(name, _NOTSET) if isinstance(owner, type) else current
        setattr(owner, name, value)
        self.callback(_put_back, owner, name, own)
        return None if current is _NOTSET else current

    def setitem(self, mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
        """``mapping[key] = value`` until undone."""
        old = mapping.get(key, _NOTSET)
        mapping[key] = value
        self.callback(_put_item_back, mapping, key, old)

    def delitem(self, mapping: MutableMapping[Any, Any], key: Any) -> None:
        """``mapping[key]`` removed until undone (nothing to do where it is not there)."""
        old = mapping.pop(key, _NOTSET)
        self.callback(_put_item_back, mapping, key, old)

    def setenv(self, name: str, value: str) -> None:
        self.setitem(os.environ, name, value)

    def delenv(self, name: str) -> None:
        self.delitem(os.environ, name)

    def environ(self) -> None:
        """The whole environment as it is now, put back when undone: for a call that sets variables of its own."""
        saved = dict(os.environ)
        self.callback(_put_environ_back, saved)

    def undo(self) -> None:
        self.close()


def _put_back(owner: Any, name: str, value: Any) -> None:
    if value is _NOTSET:
        delattr(owner, name)
    else:
        setattr(owner, name, value)


def _put_item_back(mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
    if value is _NOTSET:
        mapping.pop(key, None)
    else:
        mapping[key] = value


def _put_environ_back(saved: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(saved)


def quiet_logs(patches: Patches) -> None:
    """LLaMA-Factory and transformers log at info while parsing and loading; the check prints its own report."""
    import transformers

    patches.setenv("LLAMAFACTORY_VERBOSITY", "ERROR")  # read by get_train_args to set transformers' level
    patches.callback(transformers.utils.logging.set_verbosity, transformers.utils.logging.get_verbosity())
    transformers.utils.logging.set_verbosity_error()
    lf_logger = logging.getLogger("llamafactory")
    patches.callback(lf_logger.setLevel, lf_logger.level)
    lf_logger.setLevel(logging.ERROR)
    # datasets' own logger ("num_proc must be <= 1 ..." on a small split), and the warnings libraries raise
    # about this machine while the launch runs dry here (torch's DataLoader: "will create 4 worker processes
    # ... suggested max ... 2"): the run's machine is another; the report says what matters for it
    datasets_logger = logging.getLogger("datasets")
    patches.callback(datasets_logger.setLevel, datasets_logger.level)
    datasets_logger.setLevel(logging.ERROR)
    patches.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore", UserWarning)


def hub_offline(patches: Patches) -> None:
    """Nothing is downloaded: huggingface_hub answers from the cache only (its HF_HUB_OFFLINE switch)."""
    import huggingface_hub.constants as hub

    patches.setattr(hub, "HF_HUB_OFFLINE", True)


def progress_bars_off(patches: Patches) -> None:
    """datasets' progress bars off, on again after where they were on."""
    import datasets

    if datasets.utils.logging.is_progress_bar_enabled():
        datasets.disable_progress_bars()
        patches.callback(datasets.enable_progress_bars)


@contextlib.contextmanager
def llamafactory_call(*, offline: bool = True) -> Iterator[Patches]:
    """The set-up around a call into LLaMA-Factory's parser or launch: the environment put back after, the
    logs quiet and (``offline``) the Hub offline. Yields the undo stack, for the call's own patches."""
    with Patches() as patches:
        patches.environ()  # get_train_args sets environment variables
        quiet_logs(patches)
        if offline:
            hub_offline(patches)
        yield patches


__all__ = ["Patches", "hub_offline", "llamafactory_call", "progress_bars_off", "quiet_logs"]
