"""LLaMA-Factory's names that the packages outside lf/ use, each behind one function: the one door.

A new LLaMA-Factory line that moves or renames one of them is adapted here, not in the module that
uses it; tests/test_layout.py fails where a module outside lf/ imports ``llamafactory`` itself. Each
import happens on first call (inside ``text_only_llamafactory``, so a missing torchaudio does not stop
it), so importing this module imports nothing of LLaMA-Factory's.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from .text_only import text_only_llamafactory

PROCESSORS = "llamafactory.data.processor"  # the data processors' package (its loggers' names start so)


def _module(name: str) -> ModuleType:
    loaded = sys.modules.get(name)
    if loaded is not None:  # the stand-in matters only while a module first loads (each try costs ~0.25 ms)
        return loaded
    with text_only_llamafactory():
        return importlib.import_module(name)


def _name(module_name: str, name: str) -> Any:
    return getattr(_module(module_name), name)


# -- hparams
def read_args(args: dict[str, Any] | list[str] | None = None) -> Any:
    """``hparams.parser.read_args``: a YAML/JSON path in argv, a flag list or a dict, as the rank reads it."""
    return _name("llamafactory.hparams.parser", "read_args")(args)


def get_train_args(config: dict[str, Any]) -> tuple[Any, ...]:
    """``hparams.get_train_args``: (model, data, training, finetuning, generating) arguments."""
    return _name("llamafactory.hparams", "get_train_args")(config)


def data_arguments(**fields: Any) -> Any:
    """A ``DataArguments`` with ``fields`` (its ``__post_init__`` runs, as in the parser)."""
    return _name("llamafactory.hparams", "DataArguments")(**fields)


def generating_arguments() -> type:
    return _name("llamafactory.hparams", "GeneratingArguments")


# -- data
def dataset_list(names: list[str], entries: dict[str, Any]) -> list[Any]:
    """``data.parser.get_dataset_list`` on ``entries`` (a dataset_info mapping) for ``names``."""
    return _name("llamafactory.data.parser", "get_dataset_list")(names, entries)


def dataset_attr_class() -> type:
    return _name("llamafactory.data.parser", "DatasetAttr")


def dataset_converters() -> dict[str, type]:
    """``data.converter.DATASET_CONVERTERS``: formatting -> converter class."""
    return _name("llamafactory.data.converter", "DATASET_CONVERTERS")


def dataset_converter(formatting: str, dataset_attr: Any, data_args: Any) -> Any:
    return _name("llamafactory.data.converter", "get_dataset_converter")(formatting, dataset_attr, data_args)


def dataset_processor(data_args: Any, stage: str) -> Any:
    """The processor ``data.loader._get_dataset_processor`` picks (built without template or tokenizer)."""
    get = _name("llamafactory.data.loader", "_get_dataset_processor")
    return get(data_args, stage, template=None, tokenizer=None, processor=None)


def file_types() -> dict[str, str]:
    """``extras.constants.FILEEXT2TYPE``: the data file suffixes the loader reads, and their loader."""
    return _name("llamafactory.extras.constants", "FILEEXT2TYPE")


def data_loader() -> ModuleType:
    """``data.loader``, whose functions dataset/prepare.py watches while LLaMA-Factory tokenizes."""
    return _module("llamafactory.data.loader")


def data_processors(name: str = "") -> ModuleType:
    """``data.processor`` (its classes), or its submodule ``name`` (``supervised``, ...), likewise watched."""
    return _module(f"{PROCESSORS}.{name}" if name else PROCESSORS)


def get_dataset(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return _name("llamafactory.data", "get_dataset")(*args, **kwargs)


def template_and_fix_tokenizer(tokenizer: Any, data_args: Any) -> Any:
    return _name("llamafactory.data", "get_template_and_fix_tokenizer")(tokenizer, data_args)


# -- model, logging, environment
def load_tokenizer(model_args: Any) -> dict[str, Any]:
    return _name("llamafactory.model", "load_tokenizer")(model_args)


def get_logger(name: str) -> Any:
    """``extras.logging.get_logger``: its first call gives LLaMA-Factory's root logger its handler."""
    return _name("llamafactory.extras.logging", "get_logger")(name)


def is_env_enabled(name: str, default: str = "0") -> bool:
    """``extras.misc.is_env_enabled``: the words LLaMA-Factory takes for yes."""
    return _name("llamafactory.extras.misc", "is_env_enabled")(name, default)


# -- running
def launch() -> None:
    """``launcher.launch``: ``llamafactory-cli`` with ``sys.argv`` as it is."""
    _module("llamafactory.launcher").launch()


def run_exp(config: dict[str, Any], callbacks: list[Any] | None = None) -> None:
    """``train.tuner.run_exp``: the training run of ``config`` in this process."""
    _name("llamafactory.train.tuner", "run_exp")(args=config, callbacks=callbacks)


# -- LlamaBoard
def webui_save_dir(*parts: str) -> str:
    """``webui.common.get_save_dir``: where LlamaBoard puts a run (saves/<model>/<method>/<output dir>)."""
    return _name("llamafactory.webui.common", "get_save_dir")(*parts)


def webui_trainer_info(lang: str, output_path: str, do_train: bool) -> tuple[Any, ...]:
    """``webui.control.get_trainer_info``: what the page shows of a run's log and progress."""
    return _name("llamafactory.webui.control", "get_trainer_info")(lang, output_path, do_train)
