"""Each term of the memory estimate against its own measurement on a real CPU step: LoRA, freeze and full
fine-tuning (issue 40 item 1).

tests/test_memory_oracle.py reduces each family to a vocabulary of 1024 and hidden 128, where the logits are
most of the step: a wrong activation or weight count hides inside its 10%. Here the shape is chosen so that
weights, trainable state, activations and logits are each a large share (Llama-3-8B's config.json under LoRA,
freeze and full, Qwen3-MoE's under LoRA, each with 8 layers, hidden 128, a vocabulary of 769 (prime, so that
only logit-shaped allocations are multiples of it), batch 2 x ``cutoff_len`` 250; Qwen3-MoE also without
gradient checkpointing, where every layer's whole saved set is the activations), and each term is asserted
against its own measurement, never our sum:

- weights: transformers' own ``get_memory_footprint(return_buffers=False)`` of the model LLaMA-Factory's
  ``load_model`` built (real tensors: the base in bf16, LoRA's adapter or the trained layers in fp32);
- trainable state: the real AdamW's state tensors after a step plus the ``.grad`` tensors the step's backward
  left (tests/test_memory_oracle.py ``measure_step``);
- logits: the most the step held at once in allocations whose size is a multiple of vocabulary x tokens
  (torch's profiler, every allocation and free of the CPU allocator);
- activations: what autograd saves in the model's real forward (``saved_tensors_hooks``, parameters left out,
  the model's own gradient checkpointing), without labels: the loss's own tensors are the logits' term.
  This is the estimate's activations only where a recomputed layer is smaller than the logits it outlives
  (``memory._traced_per_token``): then nothing beyond the saved set is counted. Gemma 3 at these widths is not
  such a shape (its recomputed layer is 0.31 MiB over: 1.255 of the saved set), so it is left to
  tests/test_memory_oracle.py.

The estimate is the one ``check`` makes for the same config (the dry run's meta model and trace, then
``plan_estimate``: tests/test_memory_stages.py ``estimated_step_bytes``). docs/memory.md#per-term has the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest

from tests.test_memory_oracle import lf_model, lora_config, measure_step, model_folder
from tests.test_memory_stages import estimated_step_bytes

FAMILY = "llama3_8b"
VOCAB, BATCH, CUTOFF = 769, 2, 250
TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "head_dim": 32,
    "vocab_size": VOCAB,
}
EXACT = 0.005  # weights and trainable state are counts of the same tensors: the runs show 1.000
TERM = 0.05  # logits and activations: a measured peak and a real forward's saved set
MIB = 2**20
METHODS = ("lora", "freeze", "full")
# family/method: the dense Llama under each method, and an MoE (Qwen3-MoE: 8 experts of 64, 2 a token, q/k norms)
# ("/nockpt": disable_gradient_checkpointing, where every layer's whole saved set is the activations)
CASES = (*(f"{FAMILY}/{method}" for method in METHODS), "qwen3_moe_defaults/lora", "qwen3_moe_defaults/lora/nockpt")


@dataclass(frozen=True)
class Terms:
    """One case's four terms, bytes: measured on the real step, and as ``check`` estimates them."""

    method: str
    measured: dict[str, float]
    estimated: dict[str, float]
    measured_peak: float  # live state when the step began + the step's peak above it
    estimated_peak: float  # the estimate's total less the GPU's fixed workspace
    gradients: float  # the measured .grad bytes (in the trainable state)

    def ratio(self, term: str) -> float:
        return self.estimated[term] / self.measured[term]

    def share(self, term: str) -> float:
        return self.measured[term] / self.measured_peak


def logit_bytes_held(allocations: tuple[int, ...], vocab: int, rows: int, length: int) -> int:
    """The most bytes held at once in logit-shaped allocations: sizes that are multiples of vocab x the tokens
    (``length`` per row, or ``length - 1`` for a shifted slice), whatever their dtype. A free is the negative
    of its allocation's size, so the class's running sum is what it holds."""
    per_row = {vocab * length, vocab * (length - 1)}

    def logit_sized(nbytes: int) -> bool:
        return any(abs(nbytes) % (unit * rows) == 0 for unit in per_row)

    return max(accumulate(n for n in allocations if logit_sized(n)), default=0)


