"""The training dry run's activation step (lf/dry_run.py): one forward of the model LLaMA-Factory built, at the
config's batch and ``cutoff_len``, counting the bytes autograd saves for backward (docs/memory.md#traced).

The built model's parameters and buffers (meta tensors) are swapped, for the trace only, for torch's
FakeTensors on the CPU device (``torch._subclasses.fake_tensor``: shape, dtype and device, no storage), so
nothing is allocated whatever the size, and CPU autocast applies as the trainer's bf16/fp16 autocast does on
the GPU (accelerate wraps the forward in ``torch.autocast`` where ``bf16``/``fp16`` is set). The forward runs
the model's own code (LoRA, attention, MoE dispatch as transformers implements it) under
``torch.autograd.graph.saved_tensors_hooks``, which is handed every tensor autograd keeps for backward; each
storage is counted once, parameters and buffers never. Gradient checkpointing is switched off for the trace so
that each decoder layer's whole set is seen; a checkpointed run keeps each layer's inputs, recorded at the
layer's call, and recomputes one layer at a time (memory.activation_and_logit_bytes).

Attention runs the kernel torch picks for the CPU. Its fused kernels need one head width for q, k and v, as
ROCm's do (torch ``sdp_utils.cpp`` ``check_head_dim_size_flash<caller_is_meff=true>`` checks the
memory-efficient kernel there), so DeepSeek's MLA (q/k 192, v 128) takes the math path, with its fp32
softmax of every head, on both; where a GPU has no fused kernel at all (``SDPA_MATH_FALLBACK``) the trace is
low by that matrix (docs/memory.md#traced).

Where the forward cannot run on fake tensors (an op whose output shape depends on the data, such as eager MoE
dispatch's ``nonzero``, or a model that needs images), there is no trace and the estimate takes the
per-family formula; the dry run says so (DRY_RUN_NOT_CHECKED).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import one_line
from .dry_parts import Launch
from .memory import ActivationTrace, sequences_per_forward
from .patching import Patches

# Run on the built model before the trace, each handed the launch: the forecast's FLOP count
# (forecast/flops.py count_step_flops, added only while a check asks for the forecast)
STEP_HOOKS: list[Callable[[Launch], None]] = []


def trace_step(launch: Launch) -> None:
    """The dry run's step: trace the built policy and attach the result to ``run.built``."""
    import dataclasses

    run = launch.run
    if launch.model is None or run.built is None:
        return
    for hook in STEP_HOOKS:
        hook(launch)
    vision = trainable_vision_parameters(launch.model)
    if vision:
        run.skip(
            "the vision tower's activations",
            f"freeze_vision_tower is false, so its {vision:,} trainable parameters keep activations for each image, "
            "and the trace runs the text alone: the estimate leaves them out",
            case="estimate",
        )
    args = launch.training_args
    sequences = sequences_per_forward(str(run.stage), int(args.per_device_train_batch_size))
    compute = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
    try:
        found = trace_activations(launch.model, sequences, int(launch.data_args.cutoff_len), compute)
    except Exception as exc:  # the formula serves; the reason is said, not raised
        why = f"{one_line(exc)}; the estimate uses the per-family formula"
        run.skip("the activations on the built model", why, case="estimate")
        return
    run.built = dataclasses.replace(run.built, activations=found)


def trainable_vision_parameters(model: Any) -> int:
    """Trainable parameters in the vision tower, by LLaMA-Factory's own names for it
    (model_utils/visual.py ``COMPOSITE_MODELS[model_type].vision_model_keys``, matched in a parameter's name as
    its ``get_forbidden_modules`` freezing does). With ``freeze_vision_tower`` (the default) there are none:
    the tower's input needs no grad, so autograd saves nothing there, and text-only tracing misses nothing."""
    from llamafactory.model.model_utils.visual import COMPOSITE_MODELS

    composite = COMPOSITE_MODELS.get(getattr(model.config, "model_type", None))
    if composite is None:
        return 0
    keys = composite.vision_model_keys
    return sum(p.numel() for name, p in model.named_parameters() if p.requires_grad and any(k in name for k in keys))


