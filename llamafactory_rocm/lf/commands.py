"""The LLaMA-Factory commands, one entry each (``REGISTRY``), and each command's own parser run on a config.

An entry (``Command``) holds everything this package does with one ``llamafactory-cli`` command; a new
command is one more entry and its builder (docs/architecture.md). Functions are ``Ref`` objects, loaded only
when used: nothing here imports LLaMA-Factory, nor a floor above this one.

``llamafactory-cli train`` parses a config with ``get_train_args``; ``export``, ``chat``, ``api`` and
``webchat`` all parse it with ``get_infer_args`` (``export_model`` in ``llamafactory/train/tuner.py``
and ``ChatModel.__init__`` in ``llamafactory/chat/chat_model.py``, which ``run_api`` and the web demo
construct); ``eval`` with ``get_eval_args`` (``Evaluator.__init__`` in ``llamafactory/eval/evaluator.py``).
Each parser refuses keys its dataclasses do not define (``_parse_args`` passes ``allow_extra_keys`` only
when ``ALLOW_EXTRA_ARGS`` is set), so a training key left in an export config is refused by
LLaMA-Factory itself: ``command_verdict`` reports exactly that, in its words (docs/after-training.md#t8).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from .patching import Patches, llamafactory_call
from .verdict import DeviceAnswers, Verdict, device_answers_patched


@dataclass(frozen=True)
class Ref:
    """A reference to ``module``'s ``name`` (a dotted name for a method), imported where it is used (``load``).

    Not a string to parse: a typed object that tests/test_command_registry.py loads for every entry. It is lazy
    because what it names is either LLaMA-Factory's (seconds to import; a hooked module must not be imported
    before LLaMA-Factory imports it) or this package's on a floor above this one (the hooks' wrappers in
    train/, the dry builders, which import pydantic and torch's helpers): ``_startup`` reads the registry on
    the first ``llamafactory.*`` import of every process and must stay light."""

    module: str
    name: str

    def load(self) -> Any:
        """The object, imported (``llamafactory.*`` as text-only as the check imports it: lf/text_only.py)."""
        if self.module.startswith("llamafactory."):
            from .text_only import text_only_llamafactory

            with text_only_llamafactory():
                found = importlib.import_module(self.module)
        else:
            found = importlib.import_module(self.module)
        for part in self.name.split("."):
            found = getattr(found, part)
        return found

    def __str__(self) -> str:
        return f"{self.module}:{self.name}"


@dataclass(frozen=True, eq=False)
class Chain:
    """One rule chain a command's entry runs. The rules in it say so where they are written
    (``@rule(TRAIN, ...)``, rules/base.py); rules/__init__.py ``chain_rules`` lists them in run order."""

    name: str
    about: str

    def __repr__(self) -> str:
        return f"Chain({self.name!r})"


TRAIN = Chain("train", "a training config, before its launch runs dry")
PLAN = Chain("plan", "a training run's plan (the world, the memory), after its launch ran dry, on what it found")
EXPORT = Chain("export", "llamafactory-cli export")
CHAT = Chain("chat", "llamafactory-cli chat, api and webchat: a model loaded to serve")
EVAL = Chain("eval", "llamafactory-cli eval")


@dataclass(frozen=True)
class Hook:
    """One LLaMA-Factory function that ``_startup`` replaces by ``wrapper(original, command)`` once its module
    has executed (``__llamafactory_rocm__`` marks it wrapped: a function shared by several commands is
    wrapped once, by the first entry that names it)."""

    target: Ref  # llamafactory.train.tuner's run_exp; a method: chat_model's "ChatModel.__init__"
    wrapper: Ref  # train/hook.py's wrap_run_exp
    required: bool = False  # True: a module without it turns the check off in one line (False: left as it is)


@dataclass(frozen=True)
class GuardedImports:
    """The LLaMA-Factory module a command runs whose guarded imports (``if is_fastapi_available(): from
    fastapi import ...``) it then uses unguarded (lf/dry_load.py ``command_packages``): api/app.py's
    create_app calls FastAPI, webui/interface.py's create_web_demo opens gr.Blocks (docs/after-training.md#t10)."""

    module: str  # "llamafactory.api.app"
    first_use: str  # the name it uses first, unguarded: "FastAPI"


@dataclass(frozen=True)
class Exposure:
    """The server a command starts and the variables it listens by (lf/exposure.py)."""

    server: str  # "gradio" (GRADIO_SERVER_NAME, GRADIO_SHARE; no password) or "api" (API_HOST, API_KEY)
    label: str  # how the one line names it: "LlamaBoard"