def measure_terms(method: str, tiny_model: Path, into: Path, family: str = FAMILY, checkpointing: bool = True) -> Terms:
    folder = model_folder(family, tiny_model, into, TEXT)
    sizes = {"cutoff_len": CUTOFF, "per_device_train_batch_size": BATCH}
    config = lora_config(folder, into / f"out-{method}", finetuning_type=method,
                         disable_gradient_checkpointing=not checkpointing, **sizes)  # fmt: skip
    model = lf_model(config)
    weights = model.get_memory_footprint(return_buffers=False)
    step = measure_step(model, VOCAB, BATCH, CUTOFF, saved_set=True)
    measured = {
        "weights": weights,
        "trainable state": step.optimizer_state_bytes + step.gradient_bytes,
        "activations": step.saved_bytes,
        "logits": logit_bytes_held(step.allocations, VOCAB, BATCH, CUTOFF),
        "gradients": step.gradient_bytes,  # the .grad tensors the backward left (part of the trainable state)
    }
    _, est = estimated_step_bytes(config)
    estimated = {
        "weights": est.weights_gib * 2**30,
        "trainable state": est.trainable_state_gib * 2**30,
        "activations": est.activations_gib * 2**30,
        "logits": est.logits_gib * 2**30,
        "gradients": est.gradients_gib * 2**30,
    }
    est_peak = (est.total_gib - est.workspace_gib) * 2**30
    return Terms(method, measured, estimated, step.peak_bytes, est_peak, step.gradient_bytes)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def measured_terms() -> dict[str, Terms]:
    """Each case measured once for all tests (a model build, a step and a dry run each)."""
    return {}


def terms_of(case: str, cache: dict[str, Terms], tiny_model: Path, into: Any) -> Terms:
    family, method, *flag = case.split("/")
    if case not in cache:
        cache[case] = measure_terms(method, tiny_model, into.mktemp(family), family, checkpointing=not flag)
    return cache[case]


@pytest.mark.trainer
@pytest.mark.parametrize("case", CASES)
def test_each_term_is_its_own_measurement(case, measured_terms, tiny_model, tmp_path_factory):
    terms = terms_of(case, measured_terms, tiny_model, tmp_path_factory)
    report = {t: (round(terms.measured[t] / MIB, 3), round(terms.ratio(t), 3)) for t in terms.measured}
    for term in ("weights", "trainable state", "gradients"):
        assert terms.ratio(term) == pytest.approx(1, abs=EXACT), (case, term, report)
    for term in ("activations", "logits"):
        assert terms.ratio(term) == pytest.approx(1, abs=TERM), (case, term, report)
    assert terms.share("logits") < 0.5, (case, report)  # unlike tests/test_memory_oracle.py's shapes


@pytest.mark.trainer
@pytest.mark.parametrize("case", CASES)
def test_estimated_peak_is_within_5_percent_of_the_measured_step(case, measured_terms, tiny_model, tmp_path_factory):
    """The whole step, LoRA, freeze and full: the terms are not simply added (``Estimate.moments``): measured
    2026-12-06, full fine-tuning peaks at the forward's end, where autocast's bf16 copies of the fp32 trainable
    weights are held beside the activations and the loss's logits, and before any gradient exists; adding the
    gradients to the logits, as the estimate did, gave 1.139 (full) and 1.105 (freeze)."""
    terms = terms_of(case, measured_terms, tiny_model, tmp_path_factory)
    peak = terms.estimated_peak / terms.measured_peak
    # the runs show 0.996-1.000 (2026-12-06); the bar is 10%, but dropping autocast's copies (a tenth of
    # full fine-tuning's step) gives 0.927, which only a 5% bar catches (docs/testing.md)
    assert peak == pytest.approx(1, abs=TERM), (case, peak, terms.measured_peak / MIB)
