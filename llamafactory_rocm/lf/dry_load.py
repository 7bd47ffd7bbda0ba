"""LLaMA-Factory's after-training commands built dry: export, chat, api and webchat, with the model on meta.

``llamafactory-cli export`` runs ``export_model`` (llamafactory/train/tuner.py); ``chat``, ``api`` and
``webchat`` build a ``ChatModel`` (llamafactory/chat/chat_model.py), whose Hugging Face engine
(chat/hf_engine.py) loads the tokenizer, the template and the model with its adapters. Here those run as
LLaMA-Factory runs them, with these differences, each chosen so that no weight is read and nothing written
(docs/after-training.md#t10):

- The model is LLaMA-Factory's own ``load_model`` with its weight-loading call swapped for ``from_config``
  under accelerate's ``init_empty_weights`` (``meta_load_model``, the one the training dry run uses):
  the config is patched (``infer_dtype``, quantization and the packages it imports), and ``init_adapter``
  loads each adapter with peft onto the meta model, so a missing adapter folder and an adapter of other
  shapes fail in peft's own words ("Can't find 'adapter_config.json'", "size mismatch").
- export: the stock ``export_model`` runs to its ``save_pretrained`` (its checks after loading: quantized
  merge, the dtype conversion); ``export_dir`` is checked as transformers' ``save_pretrained`` treats it.
- chat: the stock ``ChatModel.__init__`` builds the engine; then one generation is prepared with the
  engine's own ``_process_args`` on a one-word message (the shortest prompt the template makes) and run
  through transformers' ``generate`` up to the model's first forward, so the generating arguments meet
  transformers' own checks (logits processors, ``max_length`` against the prompt).
- The packages ``api`` and ``webchat`` import are asked of the availability functions their
  LLaMA-Factory module imports (``llamafactory/api/app.py``, ``llamafactory/webui/interface.py``).
- vLLM and SGLang engines are not built (they need the GPU and the weights): said as "not checked".
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import one_line
from ..findings import Finding, Level
from .commands import command_entry
from .dry_parts import DryRun, _meta_limitation, reachable
from .patching import Patches, llamafactory_call
from .text_only import text_only_llamafactory

# pyproject.toml's optional dependency group that installs a command's guarded imports (``guarded_imports``).
EXTRA = "webui"
# The message the dry chat prepares a generation for: the shortest prompt the template makes.
PROBE_MESSAGE = "Hi"


@dataclass(frozen=True)
class CommandPackage:
    function: str  # LLaMA-Factory's availability function: "is_fastapi_available"
    module: str  # the import name it looks for: "sse_starlette"
    available: bool

    @property
    def distribution(self) -> str:
        return self.module.replace("_", "-")


def command_packages(command: str) -> tuple[CommandPackage, ...]:
    """The packages ``command``'s LLaMA-Factory module imports behind ``is_*_available()``, each as that
    function answers here. The import name is the one it passes to ``_is_package_available`` (recorded)."""
    guarded = command_entry(command).guarded_imports
    if guarded is None:
        return ()
    name = guarded.module
    with text_only_llamafactory():
        module = importlib.import_module(name)
        from llamafactory.extras import packages
    found = []
    asked: list[str] = []

    def recording(package: str) -> bool:
        asked.append(package)
        return original(package)

    with Patches() as patches:
        original = patches.setattr(packages, "_is_package_available", recording)
        for attr, value in sorted(vars(module).items()):
            if not (callable(value) and getattr(value, "__module__", "") == packages.__name__):
                continue
            if not (attr.startswith("is_") and attr.endswith("_available")):
                continue
            asked.clear()
            available = bool(value())
            found.append(CommandPackage(attr, asked[-1] if asked else attr[3:-10], available))
    return tuple(found)


def package_findings(command: str, *, planned: bool = False) -> list[Finding]:
    """One finding naming the packages ``command`` imports that are missing here (an error), or, planning
    for another machine, that its environment must have (info)."""
    guarded = command_entry(command).guarded_imports
    missing = [p for p in command_packages(command) if not p.available]
    if guarded is None or not missing:
        return []
    names = ", ".join(p.distribution for p in missing)
    install = f'pip install -e ".[{EXTRA}]" (or: pip install {" ".join(p.distribution for p in missing)})'
    where = guarded.module.replace(".", "/") + ".py"
    if planned:
        return [
            Finding(
                code="COMMAND_PACKAGES_MISSING",
                level=Level.INFO,
                message=f"llamafactory-cli {command} imports {names} ({where}); they are not installed here, so "
                "install them on the target machine.",
                fix_as="planned",
                fix_with={"install": install},
            )
        ]
    functions = ", ".join(f"{p.function}()" for p in missing)
    return [
        Finding(
            code="COMMAND_PACKAGES_MISSING",
            level=Level.ERROR,
            message=f"llamafactory-cli {command} needs {names}, not installed here ({functions} in {where} "
            f"answer False): it stops with a NameError where it first uses them (name '{guarded.first_use}' is "
            "not defined).",
            fix_as="here",
            fix_with={"install": install},
        )
    ]


# -- the model on the meta device -------------------------------------------------------------------
def meta_load_model(load_model: Callable[..., Any]) -> Callable[..., Any]:
    """LLaMA-Factory's ``load_model`` (``model/loader.py``) building the model on the meta device.

    loader.py: ``if model_args.train_from_scratch: model = load_class.from_config(config, ...)`` else
    ``load_class.from_pretrained(**init_kwargs)``, the one call that reads weights. Under torch's meta
    default device every tensor a constructor makes is a meta tensor (nothing is allocated); the rest of
    load_model (patch_config, patch_model, init_adapter, the value head) runs as in the real run. Used by
    the training dry run (lf/dry_model.py) and by the after-training commands here."""
    import torch

    def load(tokenizer: Any, model_args: Any, finetuning_args: Any, *args: Any, **kwargs: Any) -> Any:
        with Patches() as patches, torch.device("meta"):
            patches.setattr(model_args, "train_from_scratch", True)
            default = torch.get_default_dtype()
            patches.callback(torch.set_default_dtype, default)
            torch.set_default_dtype(_checkpoint_dtype(model_args.model_name_or_path) or default)
            return load_model(tokenizer, model_args, finetuning_args, *args, **kwargs)

    return load


def _checkpoint_dtype(name_or_path: str) -> Any:
    """The dtype ``from_pretrained(torch_dtype="auto")`` gives a model whose config.json names none (gpt-oss):
    transformers reads it from the weights, which are not read here, so half precision (bfloat16), what
    released checkpoints ship, is assumed, as memory.checkpoint_weight_bytes assumes. None where config.json
    names one: ``from_config`` builds in it as ``from_pretrained`` loads in it."""
    import torch

    from .memory import model_config_for

    found = model_config_for(name_or_path) or {}
    return None if found.get("torch_dtype") or found.get("dtype") else torch.bfloat16


class _Stages(Patches):
    """Which of LLaMA-Factory's steps is running: names in its modules wrapped to record it, until undone."""

    def __init__(self) -> None:
        super().__init__()
        self.current = "parse"

    def wrap(self, module: Any, name: str, stage: str, replace: Callable[..., Any] | None = None) -> None:
        inner = replace or getattr(module, name)

        def step(*args: Any, **kwargs: Any) -> Any:
            before, self.current = self.current, stage
            result = inner(*args, **kwargs)
            self.current = before
            return result

        self.setattr(module, name, step)


