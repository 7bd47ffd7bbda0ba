"""``prepare``: LLaMA-Factory's own ``get_dataset`` (template, tokenizer, cutoff_len, packing) on CPU,
saved at ``tokenized_path`` so the GPU box loads it instead of preprocessing again.

The counts come from LLaMA-Factory's output: kept is the length of what it tokenized; truncated is
found by running its preprocessing a second time with no cutoff (not saved) and comparing lengths.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..findings import Finding, Level
from .findings import config_dataset_findings
from .info import reason

NO_CUTOFF = 1 << 30
RECORD = "llamafactory_rocm_prepare.json"  # beside LLaMA-Factory's files in tokenized_path
CPU_ONLY_DROPS = ("deepspeed", "fp16", "bf16", "pure_bf16", "fsdp", "fsdp_config", "ddp_timeout")


@dataclass
class PrepareResult:
    ok: bool
    examples: int = 0
    kept: int = 0
    dropped: int = 0
    truncated: int = 0
    tokens: int = 0
    tokenized_path: str | None = None
    lengths: dict[str, int] = field(default_factory=dict)  # untruncated, in tokens: p50, p90, p99, max
    steps_per_epoch: int | None = None
    sequences: int = 0  # rows of the tokenized train set (packed sequences when packing)
    datasets: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "findings": [f.model_dump(mode="json") for f in self.findings]}


def prepare(
    config: dict[str, Any], cwd: Path, *, tokenized_path: str | None = None, force: bool = False, world_size: int = 1
) -> PrepareResult:
    """Check the config's datasets, then tokenize them as LLaMA-Factory will and save the result."""
    config, findings = config_dataset_findings(config, cwd)
    result = PrepareResult(ok=True, findings=findings)
    result.ok = not any(f.level is Level.ERROR for f in findings)
    if not result.ok:
        return result
    target = Path(tokenized_path or config.get("tokenized_path") or _default_path(config, cwd))
    target = target if target.is_absolute() else Path(cwd) / target
    if target.exists() and any(target.iterdir()) and not force:
        raise UsageError(
            f"{target} already holds a tokenized dataset (LLaMA-Factory would load it and ignore the data). "
            "Pass --force to rebuild it, or name another with tokenized_path=..."
        )
    with tempfile.TemporaryDirectory(prefix="lfr-prepare-") as scratch, _logs_on_stderr():
        staging = target.parent / f".{target.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        run = _Run(config, Path(scratch), world_size)
        train = run.tokenize(staging)
        full = run.full_lengths()
        _replace(staging, target, config)
    _fill(result, run, train, full)
    result.tokenized_path = str(target)
    result.datasets = [{"name": n, "examples": c} for n, c in run.examples.items()]
    result.warnings += run.template_warnings()
    return result