@dataclass(frozen=True)
class Command:
    """One ``llamafactory-cli`` command: what this package does with it."""

    name: str
    # What ``llamafactory-cli NAME`` calls (``launch()`` in llamafactory/launcher.py); None: it calls nothing
    # that runs the command (``not_run`` says what it does instead).
    cli: Ref | None
    # LLaMA-Factory's parser for the config and the dataclasses it fills (their fields: the keys it accepts);
    # None: the command reads no config, and ``check --for`` does not offer it.
    parser: Ref | None = None
    parser_args: Ref | None = None
    # The rule chain run on the config before it is built dry, and the one run after, on what the dry build
    # found (training's world and memory).
    rules: Chain | None = None
    plan: Chain | None = None
    # How the check builds it dry, after the parser: lf/dry_run.py ``dry_launch`` (the training launch up to
    # step 1, with the data pass, the world and the memory plan), lf/dry_load.py ``dry_load`` (the model on
    # meta with its adapters), None (the parser and the rules only).
    dry: Ref | None = None
    # The LLaMA-Factory function run on the config for the verdict up to its first load (``load_tokenizer``),
    # so its own checks before loading run too; None: the parser alone.
    judged_through: Ref | None = None
    hooks: tuple[Hook, ...] = ()
    # The config key naming the folder its launch record goes in; None: it writes no record.
    record: str | None = None
    # LLaMA-Factory functions up the stack that say a hook shared with other commands runs for this one.
    callers: tuple[str, ...] = ()
    not_run: str = ""  # what the CLI does where ``cli`` is None
    guarded_imports: GuardedImports | None = None  # packages its module imports behind is_*_available()
    exposure: Exposure | None = None  # the server it starts, said in one line where it listens beyond the loopback

    @property
    def trains(self) -> bool:
        """A training run: the data pass, the output folder, the world and the launch run dry apply."""
        return self.dry == DRY_LAUNCH

    @property
    def built_dry(self) -> str:
        """How the check builds it, in words for the report."""
        if self.trains:
            return "LLaMA-Factory's launch run dry up to step 1"
        if self.dry is not None:
            return "built dry, the model on the meta device"
        return "parsed and ruled on, not built dry" + (f" ({self.not_run})" if self.not_run else "")


_PARSER = "llamafactory.hparams.parser"
_TUNER = "llamafactory.train.tuner"
DRY_LAUNCH = Ref("llamafactory_rocm.lf.dry_run", "dry_launch")
DRY_LOAD = Ref("llamafactory_rocm.lf.dry_load", "dry_load")
_CHAT_MODEL_INIT = Hook(
    Ref("llamafactory.chat.chat_model", "ChatModel.__init__"),
    Ref("llamafactory_rocm.train.after", "wrap_chat_model_init"),
)
_EXPOSURE = Ref("llamafactory_rocm.lf.exposure", "wrap_server_entry")  # the one line on a server beyond the loopback
_INFER = {"parser": Ref(_PARSER, "get_infer_args"), "parser_args": Ref(_PARSER, "_INFER_ARGS"), "dry": DRY_LOAD}
_GRADIO_INTERFACE = "llamafactory.webui.interface"


def _serving(name: str, cli: Ref, *callers: str, **parts: Any) -> Command:
    """chat, api and webchat: ``get_infer_args``, the chat chain, built dry, checked where they build a
    ChatModel (``callers`` say which); one with an ``exposure`` says in one line, as its server (``cli``)
    starts, when it listens beyond the loopback."""
    hooks = (_CHAT_MODEL_INIT, Hook(cli, _EXPOSURE)) if parts.get("exposure") else (_CHAT_MODEL_INIT,)
    return Command(name, cli=cli, rules=CHAT, hooks=hooks, callers=callers, **_INFER, **parts)


