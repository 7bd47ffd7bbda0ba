"""Which LLaMA-Factory command a config is for, and that command's own parser run on it.

``llamafactory-cli train`` parses a config with ``get_train_args``; ``export``, ``chat``, ``api`` and
``webchat`` all parse it with ``get_infer_args`` (``export_model`` in ``llamafactory/train/tuner.py``
and ``ChatModel.__init__`` in ``llamafactory/chat/chat_model.py``, which ``run_api`` and the web demo
construct); ``eval`` with ``get_eval_args`` (``Evaluator.__init__`` in ``llamafactory/eval/evaluator.py``).
Each parser refuses keys its dataclasses do not define (``_parse_args`` passes ``allow_extra_keys`` only
when ``ALLOW_EXTRA_ARGS`` is set), so a training key left in an export config is refused by
LLaMA-Factory itself: ``command_verdict`` reports exactly that, in LLaMA-Factory's words
(docs/after-training.md#t8). For export, chat, api and webchat it then builds the command dry
(lf/dry_load.py, docs/after-training.md#t10) and reports its first refusal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from collections.abc import Iterator, Mapping
from functools import cache, lru_cache
from typing import Any

from .verdict import DeviceAnswers, Verdict, _quiet, _restored_environ, device_answers_patched, parser_verdict

COMMANDS = ("train", "export", "chat", "api", "webchat", "eval")
INFER_COMMANDS = frozenset({"export", "chat", "api", "webchat"})
# The commands lf/dry_load.py builds dry (eval's Evaluator is not among them).
DRY_LOADED = INFER_COMMANDS
# The serving backends whose packages a planned machine installs itself: while planning, LLaMA-Factory's
# check_version for them is not asked here (docs/after-training.md#t3).
PLANNED_BACKEND_PACKAGES = frozenset({"vllm", "sglang"})


def _parser_module() -> Any:
    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import parser
    return parser


def _dataclasses_of(command: str) -> list[type]:
    parser = _parser_module()
    if command == "train":
        return list(parser._TRAIN_ARGS)
    if command in INFER_COMMANDS:
        return list(parser._INFER_ARGS)
    if command == "eval":
        return list(parser._EVAL_ARGS)
    raise ValueError(f"unknown command {command!r}; one of {', '.join(COMMANDS)}")


@cache
def command_keys(command: str) -> frozenset[str]:
    """The keys LLaMA-Factory's parser for ``command`` accepts.

    The same set ``HfArgumentParser.parse_dict`` checks a dict against (its dataclasses' ``init`` fields),
    over the lists ``get_train_args``/``get_infer_args``/``get_eval_args`` parse.
    """
    return frozenset(f.name for cls in _dataclasses_of(command) for f in dataclasses.fields(cls) if f.init)


def unknown_keys(config: Mapping[str, Any], command: str) -> list[str]:
    """Keys of ``config`` that ``command``'s parser refuses (unless ALLOW_EXTRA_ARGS is set)."""
    return sorted(set(config) - command_keys(command))


@lru_cache(maxsize=1)
def _only_keys() -> tuple[frozenset[str], frozenset[str]]:
    train, infer, evaluate = command_keys("train"), command_keys("chat"), command_keys("eval")
    return frozenset(train - infer - evaluate), frozenset(evaluate - train - infer)


def infer_command(config: Mapping[str, Any]) -> str | None:
    """The command ``config`` is for, from its keys; None when they do not say (``--for`` then decides).

    - a key only training parses (``do_train``, ``output_dir``, ``per_device_train_batch_size``, ...): train
    - a key only evaluation parses (``task``, ``n_shot``, ``save_dir``, ...): eval
    - ``export_dir``: export; ``infer_backend``: chat (``api`` and ``webchat`` parse the same keys)
    - none of them: ``adapter_name_or_path`` without ``stage`` is chat, ``stage`` is train
    Two of train, eval, export and chat at once is ambiguous, except an export config that also names
    ``infer_backend`` (which export ignores).
    """
    keys = set(config)
    train_only, eval_only = _only_keys()
    markers = set()
    if keys & train_only:
        markers.add("train")
    if keys & eval_only:
        markers.add("eval")
    if "export_dir" in keys:
        markers.add("export")
    if "infer_backend" in keys:
        markers.add("chat")
    if markers == {"export", "chat"}:
        return "export"
    if len(markers) == 1:
        return markers.pop()
    if markers:
        return None
    if "adapter_name_or_path" in keys and "stage" not in keys:
        return "chat"
    if "stage" in keys:
        return "train"
    return None


class _ReachedModelLoad(Exception):
    """Raised where ``export_model`` would start loading the tokenizer: every check before it passed."""


@contextlib.contextmanager
def _stop_before_loading() -> Iterator[Any]:
    """LLaMA-Factory's own ``export_model``, stopped at its first load (``load_tokenizer``)."""
    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.train import tuner

    def stop(*_args: Any, **_kwargs: Any) -> None:
        raise _ReachedModelLoad

    original = tuner.load_tokenizer
    tuner.load_tokenizer = stop
    try:
        yield inspect.unwrap(tuner.export_model)  # the stock function, not the hook's wrapper
    finally:
        tuner.load_tokenizer = original


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


@contextlib.contextmanager
def _planned_backends(planned: bool) -> Iterator[None]:
    """When planning, LLaMA-Factory's check_version for vLLM/SGLang is the target's to answer."""
    if not planned:
        yield
        return
    parser = _parser_module()
    original = parser.check_version

    def check_version(requirement: str, mandatory: bool = False) -> None:
        if _requirement_name(requirement) in PLANNED_BACKEND_PACKAGES:
            return
        original(requirement, mandatory)

    parser.check_version = check_version
    try:
        yield
    finally:
        parser.check_version = original


def command_verdict(
    config: Mapping[str, Any], command: str, answers: DeviceAnswers | None = None, *, load: bool = True
) -> Verdict:
    """Run LLaMA-Factory's parser for ``command`` on a copy of ``config``; no weight is read, nothing written.

    ``train``: ``get_train_args`` (``lf.verdict.parser_verdict``). ``export``: LLaMA-Factory's own
    ``export_model`` up to its first load, so its checks before loading run too (``export_dir`` is set,
    no adapter with ``export_quantization_bit``). ``chat``/``api``/``webchat``: ``get_infer_args``, as
    ``ChatModel`` calls it. ``eval``: ``get_eval_args``. ``answers`` stand in for a planned device, and
    then vLLM/SGLang are not required here (the serving rules state them for the target).

    ``load``: for export, chat, api and webchat on this machine (no ``answers``), the command is then built
    dry (``lf.dry_load``: the packages the command imports, tokenizer, template, the model on the meta
    device with its adapters, export_dir, one generation up to the first forward), and its first refusal is
    the verdict, with the fix in its words. ``load=False`` is the parser alone, for a caller that reports
    ``lf.dry_load.dry_load_findings`` itself.
    """
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; one of {', '.join(COMMANDS)}")
    if command == "train":
        return parser_verdict(config, answers)
    parser = _parser_module()
    args = dict(config)
    with _restored_environ(), _quiet(), device_answers_patched(answers), _planned_backends(answers is not None):
        try:
            if command == "export":
                with _stop_before_loading() as export_model, contextlib.suppress(_ReachedModelLoad):
                    export_model(args)
            elif command == "eval":
                parser.get_eval_args(args)
            else:
                parser.get_infer_args(args)
        except SystemExit as exc:
            return Verdict(False, f"the parser exited ({exc.code})", "SystemExit")
        except Exception as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            return Verdict(False, text, type(exc).__name__)
    if load and answers is None and command in DRY_LOADED:
        from .dry_load import dry_load

        refused = [f for f in dry_load(config, command).findings if f.level.value == "error"]
        if refused:
            first = refused[0]
            return Verdict(False, f"{first.message} What to do: {first.fix}", first.code)
    return Verdict(True)


@cache
def backend_requirements(backend: str) -> tuple[tuple[str, bool], ...]:
    """(requirement, mandatory) that LLaMA-Factory checks for ``infer_backend: <backend>``
    (``extra_requirements``), so a release that changes the range (0.9.5: ``vllm>=0.4.3,<=0.11.0``) changes
    the answer."""
    found = extra_requirements({"infer_backend": backend})
    return tuple((requirement, mandatory) for key, requirement, mandatory in found if key == "infer_backend")


@lru_cache(maxsize=1)
def predict_requirements() -> tuple[str, ...]:
    """The packages LLaMA-Factory requires for ``predict_with_generate`` (0.9.5: jieba, nltk, rouge_chinese):
    its mandatory ``check_version`` calls for that key (``extra_requirements``; the metrics that use them are
    in llamafactory/train/sft/metric.py)."""
    found = extra_requirements({"predict_with_generate": True})
    return tuple(requirement for key, requirement, mandatory in found if mandatory and key == "predict_with_generate")


class _ReadRecorder:
    """One of LLaMA-Factory's argument objects as a config dict gives it: each attribute is the config's value
    or the field's default, and the last attribute read with a true value is kept (the key a check is for)."""

    def __init__(self, config: Mapping[str, Any], defaults: Mapping[str, Any], reads: list[str]) -> None:
        self._config, self._defaults, self._reads = config, defaults, reads

    def __getattr__(self, name: str) -> Any:
        value = self._config[name] if name in self._config else self._defaults.get(name)
        if value:
            self._reads.append(name)
        return value


def extra_requirements(config: Mapping[str, Any]) -> tuple[tuple[str, str, bool], ...]:
    """(key, requirement, mandatory) for each ``check_version`` call LLaMA-Factory's own
    ``_check_extra_dependencies`` (hparams/parser.py) makes for this config dict: ``("plot_loss",
    "matplotlib", True)``, ``("use_badam", "badam>=1.2.1", True)``. Its conditions run on the config's values
    as ``parse_dict`` hands them over (unconverted, defaults filled), and the key is the switch it read last."""
    from .schema import field_defaults

    parser = _parser_module()
    reads: list[str] = []
    view = _ReadRecorder(config, field_defaults(), reads)
    seen: list[tuple[str, str, bool]] = []
    original = parser.check_version

    def record(requirement: str, mandatory: bool = False) -> None:
        seen.append((reads[-1] if reads else "", requirement, mandatory))

    parser.check_version = record
    try:
        parser._check_extra_dependencies(view, view, view)
    finally:
        parser.check_version = original
    return tuple(seen)


@cache
def lf_field_default(name: str) -> Any:
    """The default LLaMA-Factory's infer dataclasses give ``name`` (``vllm_max_lora_rank``: 32 in 0.9.5)."""
    for cls in _dataclasses_of("chat"):
        for f in dataclasses.fields(cls):
            if f.name == name and f.default is not dataclasses.MISSING:
                return f.default
    raise KeyError(name)


__all__ = [
    "COMMANDS",
    "INFER_COMMANDS",
    "backend_requirements",
    "command_keys",
    "command_verdict",
    "extra_requirements",
    "infer_command",
    "lf_field_default",
    "predict_requirements",
    "unknown_keys",
]