class _ReachedSave(Exception):
    """export_model reached ``model.save_pretrained``: every check before writing passed."""


class _ReachedForward(Exception):
    """transformers' generate reached the model's forward: every check before it passed."""


# What failed, by the step it failed in.
_STEP_CODE = {  # step -> (code, what refused, key); the fix is the code's registry entry
    "tokenizer": ("AFTER_TOKENIZER_REFUSED", "LLaMA-Factory's load_tokenizer", "model_name_or_path"),
    "template": ("AFTER_TEMPLATE_REFUSED", "LLaMA-Factory's get_template_and_fix_tokenizer", "template"),
    "model": ("AFTER_MODEL_REFUSED", "LLaMA-Factory's load_model (built on the meta device)", "model_name_or_path"),
    "adapter": (
        "ADAPTER_NOT_LOADABLE",
        "LLaMA-Factory's init_adapter (peft, onto the meta model)",
        "adapter_name_or_path",
    ),
    "export": ("EXPORT_REFUSED", "LLaMA-Factory's export_model", "export_dir"),
    "engine": ("CHAT_ENGINE_REFUSED", "LLaMA-Factory's ChatModel", "infer_backend"),
    "generate": (
        "GENERATION_REFUSED",
        "transformers' generate (prepared by LLaMA-Factory's HuggingfaceEngine)",
        "max_new_tokens",
    ),
}


