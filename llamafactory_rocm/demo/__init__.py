"""The embedded demo: a real LoRA fine-tune on CPU with a tiny local model and the bundled data.

It uses a config written the way blogs write it (``fp16: true``, ``compute_dtype``, ``backend``),
so the demo also shows the rewrites, then goes through LLaMA-Factory's real trainer. The tiny model
starts from random weights, so what it can learn in a minute on CPU is a few answers by heart: it
trains on the dataset's first ``DEMO_ROWS`` rows for many epochs, and one of their questions is
answered (greedy generation) by the base model and by the model with the new adapter.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..check.config_io import dump_yaml
from ..fsutil import atomic_write_text, first_free_name
from ..resources import datasets_dir
from ..train.launch import train
from ..train.verbosity import quiet_by_default
from .tiny import build_tiny_model, texts_from_dataset

if TYPE_CHECKING:
    from ..train.summary import RunSummary

DEMO_DATASET = "amd_finetune_qa"
# Measured on 2 cores (report of issue 17): 24 rows x 200 steps of batch 4 (33 epochs) takes the
# loss from 6.8 to 0.5 (ln 460 = 6.13 is a uniform guess) and the answers come back word for word;
# 60 rows reach only 4.1, and 240 rows for 60 steps stay at the uniform guess.
DEMO_ROWS = 24
DEFAULT_STEPS = 200
QUESTION_ROW = 0  # one of the rows trained on
ANSWER_TOKENS = 32  # greedy tokens generated for the before/after answer


@dataclass(frozen=True)
class Answers:
    question: str
    reference: str
    before: str
    after: str


@dataclass(frozen=True)
class DemoResult:
    exit_code: int
    output_dir: Path
    first_loss: float | None
    last_loss: float | None
    adapter: Path | None
    plot: Path | None = None
    vocab_size: int | None = None
    summary: RunSummary | None = None
    answers: Answers | None = None

    @property
    def uniform_loss(self) -> float | None:
        """The loss of a uniform guess over the vocabulary: what an untrained model is worth."""
        return math.log(self.vocab_size) if self.vocab_size else None


def logging_steps_for(max_steps: int) -> int:
    """About 20 logged losses for the plot, and at least one for a run of a few steps."""
    return max(1, min(10, max_steps // 20))


def demo_config(model_dir: Path, output_dir: Path, max_steps: int = DEFAULT_STEPS) -> dict:
    return {
        "model_name_or_path": str(model_dir),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_rank": 16,
        "lora_target": "all",
        "template": "llama3",
        "dataset": DEMO_DATASET,
        "dataset_dir": str(datasets_dir()),
        "max_samples": DEMO_ROWS,
        "cutoff_len": 128,
        "per_device_train_batch_size": 4,
        # 2e-2 measured slower to fall (4.5 after 150 steps against 2.0 at 1e-2), 5e-3 too (2.2 at 200)
        "learning_rate": 1.0e-2,
        "max_steps": max_steps,
        "logging_steps": logging_steps_for(max_steps),
        "save_steps": max_steps,
        "output_dir": str(output_dir),
        "report_to": "none",
        "overwrite_cache": True,
        "seed": 0,
        "plot_loss": True,
        "include_num_input_tokens_seen": True,  # the summary's tokens/s counts, not estimates
        # Written the way blog posts write it; the pre-launch check rewrites all three.
        "fp16": True,
        "compute_dtype": "bfloat16",
        "backend": "pt",
    }


def loss_curve(output_dir: Path) -> list[float]:
    state = output_dir / "trainer_state.json"
    if not state.is_file():
        return []
    history = json.loads(state.read_text(encoding="utf-8")).get("log_history", [])
    return [entry["loss"] for entry in history if "loss" in entry]


def demo_question(row: int = QUESTION_ROW) -> tuple[str, str]:
    """(question, bundled answer) of one row the demo trains on."""
    rows = json.loads((datasets_dir() / f"{DEMO_DATASET}.json").read_text(encoding="utf-8"))
    return str(rows[row]["instruction"]), str(rows[row]["output"])


def _generate(model: Any, tokenizer: Any, question: str, tokens: int) -> str:
    import torch

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    return " ".join(text.split())  # one line, whatever the untrained model emits


def before_and_after(model_dir: Path, output_dir: Path, tokens: int = ANSWER_TOKENS) -> Answers:
    """One trained question answered by the base model, then by the base model + the new adapter.

    The tokenizer comes from ``output_dir``, where LLaMA-Factory saved it with the llama3 chat
    template the training used, so both prompts are formatted exactly as the training rows were.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    question, reference = demo_question()
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    before = _generate(base, tokenizer, question, tokens)  # before PeftModel injects the LoRA layers
    tuned = PeftModel.from_pretrained(base, output_dir)
    after = _generate(tuned, tokenizer, question, tokens)
    return Answers(question, reference, before, after)


def run_demo(work_dir: Path, max_steps: int = DEFAULT_STEPS) -> DemoResult:
    start = time.perf_counter()
    import torch

    from ..train.summary import summary_from_output_dir  # imports transformers: not at CLI start-up

    # One thread: a model this small gains little from a second one, and loses badly when another
    # process wants the core (measured while other jobs ran on the 2 cores: 200 steps of a 40-row
    # run took 7.7 s with one thread and 161 s with two).
    torch.set_num_threads(1)
    quiet_by_default()  # before LLaMA-Factory is imported: its loggers read the level once
    work_dir.mkdir(parents=True, exist_ok=True)
    model_dir = work_dir / "tiny-llama"
    if not (model_dir / "config.json").is_file():
        build_tiny_model(model_dir, texts_from_dataset(datasets_dir() / f"{DEMO_DATASET}.json"))
    output_dir = first_free_name(work_dir, "run", "")  # never reuse an earlier run's folder
    config_path = first_free_name(work_dir, "demo_config", ".yaml")
    atomic_write_text(config_path, dump_yaml(demo_config(model_dir, output_dir, max_steps)), overwrite=False)
    code = train(config_path, origin="llamafactory-rocm demo")
    summary = summary_from_output_dir(output_dir, wall_s=time.perf_counter() - start)
    adapter = output_dir / "adapter_model.safetensors"
    answers = before_and_after(model_dir, output_dir) if code == 0 and adapter.is_file() else None
    losses = loss_curve(output_dir)
    vocab = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    return DemoResult(
        exit_code=code,
        output_dir=output_dir,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        adapter=adapter if adapter.is_file() else None,
        plot=summary.plot if summary else None,
        vocab_size=vocab,
        summary=summary,
        answers=answers,
    )
