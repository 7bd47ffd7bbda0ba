"""LLaMA-Factory's own verdict on a resolved config: what its parser (``get_train_args`` for train; run by
lf/commands.py ``command_verdict``) needs around it, and what it answers (``Verdict``).

``get_train_args`` is where LLaMA-Factory and transformers refuse a config (cross-field rules,
precision, missing packages, output directory): running it here means ``check`` cannot say
"ready to launch" for a config the trainer then refuses. It loads no model or tokenizer and
writes nothing. Its log lines are silenced for the call and the environment is restored after.

When the check plans for a machine that is not this one (``--gpu``, ``--arch``, a recorded
snapshot), the few answers that depend on the device are the target's, from recorded facts
(docs/rocm-facts.md#f4, #f6): bf16 is reported as supported on every ROCm GPU, tf32 on none, and
DeepSpeed's world is not built here (its JSON needs DeepSpeed and torchrun on the target).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .patching import Patches


@dataclass(frozen=True)
class DeviceAnswers:
    """What the target machine's torch would answer where the parser asks the device."""

    label: str
    bf16: bool  # torch.cuda.is_bf16_supported(): True on every ROCm build (docs/rocm-facts.md#f4)
    tf32: bool  # transformers' is_torch_tf32_available(): False without CUDA (docs/rocm-facts.md#f6)

    def describe(self) -> str:
        return (
            f"LLaMA-Factory's parser ran with {self.label}'s answers: bf16 supported: {self.bf16}, "
            f"tf32: {self.tf32}; a deepspeed: JSON is checked on the target (it needs DeepSpeed and torchrun)"
        )


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    message: str = ""  # LLaMA-Factory's (or transformers') own words when refused
    error_type: str = ""
    parsed: Any = None  # what the parser returned when it accepted (get_train_args' dataclasses): parsed once


def device_answers_patched(answers: DeviceAnswers | None) -> Patches:
    """Swap in the target's answers where transformers and LLaMA-Factory ask the device (for the ``with``)."""
    patches = Patches()
    if answers is None:
        return patches
    import transformers.training_args as hf_args
    from llamafactory.hparams import parser as lf_parser

    swaps = [
        (hf_args, "is_torch_bf16_gpu_available", lambda: answers.bf16),
        (lf_parser, "is_torch_bf16_gpu_available", lambda: answers.bf16),
        (hf_args, "is_torch_tf32_available", lambda: answers.tf32),
        # Packages are the target's to install (PACKAGE_REQUIRED says which): LLaMA-Factory's own version
        # check (extras/misc.py check_version, called by _check_extra_dependencies) answers for the target,
        # and every cross-field rule of the parser still runs on the whole config.
        (lf_parser, "check_version", lambda *args, **kwargs: None),
    ]
    for module, name, answer in swaps:
        if hasattr(module, name):
            patches.setattr(module, name, answer)
    return patches