def _refused(run: DryRun, stage: str, exc: BaseException, config: Mapping[str, Any]) -> None:
    code, what, key = _STEP_CODE.get(stage, _STEP_CODE["model"])
    text = one_line(exc)
    if _meta_limitation(exc):  # a step that needs real weights (an op without a meta kernel): not a verdict
        run.skip(f"{what} and what follows", f"it needs real weights: {text}")
        return
    hint = _folder_hint(config, text)
    if stage == "generate":
        key = _generation_key(text) or key
    run.error(code=code, message=f"{what} refused: {text}{hint}", key=key)


def _folder_hint(config: Mapping[str, Any], text: str) -> str:
    """What the folders are, when the refusal is about them: a model given as the adapter, or the reverse."""
    from .adapters import adapter_paths, read_adapter_config

    model = str(config.get("model_name_or_path") or "")
    for path in adapter_paths(config):
        if path in text and (Path(path) / "config.json").is_file() and read_adapter_config(path) is None:
            return f" ({path} is a model folder, not an adapter: it has config.json and no adapter_config.json)"
        if path in text and not Path(path).exists():
            return f" ({path} does not exist here)"
    adapter = read_adapter_config(model) if model else None
    if adapter is not None:
        base = adapter.get("base_model_name_or_path")
        return (
            f" ({model} is an adapter folder (it has adapter_config.json): give it as the adapter, and its base "
            f"model{f' {base}' if base else ''} as the model)"
        )
    return ""


def _generation_key(text: str) -> str | None:
    for key in ("repetition_penalty", "max_length", "top_k", "top_p", "temperature", "num_beams"):
        if key in text or (key == "repetition_penalty" and "`penalty`" in text):
            return key
    return None


# -- export ------------------------------------------------------------------------------------------
def _export_dir_findings(run: DryRun, export_dir: str) -> bool:
    """transformers' ``save_pretrained`` (modeling_utils.py): ``if os.path.isfile(save_directory):
    logger.error(...); return`` writes nothing, and export_model then fails writing its Modelfile there
    (NotADirectoryError); otherwise ``os.makedirs(save_directory, exist_ok=True)``."""
    path = Path(export_dir)
    if path.is_file():
        run.error(
            code="EXPORT_DIR_NOT_A_FOLDER",
            message=f"export_dir {export_dir} is a file: transformers' save_pretrained writes nothing there and "
            "export_model then stops writing its Modelfile (NotADirectoryError), after the merge.",
            fix_as="file",
            key="export_dir",
        )
        return False
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    if existing is not None and (not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK)):
        what = "is a file" if not existing.is_dir() else "is not writable"
        run.error(
            code="EXPORT_DIR_NOT_A_FOLDER",
            message=f"export_dir {export_dir} cannot be created: {existing} {what} (os.makedirs in "
            "save_pretrained fails after the merge).",
            fix_as="cannot_create",
            key="export_dir",
        )
        return False
    return True


def _dry_export(run: DryRun, config: Mapping[str, Any], model_args: Any) -> None:
    with text_only_llamafactory():
        from llamafactory.model import loader
        from llamafactory.train import tuner

    if model_args.export_dir is not None and not _export_dir_findings(run, str(model_args.export_dir)):
        return
    stages = _Stages()
    meta = meta_load_model(tuner.load_model)

    def load_until_save(*args: Any, **kwargs: Any) -> Any:
        model = meta(*args, **kwargs)
        stages.current = "export"

        def save_pretrained(*_args: Any, **_kwargs: Any) -> None:
            raise _ReachedSave

        model.save_pretrained = save_pretrained  # an attribute of this meta model only
        return model

    stages.wrap(tuner, "load_tokenizer", "tokenizer")
    stages.wrap(tuner, "get_template_and_fix_tokenizer", "template")
    stages.wrap(tuner, "load_model", "model", load_until_save)
    stages.wrap(loader, "init_adapter", "adapter")
    stages.current = "export"
    try:
        inspect.unwrap(tuner.export_model)(dict(config))  # the stock function, not the hook's wrapper
    except _ReachedSave:
        run.skip("the merged weights and their save", "they need the real weights")
    except Exception as exc:
        _refused(run, stages.current, exc, config)
    finally:
        stages.undo()


