"""The training dry run's tokenizer and model steps (lf/dry_run.py): LLaMA-Factory's ``load_tokenizer``,
``get_template_and_fix_tokenizer`` and ``load_model``, and the workflow's extra models.

The model is LLaMA-Factory's ``load_model`` itself, with its weight-loading call swapped for ``from_config``
(its own ``train_from_scratch`` branch) under torch's meta default device (lf/dry_load.py
``meta_load_model``): the config is patched, the model patched, and ``init_adapter`` run on meta tensors, so
module-name errors are LLaMA-Factory's or peft's own words (docs/llamafactory-launch.md#d5). Not run:
quantization (the meta model is not quantized; the memory estimate stores the nn.Linear weights bitsandbytes
would replace at quantization_bit, memory.stored_weight_bytes). Two refusals of ``load_model`` are recorded
and the same model still built, counted and traced: the package that quantizes missing here
(QUANTIZATION_PACKAGE_MISSING: an error on this machine, a warning naming the target's install line when
planning, check/run.py), and gpt-oss's forced hub attention kernel (ATTENTION_KERNEL_UNAVAILABLE). The
reference and reward models of dpo/kto/ppo are built as their workflows build them (lf/dry_load.py
``workflow_models``) and counted beside the policy (``ModelMemory.others``). A saved ``tokenized_path``'s
ids are checked against the built model's embedding.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from ..errors import one_line
from .causes import cause_of, free_folder
from .dry_parts import Launch, _meta_limitation
from .memory import OtherModel, count_model
from .patching import Patches
from .stages import adds_valuehead


def tokenizer_and_template(launch: Launch) -> None:
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.model import load_tokenizer

    try:
        launch.tokenizer_module = load_tokenizer(launch.model_args)
    except Exception as exc:
        launch.run.error(
            code="TOKENIZER_REFUSED",
            message=f"LLaMA-Factory's load_tokenizer failed: {one_line(exc)}",
            key="model_name_or_path",
        )
        return
    try:
        launch.template = get_template_and_fix_tokenizer(launch.tokenizer_module["tokenizer"], launch.data_args)
    except Exception as exc:
        cause = cause_of("TEMPLATE_REFUSED", f"{type(exc).__name__}: {one_line(exc)}", launch.config)
        launch.run.refused(
            code="TEMPLATE_REFUSED",
            message=f"LLaMA-Factory's get_template_and_fix_tokenizer refused: {one_line(exc)}",
            cause=cause,
            key="template",
        )


def build_model(launch: Launch) -> None:
    from llamafactory.model import load_model

    if launch.tokenizer_module is None:
        return
    from .dry_load import meta_load_model

    is_trainable = launch.training_args.do_train
    add_valuehead = adds_valuehead(launch.run.stage)  # run_rm / run_ppo: load_model(..., add_valuehead=True)
    # lf/dry_load.py meta_load_model: load_model with its from_config branch under torch's meta default
    # device (nn.Parameter(torch.zeros(...)) in MoE experts included: nothing is allocated); the rest of
    # load_model (patch_config, patch_model, init_adapter, the value head) runs as in the real run.
    missing: list[tuple[str, str]] = []
    kernel: list[str] = []
    try:
        with _quantization_packages_recorded(missing), _attention_kernel_recorded(kernel):
            launch.model = meta_load_model(load_model)(
                launch.tokenizer_module["tokenizer"],
                launch.model_args,
                launch.finetuning_args,
                is_trainable,
                add_valuehead,
            )
    except Exception as exc:
        text = one_line(exc)
        if _meta_limitation(exc):  # a step that needs real weights (e.g. PiSSA's SVD): not a verdict
            launch.run.skip("the model's adapter set-up", f"it needs real weights: {text}")
            return
        cause = cause_of("MODEL_MODULES_REFUSED", text, launch.config)
        launch.run.refused(
            code="MODEL_MODULES_REFUSED",
            message=f"LLaMA-Factory's load_model/init_adapter refused (model built on the meta device): {text}",
            cause=cause,
        )
        if isinstance(exc, ImportError) and launch.model_args.quantization_bit is not None:
            _count_without_quantization(launch, load_model, is_trainable, add_valuehead)
    for words in kernel:
        launch.run.error(
            code="ATTENTION_KERNEL_UNAVAILABLE",
            message=words,
            key="model_name_or_path",
            fix_with={"model_type": "gpt_oss"},
        )
    for requirement, words in missing:
        launch.run.error(
            code="QUANTIZATION_PACKAGE_MISSING",
            message=f"quantization_bit: {launch.model_args.quantization_bit} needs {requirement}: LLaMA-Factory's "
            f"configure_quantization (model/model_utils/quantization.py, check_version(..., mandatory=True)) "
            f"stops the load with: {words}",
            key="quantization_bit",
            new=requirement,
            fix_as="here",
            fix_with={"wanted": requirement},
        )
    if launch.model is not None:
        launch.run.built = count_model(launch.model)
    if launch.model is not None and launch.tokenized_max_id is not None:
        _check_tokenized_ids(launch)
    if launch.model is not None and launch.template is not None:
        _check_tokenizer_fits(launch)


@contextlib.contextmanager
def _quantization_packages_recorded(missing: list[tuple[str, str]]) -> Iterator[None]:
    """LLaMA-Factory's own version checks in ``configure_quantization`` (model/model_utils/quantization.py:
    ``check_version("bitsandbytes>=0.39.0", mandatory=True)``, hqq, eetq, ...) run as they are; one that
    fails is recorded in ``missing`` (requirement, LLaMA-Factory's words) and the load goes on, past the
    quantization config that package would have made (transformers' ``HqqConfig`` raises without hqq). That
    is sound on the meta device alone: loader.py's ``from_config`` takes no ``quantization_config``, so the
    model built is the one the package would quantize, and the memory estimate stores its nn.Linear weights
    at quantization_bit (memory.stored_weight_bytes). Where every check passes nothing changes."""
    from llamafactory.model import patcher
    from llamafactory.model.model_utils import quantization

    check_version, configure_quantization = quantization.check_version, patcher.configure_quantization

    def recorded(requirement: str, mandatory: bool = False) -> None:
        try:
            check_version(requirement, mandatory=mandatory)
        except ImportError as exc:
            missing.append((requirement, one_line(exc)))

    def configured(*args: Any, **kwargs: Any) -> None:
        before = len(missing)
        try:
            configure_quantization(*args, **kwargs)
        except Exception:
            if len(missing) == before:  # not for want of the package: LLaMA-Factory's refusal, said as such
                raise

    with Patches() as patches:
        patches.setattr(quantization, "check_version", recorded)
        patches.setattr(patcher, "configure_quantization", configured)
        yield


@contextlib.contextmanager
def _attention_kernel_recorded(refusals: list[str]) -> Iterator[None]:
    """LLaMA-Factory's ``configure_attn_implementation`` (model/model_utils/attention.py) sets a gpt_oss
    model's attention to the hub kernel ``kernels-community/vllm-flash-attn3`` (FlashAttention-3, a build for
    NVIDIA Hopper) through transformers' ``load_and_register_kernel``, before it reads ``flash_attn``: no key
    avoids it. Where that fails (transformers 5 has no ``load_and_register_kernel``; with a transformers that
    has it, the ``kernels`` package and a ROCm build of the kernel are missing) the refusal is recorded in
    LLaMA-Factory's and transformers' words with the line that does it, and the model is built with the
    attention transformers picks itself, so that it is still counted (the MXFP4 experts dequantized, as
    LLaMA-Factory's ``Mxfp4Config(dequantize=True)`` asks) and traced."""
    import inspect

    from llamafactory.model import patcher
    from llamafactory.model.model_utils import attention

    configure = patcher.configure_attn_implementation

    def recorded(config: Any, model_args: Any) -> None:
        try:
            configure(config, model_args)
        except Exception as exc:
            if getattr(config, "model_type", None) != "gpt_oss":  # attention.py's only hub-kernel branch
                raise
            lines, first = inspect.getsourcelines(attention.configure_attn_implementation)
            at = next((first + i for i, text in enumerate(lines) if "load_and_register_kernel" in text), first)
            refusals.append(
                f"LLaMA-Factory sets gpt-oss's attention to the hub kernel kernels-community/vllm-flash-attn3 "
                f"(FlashAttention-3, built for NVIDIA Hopper; no ROCm build) whatever flash_attn says, with "
                f"transformers' load_and_register_kernel (llamafactory/model/model_utils/attention.py:{at}, "
                f"configure_attn_implementation), and that fails: {one_line(exc)}"
            )

    with Patches() as patches:
        patches.setattr(patcher, "configure_attn_implementation", recorded)
        yield


def _count_without_quantization(launch: Launch, load_model: Any, is_trainable: bool, add_valuehead: bool) -> None:
    """The quantization package is missing here (model/model_utils/quantization.py ``check_version(
    "bitsandbytes>=0.39.0", mandatory=True)`` raises an ImportError; the error is reported above): the model
    it would quantize is the same meta model built without ``quantization_bit`` (the meta model is never
    quantized: loader.py's ``from_config`` takes no quantization_config), so that one is counted for the
    memory estimate, which stores its nn.Linear weights at quantization_bit. It is not handed to later steps."""
    from .dry_load import meta_load_model

    try:
        with Patches() as patches:
            patches.setattr(launch.model_args, "quantization_bit", None)
            model = meta_load_model(load_model)(
                launch.tokenizer_module["tokenizer"],
                launch.model_args,
                launch.finetuning_args,
                is_trainable,
                add_valuehead,
            )
    except Exception:  # refused for another reason too: that one shows once bitsandbytes is there
        return
    launch.run.built = count_model(model)


def build_workflow_models(launch: Launch) -> None:
    from .dry_load import workflow_models

    args = (launch.run.stage, launch.model_args, launch.finetuning_args, launch.training_args.do_train, launch.model)
    built = workflow_models(launch.run, *args)
    if built and launch.run.built is not None:  # frozen models beside the policy: their weights count too
        others = tuple(OtherModel(role, count_model(model), bits) for role, model, bits in built)
        launch.run.built = dataclasses.replace(launch.run.built, others=others)


def _check_tokenized_ids(launch: Launch) -> None:
    embeddings = _input_embeddings(launch.model)
    vocab = embeddings.num_embeddings if embeddings is not None else launch.tokenized_vocab
    if launch.tokenized_max_id >= vocab:
        # torch.nn.functional.embedding: an index >= num_embeddings raises "IndexError: index out of
        # range in self" on CPU and a device-side assert on a GPU, at the first forward (step 1).
        launch.run.error(
            code="TOKENIZED_DATA_MISMATCH",
            message=f"tokenized_path {launch.data_args.tokenized_path} holds token id "
            f"{launch.tokenized_max_id}, but the "
            f"model's embedding has {vocab} rows (ids 0-{vocab - 1}): a tokenized dataset from another "
            "tokenizer. The first forward fails in the embedding (index out of range).",
            key="tokenized_path",
            # a valid dataset of the model it was made for: kept, and this run tokenizes into a new folder
            fix_with={"new_path": free_folder(str(launch.data_args.tokenized_path))},
            remedy={"tokenized_path": free_folder(str(launch.data_args.tokenized_path))},
        )


def _check_tokenizer_fits(launch: Launch) -> None:
    """The tokens the template writes must have rows in the model's embedding. get_template_and_fix_tokenizer
    (and add_tokens/add_special_tokens) may add tokens to the tokenizer; LLaMA-Factory resizes the embedding to
    ``len(tokenizer)`` only with ``resize_vocab`` (model/patcher.py ``patch_model`` -> model/model_utils/
    embedding.py ``resize_embedding_layer``, which resizes when ``len(tokenizer) > current_embedding_size``;
    add_tokens and add_special_tokens set resize_vocab themselves, a template's tokens only warn). The model here
    is load_model's own, resized or not, so its rows are what the first forward meets. The ids checked are the
    ones LLaMA-Factory's own template writes for a one-turn exchange (``Template.encode_oneturn``), the eos the
    processors append and the pad id the collator pads with: an id at or above the rows fails in
    torch.nn.functional.embedding ("IndexError: index out of range in self"; a device-side assert on a GPU)."""
    embeddings = _input_embeddings(launch.model)
    tokenizer = launch.tokenizer_module["tokenizer"]
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is None or len(tokenizer) <= rows:  # resize_embedding_layer's own test: nothing past the rows
        return
    exchange = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi"}]
    try:
        prompt, response = launch.template.encode_oneturn(tokenizer, exchange)
    except Exception:  # a template that needs more than a plain exchange: its ids are not read here
        prompt, response = [], []
    written = {*prompt, *response, tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    beyond = sorted(i for i in written if i >= rows)
    if not beyond:
        return
    quantized = launch.model_args.quantization_bit is not None or bool(
        getattr(launch.model.config, "quantization_config", None)
    )
    tokens = ", ".join(str(t) for t in tokenizer.convert_ids_to_tokens(beyond))
    launch.run.error(
        code="TOKENIZER_BEYOND_EMBEDDING",
        message=f"template {launch.data_args.template} leaves the tokenizer {len(tokenizer)} tokens, but the model's "
        f"embedding has {rows} rows and resize_vocab is off: the template writes {tokens} (id "
        f"{', '.join(map(str, beyond))}), and the first forward fails in the embedding "
        "(IndexError: index out of range in self). LLaMA-Factory resizes the embedding only with resize_vocab "
        "(model/model_utils/embedding.py resize_embedding_layer).",
        key="resize_vocab" if not quantized else "template",
        fix_as="quantized" if quantized else "resize",
        fix_with={"template": launch.data_args.template},
    )


def _input_embeddings(model: Any) -> Any:
    try:
        return model.get_input_embeddings()
    except Exception:
        return None
