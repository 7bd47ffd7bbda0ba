"""The honest oracle for generated configs (issue 20, item 5): LLaMA-Factory's real run.

Shared by ``tests/test_resolution_property.py`` (a small fixed sample in CI) and
``bench/bench_property.py`` (a larger one). Each generated config is for the tiny local model, one
training step on CPU, with a dataset of the kind its stage reads (or, sometimes, of another kind). It
goes through ``check`` in this process; then stock LLaMA-Factory runs it with the hook off
(``LLAMAFACTORY_ROCM=0``, ``run_exp`` exactly as ``llamafactory-cli train CONFIG.yaml`` calls it; the
runs split over two processes, each paying the imports once):

- check ok: the RESOLVED config (check's rewrites applied, as the hook would hand it over) must train:
  exit 0 and the weights written;
- check refuses: the INPUT config must fail, since LLaMA-Factory alone would hit the same wall. The
  refusals LLaMA-Factory would not hit itself (``PROTECTIVE``: keeping checkpoints on disk) are left out,
  and the generator writes no output_dir that has any, so none come up.

The generator uses LLaMA-Factory's own keys only (no blog keys such as ``compute_dtype``), so that the
input is what LLaMA-Factory reads and a refusal of it is a fair question.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests import stock_runner
from tests.conftest import tiny_train_config

PROTECTIVE = frozenset({"CHECKPOINT_ROTATION"})  # another experiment's checkpoints, which LLaMA-Factory rotates away
WEIGHTS = ("adapter_model.safetensors", "model.safetensors")
TIMEOUT_S = 900


# The stage and which dataset it gets: its own kind mostly, another kind sometimes.
STAGE_DATA = {"sft": "alpaca", "pt": "alpaca", "rm": "pairs", "dpo": "pairs", "kto": "kto"}
# What a config changes from the tiny base config: LLaMA-Factory keys, values it trains with and values
# that stop it (a quoted number, a module the model lacks, a package not installed, a size of 0, ...).
CHANGES: tuple[tuple[str, object], ...] = (
    ("finetuning_type", "freeze"),
    ("finetuning_type", "full"),
    ("lora_target", "q_proj,v_proj"),
    ("lora_target", "c_attn"),
    ("lora_rank", 8),
    ("lora_rank", 0),
    ("lora_rank", "8"),
    ("lora_rank", 8.0),
    ("learning_rate", "5e-5"),
    ("learning_rate", "abc"),
    ("learning_rate", 1.0e-3),
    ("cutoff_len", "64"),
    ("cutoff_len", 32),
    ("per_device_train_batch_size", 1),
    ("per_device_train_batch_size", 0),
    ("gradient_accumulation_steps", 2),
    ("val_size", 0.25),
    ("val_size", 100),
    ("bf16", True),
    ("fp16", True),
    ("template", "default"),
    ("template", "glm4"),
    ("template", ["llama3"]),
    ("train_on_prompt", True),
    ("optim", "adamw_torch"),
    ("optim", "sgd"),
    ("optim", "adamw_bnb_8bit"),
    ("lr_scheduler_type", "cosine"),
    ("lr_scheduler_type", "cosine_with_min_lr"),
    ("packing", True),
    ("max_steps", 1.0),
    ("max_steps", "1"),
    ("report_to", "wandb"),
    ("report_to", "tensorboard"),
    ("lora_dropout", 0.1),
    ("weight_decay", 0.01),
    ("pref_loss", "hinge2"),  # outside its Literal: parse_dict checks no choices, and DPO trains with it
    ("log_level", "loud"),  # outside its choices: Trainer.__init__'s dict lookup stops the run
)
ORACLE_CONFIGS = st.fixed_dictionaries(
    {
        "stage": st.sampled_from(["sft", "pt", "rm", "dpo", "kto"]),
        "data": st.sampled_from(["own", "own", "own", "own", "alpaca", "pairs", "kto"]),
        "changes": st.lists(st.sampled_from(CHANGES), max_size=3, unique_by=lambda kv: kv[0]),
    }
)


def write_data(folder: Path) -> Path:
    """alpaca rows (sft, pt), ranking pairs (rm, dpo) and kto-tagged rows (kto), each in dataset_info.json."""
    folder.mkdir(parents=True, exist_ok=True)
    base = [{"instruction": f"What is {i} + {i}?", "input": "", "output": f"It is {2 * i}."} for i in range(16)]
    alpaca_columns = {"prompt": "instruction", "query": "input", "response": "output"}
    sets = {
        "alpaca": (base, {"columns": alpaca_columns}),
        "pairs": (
            [
                {"instruction": r["instruction"], "input": "", "chosen": r["output"], "rejected": "No idea."}
                for r in base
            ],
            {"ranking": True, "columns": {**alpaca_columns, "chosen": "chosen", "rejected": "rejected"}},
        ),
        "kto": (
            [{**r, "kto_tag": i % 3 != 0} for i, r in enumerate(base)],
            {"columns": {**alpaca_columns, "kto_tag": "kto_tag"}},
        ),
    }
    info = {}
    for name, (rows, entry) in sets.items():
        (folder / f"{name}.json").write_text(json.dumps(rows))
        info[name] = {"file_name": f"{name}.json", **entry}
    (folder / "dataset_info.json").write_text(json.dumps(info))
    return folder


def sample(n: int, seed_value: int | None = None) -> list[dict[str, Any]]:
    """n generated choices (fewer if some repeat): fixed by hypothesis' derandomize, or by ``seed_value``."""
    found: list[dict[str, Any]] = []

    @settings(
        max_examples=n,
        derandomize=seed_value is None,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(ORACLE_CONFIGS)
    def collect(generated: dict[str, Any]) -> None:
        choice = {"stage": generated["stage"], "data": generated["data"], **dict(generated["changes"])}
        if choice not in found:
            found.append(choice)

    if seed_value is not None:
        collect = seed(seed_value)(collect)
    collect()
    return found


def build_config(choice: dict[str, Any], model: Path, data: Path, output_dir: Path) -> dict[str, Any]:
    choice = dict(choice)
    stage, kind = choice.pop("stage"), choice.pop("data")
    config = tiny_train_config(
        model, output_dir, max_steps=1, max_samples=8, cutoff_len=64, per_device_train_batch_size=2
    )
    config.update(stage=stage, dataset=STAGE_DATA[stage] if kind == "own" else kind, dataset_dir=str(data))
    config.update(choice)
    if config.get("val_size") is not None:
        config["per_device_eval_batch_size"] = 1
    return config


@dataclass
class Example:
    id: str
    input: dict[str, Any]
    folder: Path
    check_ok: bool = False
    check_errors: tuple[str, ...] = ()
    check_words: str = ""
    resolved: dict[str, Any] | None = None
    stock_exit: int | None = None
    stock_trained: bool | None = None
    stock_words: str = ""

    @property
    def asked(self) -> bool:
        """Whether the stock run is a fair oracle for this verdict (not a protective refusal)."""
        return self.check_ok or not set(self.check_errors) <= PROTECTIVE

    @property
    def agrees(self) -> bool | None:
        if not self.asked or self.stock_trained is None:
            return None
        return self.stock_trained if self.check_ok else not self.stock_trained

    def describe(self) -> str:
        check = "ok" if self.check_ok else f"refused {','.join(self.check_errors)}: {self.check_words[:160]}"
        stock = "trained" if self.stock_trained else f"failed (exit {self.stock_exit}): {self.stock_words[:200]}"
        ran = "resolved" if self.check_ok else "input"
        changed = {k: v for k, v in self.input.items() if k not in ("model_name_or_path", "dataset_dir", "output_dir")}
        return f"{self.id}: {json.dumps(changed, default=str)}\n  check {check}\n  stock ({ran} config) {stock}"


def run_check(example: Example) -> None:
    """check, in this process, on this machine, from the example's folder, the hub off."""
    from llamafactory_rocm.check.run import check_config

    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    os.environ.update(HF_HOME=str(example.folder / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    os.chdir(example.folder)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            report = check_config(example.input, plan_without_gpu=False)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    errors = [f for f in report.findings if f.level.value == "error"]
    example.check_ok = report.ok
    example.check_errors = tuple(f.code for f in errors)
    example.check_words = " | ".join(" ".join(f.message.split()) for f in errors)
    example.resolved = dict(report.config)


class QuotedStrings(yaml.SafeDumper):
    """Every string double-quoted: PyYAML writes "5e-5" bare, and OmegaConf would read that as a float."""


QuotedStrings.add_representer(
    str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
)


def stock_runs(examples: list[Example], work: Path, processes: int = 2) -> None:
    """Stock LLaMA-Factory, hook off, 1 step: the resolved config where check is ok, the input where not."""
    env = stock_runner.hook_off_env(work, MKL_NUM_THREADS="1")
    asked = [e for e in examples if e.asked]
    for e in asked:
        config = e.resolved if e.check_ok else e.input
        (e.folder / "stock.yaml").write_text(yaml.dump(config, Dumper=QuotedStrings, sort_keys=False))

    def one_process(part: int) -> dict[str, dict[str, Any]]:
        mine = asked[part::processes]
        if not mine:
            return {}
        cases = [{"id": e.id, "dir": str(e.folder), "args": ["stock.yaml"]} for e in mine]
        return stock_runner.run_alone(cases, work, env, name=f"stock-{part}", timeout=TIMEOUT_S)[0]

    with ThreadPoolExecutor(max_workers=processes) as pool:
        got: dict[str, dict[str, Any]] = {}
        for part in pool.map(one_process, range(processes)):
            got.update(part)
    for e in asked:
        result = got.get(e.id)
        if result is None:
            e.stock_exit, e.stock_trained, e.stock_words = -1, False, "the runner died before this example"
            continue
        out = Path((e.resolved if e.check_ok else e.input)["output_dir"])
        e.stock_exit, e.stock_words = result["exit"], result["error"]
        e.stock_trained = result["exit"] == 0 and any((out / name).is_file() for name in WEIGHTS)


def run_oracle(choices: list[dict[str, Any]], model: Path, work: Path, processes: int = 2) -> list[Example]:
    data = write_data(work / "data")
    examples = []
    for i, choice in enumerate(choices):
        folder = work / f"ex{i:03d}"
        folder.mkdir(parents=True)
        examples.append(Example(f"ex{i:03d}", build_config(choice, model, data, folder / "out"), folder))
    for example in examples:
        run_check(example)
    stock_runs(examples, work, processes)
    return examples


def summary(examples: list[Example]) -> str:
    asked = [e for e in examples if e.agrees is not None]
    ok = [e for e in asked if e.check_ok]
    refused = [e for e in asked if not e.check_ok]
    lines = [
        f"{len(examples)} configs, {len(asked)} asked of stock LLaMA-Factory: "
        f"{sum(bool(e.agrees) for e in asked)} agree, {sum(not e.agrees for e in asked)} disagree",
        f"  check ok: {len(ok)} (stock trained the resolved config: {sum(bool(e.stock_trained) for e in ok)})",
        f"  check refused: {len(refused)} (stock failed on the input: {sum(not e.stock_trained for e in refused)})",
    ]
    lines += (
        ["disagreements:", *(e.describe() for e in asked if not e.agrees)] if any(not e.agrees for e in asked) else []
    )
    return "\n".join(lines)