# -- chat --------------------------------------------------------------------------------------------
def _dry_chat(run: DryRun, config: Mapping[str, Any], model_args: Any, command: str) -> None:
    with text_only_llamafactory():
        from llamafactory.chat import chat_model, hf_engine
        from llamafactory.extras.constants import EngineName
        from llamafactory.model import loader

    backend = model_args.infer_backend
    if backend in (EngineName.VLLM, EngineName.SGLANG):
        run.skip(f"the {getattr(backend, 'value', backend)} engine", "it needs the GPU and the real weights")
        return
    stages = _Stages()
    stages.wrap(hf_engine, "load_tokenizer", "tokenizer")
    stages.wrap(hf_engine, "get_template_and_fix_tokenizer", "template")
    stages.wrap(hf_engine, "load_model", "model", meta_load_model(hf_engine.load_model))
    stages.wrap(loader, "init_adapter", "adapter")
    chat = object.__new__(chat_model.ChatModel)
    stages.current = "engine"
    try:
        inspect.unwrap(chat_model.ChatModel.__init__)(chat, dict(config))  # the stock one, not the hook's
    except Exception as exc:
        _refused(run, stages.current, exc, config)
        return
    finally:
        stages.undo()
    loop = getattr(chat, "_loop", None)
    if loop is not None:  # ChatModel starts its event loop in a daemon thread: stop it
        loop.call_soon_threadsafe(loop.stop)
    _dry_generate(run, chat.engine, command)


def _dry_generate(run: DryRun, engine: Any, command: str) -> None:
    """One generation as HuggingfaceEngine._chat prepares it, run through transformers' generate up to the
    model's first forward. The inputs are built on the CPU (meta tensors hold no ids to check)."""
    import torch

    if not getattr(engine, "can_generate", True):  # a value-head model (stage is not sft): it scores
        if command == "api":  # the API serves its scores (/v1/score/evaluation)
            run.skip("a generation", "this engine scores (a value-head model): it does not generate")
            return
        import asyncio

        try:  # hf_engine.py chat: `if not self.can_generate: raise ValueError(...)` before anything runs
            asyncio.run(engine.chat([{"role": "user", "content": PROBE_MESSAGE}]))
        except Exception as exc:
            _refused(run, "engine", exc, {})
        return
    model = engine.model
    stand_in = _ModelView(model)
    messages = [{"role": "user", "content": PROBE_MESSAGE}]
    try:
        gen_kwargs, prompt_length = engine._process_args(
            stand_in, engine.tokenizer, engine.processor, engine.template, engine.generating_args, messages
        )
    except Exception as exc:
        _refused(run, "generate", exc, {})
        return

    def forward(*_args: Any, **_kwargs: Any) -> None:
        raise _ReachedForward

    model.forward = forward  # an attribute of this meta model only
    try:
        with torch.inference_mode():
            model.generate(**gen_kwargs)
    except _ReachedForward:
        run.skip("the generation itself", f"it needs the real weights (a one-word prompt is {prompt_length} tokens)")
    except Exception as exc:
        _refused(run, "generate", exc, {})


class _ModelView:
    """The meta model as ``_process_args`` reads it (device, dtype, config), placed on the CPU."""

    def __init__(self, model: Any) -> None:
        import torch

        self.device = torch.device("cpu")
        self.dtype = model.dtype
        self.config = model.config


# -- the workflow's other models (training) ----------------------------------------------------------
_WORKFLOW_CODE = {  # which model -> (code, key); the fix is the code's registry entry
    "reference": ("REF_MODEL_NOT_LOADABLE", "ref_model"),
    "reward": ("REWARD_MODEL_NOT_LOADABLE", "reward_model"),
}