def trace_activations(
    model: Any, sequences: int, length: int, compute_dtype: str | None, *, every_layer: bool = False
) -> ActivationTrace:
    """Bytes autograd saves in ``model``'s forward of ``sequences`` x ``length`` tokens (no labels: the loss's
    peak is counted apart), per checkpointed layer and outside them. Raises what the forward raises.

    Layers alike (``_layer_signature``) save alike: unless ``every_layer``, the forward runs the first two of
    each kind only (the second sees what the first already saved for all of them: the rotary tables, a
    mask) and the rest of the kind take the second's figures; tests/test_dry_activations.py checks that
    against the whole forward for every shipped shape."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    output = _output_embedding(model)
    with (
        _faked(model, mode) as owned,
        _checkpointing_off(model) as all_layers,
        _rows_unpacked(),
        _two_of_each_kind(model, all_layers, every_layer) as (layers, stands_for),
    ):
        recorder = _Recorder(owned, stands_for)
        autocast = (
            torch.autocast("cpu", dtype=getattr(torch, compute_dtype)) if compute_dtype else contextlib.nullcontext()
        )
        with contextlib.ExitStack() as hooks:
            for handle in recorder.hook(model, layers, output):
                hooks.callback(handle.remove)
            with mode, autocast, torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda x: x):
                ids = torch.zeros(sequences, length, dtype=torch.long)
                extra = {"token_type_ids": torch.zeros_like(ids)} if _needs_token_types(model) else {}
                model(input_ids=ids, use_cache=False, **extra)
    vocab = int(output.weight.shape[0]) if output is not None else 0
    return recorder.result(sequences * length, vocab)


class _Recorder:
    """Saved bytes by region: a checkpointed layer's index, "outside" the layers, or the "head" (the output
    embedding on)."""

    def __init__(self, owned: set[int], stands_for: list[list[int]]) -> None:
        self.owned = owned  # the storages of parameters and buffers: not activations
        self.stands_for = stands_for  # per traced layer: the layers of the model whose figures it gives
        self.region: Any = "outside"
        self.seen: dict[str, set[int]] = {"saved": set(), "inputs": set()}
        self.keep: list[Any] = []  # saved tensors stay referenced, so no storage key is reused mid-trace
        self.saved: dict[Any, int] = {}
        self.inputs: dict[int, int] = {}
        self.moe: set[int] = set()
        self.order: list[int] = []

    def _new_bytes(self, tensor: Any, kind: str = "saved") -> int:
        key = tensor.untyped_storage()._cdata
        if key in self.owned or key in self.seen[kind]:
            return 0
        self.seen[kind].add(key)
        self.keep.append(tensor)
        return int(tensor.untyped_storage().nbytes())

    def pack(self, tensor: Any) -> Any:
        self.saved[self.region] = self.saved.get(self.region, 0) + self._new_bytes(tensor)
        return tensor

    def hook(self, model: Any, layers: list[Any], output: Any) -> list[Any]:
        import torch

        handles = []
        for index, layer in enumerate(layers):

            def enter(_module: Any, args: Any, kwargs: Any, index: int = index) -> None:
                self.region = index
                self.order.append(index)
                tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                tensors += [t for a in (*args, *kwargs.values()) if isinstance(a, tuple) for t in a
                            if isinstance(t, torch.Tensor)]  # fmt: skip
                self.inputs[index] = sum(self._new_bytes(t, "inputs") for t in tensors)

            def leave(*_args: Any) -> None:
                self.region = "outside"

            handles.append(layer.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(layer.register_forward_hook(leave))
        for module in model.modules():
            name = type(module).__name__.lower()
            # a layer that routes tokens: transformers' Qwen3MoeExperts, MixtralSparseMoeBlock, Llama4TextMoe, ...
            if "experts" in name or name.endswith(("moe", "moeblock")):

                def routed(*_args: Any) -> None:
                    if isinstance(self.region, int):
                        self.moe.add(self.region)

                handles.append(module.register_forward_pre_hook(routed))
        if output is not None:

            def head(*_args: Any) -> None:
                self.region = "head"

            handles.append(output.register_forward_pre_hook(head))
        return handles

    def result(self, tokens: int, vocab: int) -> ActivationTrace:
        ran = list(dict.fromkeys(self.order))
        if not ran:
            raise RuntimeError("no decoder layer ran in the traced forward")
        # each model layer that ran, in order, with the traced layer that gives its figures
        given = sorted((layer, traced) for traced in ran for layer in self.stands_for[traced])
        return ActivationTrace(
            tokens=tokens,
            layer_saved=tuple(self.saved.get(traced, 0) for _, traced in given),
            layer_inputs=tuple(self.inputs.get(traced, 0) for _, traced in given),
            outside=self.saved.get("outside", 0),
            head=self.saved.get("head", 0),
            vocab=vocab,
            moe_layers=tuple(traced in self.moe for _, traced in given),
        )


@contextlib.contextmanager
def _faked(model: Any, mode: Any) -> Iterator[set[int]]:
    """Swap every parameter and buffer for a FakeTensor on the CPU of its shape and dtype (a tied weight stays
    one tensor); put the originals back after. Yields the fakes' storage keys."""
    import torch

    made: dict[int, Any] = {}
    with Patches() as patches:
        with mode:
            for module in model.modules():
                for kind in ("_parameters", "_buffers"):
                    table = getattr(module, kind)
                    for name, tensor in list(table.items()):
                        if tensor is None:
                            continue
                        if id(tensor) not in made:
                            fake = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
                            if kind == "_parameters":
                                fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
                            made[id(tensor)] = fake
                        patches.setitem(table, name, made[id(tensor)])
        yield {fake.untyped_storage()._cdata for fake in made.values()}