@contextlib.contextmanager
def _logs_on_stderr() -> Iterator[None]:
    """LLaMA-Factory prints examples and logs on stdout; stdout is kept for the report (--json)."""
    import logging

    from ..lf.text_only import text_only_llamafactory

    with text_only_llamafactory():
        from llamafactory.extras import logging as lf_logging

    lf_logging.get_logger("llamafactory")  # its handler exists from here on
    moved = [h for h in logging.getLogger("llamafactory").handlers if getattr(h, "stream", None) is sys.stdout]
    for handler in moved:
        handler.setStream(sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for handler in moved:
            handler.setStream(sys.stdout)


def _default_path(config: dict[str, Any], cwd: Path) -> Path:
    """Named after what decides the tokens: the model, template, data and their limits."""
    keys = ("model_name_or_path", "template", "dataset", "eval_dataset", "dataset_dir", "cutoff_len", "packing")
    keys += ("max_samples", "val_size", "stage", "train_on_prompt", "mask_history")
    digest = hashlib.sha256(json.dumps({k: config.get(k) for k in keys}, sort_keys=True, default=str).encode())
    return Path(cwd) / "tokenized" / digest.hexdigest()[:12]


class _Run:
    """LLaMA-Factory's argument parser, tokenizer and template, on CPU."""

    def __init__(self, config: dict[str, Any], scratch: Path, world_size: int) -> None:
        from ..lf.stages import data_stage
        from ..lf.text_only import text_only_llamafactory

        with text_only_llamafactory():
            from llamafactory.data import get_template_and_fix_tokenizer
            from llamafactory.hparams import get_train_args
            from llamafactory.model import load_tokenizer

        self.config = {k: v for k, v in config.items() if k not in CPU_ONLY_DROPS}
        self.config.update(output_dir=str(scratch / "out"), report_to="none", overwrite_cache=True)
        self.config.update(cache_dir=str(scratch / "cache"), do_train=True)
        self.config.pop("tokenized_path", None)
        self.world_size = world_size
        try:
            self.model_args, self.data_args, self.training_args, self.finetuning_args, _ = get_train_args(self.config)
            self.tokenizer_module = load_tokenizer(self.model_args)
        except (Exception, SystemExit) as err:  # the tokenizer is not reachable, or LF refuses the config
            raise UsageError(f"LLaMA-Factory cannot load the tokenizer or the config: {_line(err)}") from None
        self.tokenizer = self.tokenizer_module["tokenizer"]
        self.data_stage = data_stage(self.finetuning_args.stage)  # what the workflow passes: run_dpo -> "rm"
        self.own_template = getattr(self.tokenizer, "chat_template", None)  # before LF may replace it
        self.template = get_template_and_fix_tokenizer(self.tokenizer, self.data_args)
        self.examples: dict[str, int] = {}

    def _get_dataset(self, data_args: Any) -> Any:
        from llamafactory.data import get_dataset

        try:
            return get_dataset(
                self.template, self.model_args, data_args, self.training_args, self.data_stage,
                **self.tokenizer_module,
            )  # fmt: skip
        except (Exception, SystemExit) as err:
            raise UsageError(f"LLaMA-Factory's preprocessing stops: {_line(err)}") from None

    def tokenize(self, staging: Path) -> Any:
        self.data_args.tokenized_path = str(staging)
        module = self._get_dataset(self.data_args)
        self.data_args.tokenized_path = None
        return module["train_dataset"]

    def full_lengths(self) -> list[int]:
        """Every kept example's length with no cutoff and no packing (LLaMA-Factory's processor again)."""
        import copy

        from llamafactory.data.loader import _get_merged_dataset

        args = copy.copy(self.data_args)
        args.cutoff_len, args.packing, args.neat_packing, args.tokenized_path = NO_CUTOFF, False, False, None
        for name in self.data_args.dataset or []:
            merged = _get_merged_dataset([name], self.model_args, args, self.training_args, self.data_stage)
            self.examples[name] = len(merged)
        train = self._get_dataset(args)["train_dataset"]
        column = "input_ids" if "input_ids" in train.column_names else "chosen_input_ids"
        return [len(ids) for ids in train[column]]

    def template_warnings(self) -> list[str]:
        """The model's own chat template against LLaMA-Factory's ``template:``, on one exchange."""
        name = self.data_args.template
        if not self.own_template:
            return [f"the model has no chat template of its own: template {name!r} decides the prompt format"]
        messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        try:
            own = self.tokenizer.apply_chat_template(messages, chat_template=self.own_template, tokenize=True)
            if hasattr(own, "keys"):  # newer transformers return a BatchEncoding
                own = own["input_ids"]
        except Exception as err:
            return [f"the model's own chat template cannot be rendered ({_line(err)}); template {name!r} is used"]
        prompt, answer = self.template.encode_oneturn(self.tokenizer, messages)
        if list(own) == prompt + answer:
            return []
        ours = self.tokenizer.decode(prompt + answer)
        theirs = self.tokenizer.decode(list(own))
        return [
            f"template {name!r} and the model's own chat template disagree: {ours!r} (template) vs {theirs!r} "
            "(model): the model is trained on one format and may be prompted with the other; check `template:`"
        ]


def _fill(result: PrepareResult, run: _Run, train: Any, full: list[int]) -> None:
    cutoff = run.data_args.cutoff_len + (1 if run.data_args.packing else 0)  # LF takes 1 off when packing
    result.examples = sum(run.examples.values())
    result.kept = len(full)
    result.dropped = result.examples - result.kept
    result.truncated = sum(1 for n in full if n > cutoff)
    result.sequences = len(train)
    column = "input_ids" if "input_ids" in train.column_names else "chosen_input_ids"
    if run.data_args.packing:
        result.tokens = sum(min(n, cutoff) for n in full)
    else:
        result.tokens = sum(len(ids) for ids in train[column])
    ordered = sorted(full)
    if ordered:
        rank = lambda p: ordered[max(0, math.ceil(len(ordered) * p / 100) - 1)]  # noqa: E731
        result.lengths = {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": ordered[-1]}
    args = run.training_args
    per_step = args.per_device_train_batch_size * run.world_size
    result.steps_per_epoch = math.ceil(math.ceil(result.sequences / per_step) / args.gradient_accumulation_steps)
    if result.kept == 0:
        result.ok = False


def _replace(staging: Path, target: Path, config: dict[str, Any]) -> None:
    """The new tokenized folder takes the target's place by renames: never half of one."""
    record = {"dataset": config.get("dataset"), "model": config.get("model_name_or_path"), "config": config}
    (staging / RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    old = target.parent / f".{target.name}.old"
    try:
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        staging.rename(target)
    except OSError as err:
        raise UsageError(f"cannot write {target}: {reason(err)}") from None
    shutil.rmtree(old, ignore_errors=True)


def _line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) < 300 else text[:300] + "..."