def workflow_models(
    run: DryRun, stage: str | None, model_args: Any, finetuning_args: Any, do_train: bool, model: Any
) -> list[tuple[str, Any, int | None]]:
    """The models a training workflow builds besides the policy, as it builds them, on the meta device:
    dpo/kto's reference model and ppo's reference and reward models (LLaMA-Factory's own ``create_ref_model``
    and ``create_reward_model`` in train/trainer_utils.py, with their ``load_model`` building on meta).
    Returns each model its ``load_model`` built, with its role and the quantization_bit it was given (none
    where the workflow reuses the policy: LoRA's reference is the policy with its adapter disabled)."""
    with text_only_llamafactory():
        from llamafactory.train import trainer_utils

    calls: list[tuple[str, Callable[[], Any]]] = []
    if stage == "dpo":
        # train/dpo/workflow.py run_dpo: `if finetuning_args.use_ref_model: if finetuning_args.ref_model is None
        # and (not training_args.do_train): ref_model = model else: ref_model = create_ref_model(...)`
        if finetuning_args.use_ref_model and (finetuning_args.ref_model is not None or do_train):
            calls.append(("reference", lambda: trainer_utils.create_ref_model(model_args, finetuning_args)))
    elif stage == "kto":
        # train/kto/workflow.py run_kto: `if finetuning_args.ref_model is None and (not training_args.do_train):
        # ref_model = model else: ref_model = create_ref_model(model_args, finetuning_args)`
        if finetuning_args.ref_model is not None or do_train:
            calls.append(("reference", lambda: trainer_utils.create_ref_model(model_args, finetuning_args)))
    elif stage == "ppo":
        # train/ppo/workflow.py run_ppo: create_ref_model(..., add_valuehead=True), then create_reward_model
        calls.append(("reference", lambda: trainer_utils.create_ref_model(model_args, finetuning_args, True)))
        if model is not None:
            calls.append(("reward", lambda: trainer_utils.create_reward_model(model, model_args, finetuning_args)))
    built: list[tuple[str, Any, int | None]] = []
    if not calls:
        return built
    meta = meta_load_model(trainer_utils.load_model)
    loaded: list[tuple[Any, int | None]] = []

    def load(tokenizer: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
        made = meta(tokenizer, args, *rest, **kwargs)
        loaded.append((made, args.quantization_bit))
        return made

    with Patches() as patches:
        patches.setattr(trainer_utils, "load_model", load)
        for which, call in calls:
            loaded.clear()
            try:
                call()
            except Exception as exc:
                text = one_line(exc)
                if _meta_limitation(exc):
                    run.skip(f"the {which} model", f"it needs real weights: {text}")
                    continue
                code, key = _WORKFLOW_CODE[which]
                run.error(
                    code=code,
                    message=f"LLaMA-Factory's {stage} workflow builds its {which} model (train/trainer_utils.py, "
                    f"built here on the meta device) after loading the policy, and it refused: {text}",
                    key=key,
                )
                continue
            built += [(which, made, bits) for made, bits in loaded]
    return built


# -- entry -------------------------------------------------------------------------------------------
def dry_load(config: Mapping[str, Any], command: str, *, planned: bool = False) -> DryRun:
    """Build ``command`` (export, chat, api or webchat) dry on ``config``, as LLaMA-Factory builds it.

    ``planned``: the check is for another machine; its packages are then requirements (info), and the
    model, tokenizer and adapters, which are that machine's files, are not loaded here."""
    run = DryRun()
    run.findings += package_findings(command, planned=planned)
    if planned:
        run.skip("the model, tokenizer and adapters", "planning for another machine: they are its files")
        return run
    with text_only_llamafactory():
        from llamafactory.hparams import get_infer_args
    with llamafactory_call() as patches:
        patches.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")  # peft's and torch's notes on meta tensors
        patches.enter_context(contextlib.redirect_stdout(io.StringIO()))
        try:
            model_args = get_infer_args(dict(config))[0]
        except (Exception, SystemExit) as exc:  # command_verdict reports the parser's refusal itself
            run.skip("the dry load", f"get_infer_args refused the config: {one_line(exc)}")
            return run
        if not reachable(run, model_args):  # the training dry run's own reachability step
            return run
        if command == "export":
            _dry_export(run, config, model_args)
        else:
            _dry_chat(run, config, model_args, command)
    return run


__all__ = [
    "CommandPackage",
    "command_packages",
    "dry_load",
    "meta_load_model",
    "package_findings",
    "workflow_models",
]