# The LLaMA-Factory commands: LlamaBoard (the page the others also run from; no config), then those ``check
# --for`` takes, in the order it lists them.
REGISTRY: tuple[Command, ...] = (
    # LlamaBoard reads no config: its runs come back through the hooks below (run_exp, export_model, ChatModel).
    Command(
        "webui",
        cli=Ref(_GRADIO_INTERFACE, "run_web_ui"),
        hooks=(
            Hook(Ref(_GRADIO_INTERFACE, "run_web_ui"), _EXPOSURE),
            # The page's own process (train/board.py): the final train log read after the run; the hook's
            # lines of the export and chat tabs, which run in it, in their boxes.
            Hook(
                Ref("llamafactory.webui.runner", "Runner.monitor"),
                Ref("llamafactory_rocm.train.board", "final_log_reread"),
            ),
            Hook(
                Ref("llamafactory.webui.components.export", "save_model"),
                Ref("llamafactory_rocm.train.board", "page_handler"),
            ),
            Hook(
                Ref("llamafactory.webui.chatter", "WebChatModel.load_model"),
                Ref("llamafactory_rocm.train.board", "page_handler"),
            ),
        ),
        exposure=Exposure("gradio", "LlamaBoard"),
    ),
    Command(
        "train",
        cli=Ref(_TUNER, "run_exp"),
        parser=Ref(_PARSER, "get_train_args"),
        parser_args=Ref(_PARSER, "_TRAIN_ARGS"),
        rules=TRAIN,
        plan=PLAN,
        dry=DRY_LAUNCH,
        hooks=(Hook(Ref(_TUNER, "run_exp"), Ref("llamafactory_rocm.train.hook", "wrap_run_exp"), required=True),),
        record="output_dir",
    ),
    Command(
        "export",
        cli=Ref(_TUNER, "export_model"),
        rules=EXPORT,
        judged_through=Ref(_TUNER, "export_model"),
        hooks=(Hook(Ref(_TUNER, "export_model"), Ref("llamafactory_rocm.train.after", "wrap_export_model")),),
        record="export_dir",
        **_INFER,
    ),
    _serving("chat", Ref("llamafactory.chat.chat_model", "run_chat"), "run_chat"),
    _serving(
        "api",
        Ref("llamafactory.api.app", "run_api"),
        "run_api",
        guarded_imports=GuardedImports("llamafactory.api.app", first_use="FastAPI"),
        exposure=Exposure("api", "the API"),
    ),
    _serving(
        "webchat",
        Ref(_GRADIO_INTERFACE, "run_web_demo"),
        "create_web_demo",
        "run_web_demo",
        guarded_imports=GuardedImports(_GRADIO_INTERFACE, first_use="gr"),
        exposure=Exposure("gradio", "webchat"),
    ),
    Command(
        "eval",
        cli=None,
        parser=Ref(_PARSER, "get_eval_args"),
        parser_args=Ref(_PARSER, "_EVAL_ARGS"),
        rules=EVAL,
        not_run="`llamafactory-cli eval` raises NotImplementedError in LLaMA-Factory 0.9.5 and main",
    ),
)
_BY_NAME = {command.name: command for command in REGISTRY}
# The commands ``check --for`` takes: those that read a config.
COMMANDS = tuple(command.name for command in REGISTRY if command.parser)


def command_entry(command: str) -> Command:
    """The registry's entry for ``command``; ValueError for a command the check does not know."""
    try:
        return _BY_NAME[command]
    except KeyError:
        raise ValueError(f"unknown command {command!r}; one of {', '.join(COMMANDS)}") from None


def checked_entry(command: str) -> Command:
    """The entry of a command the check takes (one of ``COMMANDS``: it reads a config)."""
    entry = _BY_NAME.get(command)
    if entry is None or entry.parser is None:
        raise ValueError(f"unknown command {command!r}; one of {', '.join(COMMANDS)}")
    return entry


def chosen_entry(config: Mapping[str, Any], given: str | None) -> tuple[Command, str]:
    """(the entry a config is checked for, how it was chosen): ``given`` (check --for, or the caller's command),
    else the config's keys (``infer_command``), else train; a UsageError for a command the check does not take."""
    from ..errors import UsageError

    command, how = (given, "--for") if given else (infer_command(config), "from its keys; --for to choose another")
    if command is None:
        command, how = "train", "the keys do not say; --for export|chat|api|webchat|eval for another command"
    try:
        return checked_entry(command), how
    except ValueError:
        raise UsageError(f"unknown command {command!r}: one of {', '.join(COMMANDS)}.") from None


def hooked_modules() -> dict[str, tuple[tuple[str, Ref, str, bool], ...]]:
    """For ``_startup``: each LLaMA-Factory module to patch, with (qualified name, wrapper, command,
    required) for each function in it, in registry order; a function shared by commands once, for the first."""
    found: dict[str, list[tuple[str, Ref, str, bool]]] = {}
    seen: set[str] = set()
    for command in REGISTRY:
        for hook in command.hooks:
            if hook.target in seen:
                continue
            seen.add(hook.target)
            found.setdefault(hook.target.module, []).append(
                (hook.target.name, hook.wrapper, command.name, hook.required)
            )
    return {module: tuple(hooks) for module, hooks in found.items()}


def caller_commands() -> dict[str, str]:
    """LLaMA-Factory function name -> command, for a hook shared by several commands (``ChatModel.__init__``)."""
    return {caller: command.name for command in REGISTRY for caller in command.callers}


def record_folder(config: Mapping[str, Any], command: str) -> str | None:
    """The folder ``command``'s launch record goes in, from its entry's ``record`` key; None: it writes none.
    ``output_dir`` unset is the folder transformers gives it (lf/schema.py ``output_dir_of``)."""
    key = command_entry(command).record
    if key is None:
        return None
    if key == "output_dir":
        from .schema import output_dir_of

        return output_dir_of(config)
    return str(config[key])