@contextlib.contextmanager
def _checkpointing_off(model: Any) -> Iterator[list[Any]]:
    """The layers gradient checkpointing wraps (transformers' ``GradientCheckpointingLayer``), their flag off
    for the trace and restored after."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    with Patches() as patches:
        for layer in layers:
            patches.setattr(layer, "gradient_checkpointing", False)
        yield layers


@contextlib.contextmanager
def _two_of_each_kind(model: Any, layers: list[Any], every_layer: bool) -> Iterator[tuple[list[Any], list[list[int]]]]:
    """The layers to run, and for each the indices (into ``layers``) of the layers it stands for. Each
    ModuleList of checkpointed layers (the decoder's; a vision tower's, which text ids do not run) is cut to the
    first two layers of each kind for the trace (transformers' decoders loop over ``self.layers[:
    config.num_hidden_layers]``), and its owner's per-layer ``config.layer_types`` alike, since some decoders
    pick a layer's mask by its position; both are put back after."""
    import torch

    position = {id(layer): i for i, layer in enumerate(layers)}
    lists = [] if every_layer else _layer_lists(model, position)
    if not lists:
        yield layers, [[i] for i in range(len(layers))]
        return
    run: list[Any] = []
    stands_for: list[list[int]] = []
    with Patches() as patches:
        for parent, name in lists:
            full = parent._modules[name]
            config = getattr(parent, "config", None)
            types = getattr(config, "layer_types", None)
            types = list(types) if isinstance(types, list | tuple) and len(types) == len(full) else None
            kinds: dict[Any, list[int]] = {}
            for index, layer in enumerate(full):
                kinds.setdefault(_layer_signature(layer, types[index] if types else None), []).append(index)
            kept: dict[int, list[int]] = {}
            for members in kinds.values():
                kept[members[0]] = [members[0]]
                if len(members) > 1:
                    kept[members[1]] = members[1:]
            order = sorted(kept)
            patches.setitem(parent._modules, name, torch.nn.ModuleList([full[i] for i in order]))
            if types is not None:
                patches.setitem(config.__dict__, "layer_types", [types[i] for i in order])
            run += [full[i] for i in order]
            stands_for += [[position[id(full[j])] for j in kept[i]] for i in order]
        yield run, stands_for


def _layer_lists(model: Any, position: dict[int, int]) -> list[tuple[Any, str]]:
    """(parent module, attribute name) of each ModuleList made of checkpointed layers only, where together
    they hold every one of them; else none (nothing is cut)."""
    import torch

    found, covered = [], 0
    for parent in model.modules():
        for name, child in parent._modules.items():
            if isinstance(child, torch.nn.ModuleList) and len(child) and all(id(m) in position for m in child):
                found.append((parent, name))
                covered += len(child)
    return found if covered == len(position) else []


def _layer_signature(layer: Any, layer_type: str | None) -> tuple[Any, ...]:
    """What decides a layer's saved bytes: its modules (classes and simple settings, e.g. Llama 4's
    ``use_rope``, Gemma 3's ``is_sliding``), its parameters' shapes, dtypes and trainability, its type in
    ``config.layer_types``. Its position (``layer_idx``) is left out: it only picks a cache slot."""
    settings = []
    for path, module in layer.named_modules():
        simple = tuple(
            sorted(
                (key, value)
                for key, value in vars(module).items()
                if isinstance(value, bool | int | float | str | type(None)) and "idx" not in key and key != "training"
            )
        )
        settings.append((path, type(module).__name__, simple))
    params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in layer.named_parameters())
    return (layer_type, tuple(settings), params)


@contextlib.contextmanager
def _rows_unpacked() -> Iterator[None]:
    """Each row one sequence, as LLaMA-Factory's collators give them without ``packing``: transformers looks for
    packed rows in the position ids (masking_utils ``find_packed_sequence_indices``, a data-dependent check that
    on fake tensors cannot conclude, so it builds a batch x L x L mask the real forward never makes); told
    here what the real check finds for one sequence per row."""
    try:
        from transformers import masking_utils
    except ImportError:  # no such check in this transformers
        yield
        return
    if getattr(masking_utils, "find_packed_sequence_indices", None) is None:
        yield
        return
    with Patches() as patches:
        patches.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
        yield


def _output_embedding(model: Any) -> Any:
    for candidate in (model, getattr(model, "pretrained_model", None)):  # trl's value head wraps the model
        try:
            found = candidate.get_output_embeddings() if candidate is not None else None
        except Exception:  # a wrapper without it
            found = None
        if found is not None:
            return found
    return None


def _needs_token_types(model: Any) -> bool:
    """Gemma 3's multimodal forward requires token_type_ids in training (its collator adds them, 0 for text)."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", "") == "gemma3"