# The serving backends whose packages a planned machine installs itself: while planning, LLaMA-Factory's
# check_version for them is not asked here (docs/after-training.md#t3).
PLANNED_BACKEND_PACKAGES = frozenset({"vllm", "sglang"})


def _parser_module() -> Any:
    from .text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.hparams import parser
    return parser


def _dataclasses_of(command: str) -> list[type]:
    parser_args = checked_entry(command).parser_args
    return list(parser_args.load()) if parser_args is not None else []


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
    """Raised where the judged function (``export_model``) would start loading the tokenizer: every check
    before it passed."""


def _stop_before_loading(name: Ref, patches: Patches) -> Any:
    """LLaMA-Factory's own function ``name`` (an entry's ``judged_through``), stopped at its first load
    (its module's ``load_tokenizer``) until ``patches`` are undone."""
    function = inspect.unwrap(name.load())  # the stock function, not the hook's wrapper
    module = importlib.import_module(function.__module__)

    def stop(*_args: Any, **_kwargs: Any) -> None:
        raise _ReachedModelLoad

    patches.setattr(module, "load_tokenizer", stop)
    return function


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _planned_backends(patches: Patches) -> None:
    """When planning, LLaMA-Factory's check_version for vLLM/SGLang is the target's to answer."""
    parser = _parser_module()
    original = parser.check_version

    def check_version(requirement: str, mandatory: bool = False) -> None:
        if _requirement_name(requirement) in PLANNED_BACKEND_PACKAGES:
            return
        original(requirement, mandatory)

    patches.setattr(parser, "check_version", check_version)


def command_verdict(
    config: Mapping[str, Any], command: str | Command, answers: DeviceAnswers | None = None, *, load: bool = True
) -> Verdict:
    """Run LLaMA-Factory's parser for ``command`` on a copy of ``config``; no weight is read, nothing written.

    The entry's ``parser`` (``get_train_args``, ``get_infer_args`` as ``ChatModel`` calls it,
    ``get_eval_args``), or its ``judged_through`` function up to its first load (export: ``export_model``,
    so its checks before loading run too: ``export_dir`` is set, no adapter with
    ``export_quantization_bit``). ``answers`` stand in for a planned device, and then vLLM/SGLang are not
    required here (the serving rules state them for the target), nor is a ``deepspeed:`` JSON read (it needs
    DeepSpeed and torchrun on the target).

    ``load``: for a command built dry by loading (entry ``dry=DRY_LOAD``: export, chat, api and webchat) on
    this machine (no ``answers``), the command is then built dry (``lf.dry_load``: the packages the command
    imports, tokenizer, template, the model on the meta device with its adapters, export_dir, one generation
    up to the first forward), and its first refusal is the verdict, with the fix in its words.
    ``load=False`` is the parser alone, for a caller that reports the dry build's findings itself (check/rank.py).
    """
    entry = command if isinstance(command, Command) else checked_entry(command)
    args = dict(config)
    if answers is not None and "deepspeed" in command_keys(entry.name):
        args.pop("deepspeed", None)  # its JSON is read on the target (lf/verdict.py)
    parse = None if entry.judged_through or entry.parser is None else entry.parser.load()
    parsed = None
    # the planned backends wrap the device answers' check_version, so they go on a stack undone before those
    with llamafactory_call(offline=False), device_answers_patched(answers), Patches() as patches:
        if answers is not None:
            _planned_backends(patches)
        try:
            if entry.judged_through:
                judged = _stop_before_loading(entry.judged_through, patches)
                with contextlib.suppress(_ReachedModelLoad):
                    judged(args)
            else:
                parsed = parse(args)
        except SystemExit as exc:
            return Verdict(False, f"the parser exited ({exc.code})", "SystemExit")
        except Exception as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            return Verdict(False, text, type(exc).__name__)
    if load and answers is None and entry.dry == DRY_LOAD:
        refused = [f for f in DRY_LOAD.load()(config, entry.name).findings if f.level.value == "error"]
        if refused:
            first = refused[0]
            return Verdict(False, f"{first.message} What to do: {first.fix}", first.code)
    return Verdict(True, parsed=parsed)


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

    def record(requirement: str, mandatory: bool = False) -> None:
        seen.append((reads[-1] if reads else "", requirement, mandatory))

    with Patches() as patches:
        patches.setattr(parser, "check_version", record)
        parser._check_extra_dependencies(view, view, view)
    return tuple(seen)


@cache
def lf_field_default(name: str) -> Any:
    """The default LLaMA-Factory's infer dataclasses give ``name`` (``vllm_max_lora_rank``: 32 in 0.9.5)."""
    for cls in _dataclasses_of("chat"):
        for f in dataclasses.fields(cls):
            if f.name == name and f.default is not dataclasses.MISSING:
                return f.default
    raise KeyError(name)
