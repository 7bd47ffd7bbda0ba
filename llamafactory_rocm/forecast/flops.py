"""FLOPs of one micro-batch's forward and backward on the model LLaMA-Factory built, counted by torch's
``torch.utils.flop_counter.FlopCounterMode`` (the matmuls, convolutions and attention kernels torch has a
formula for), on FakeTensors as the activation trace runs it (lf/dry_activations.py): nothing is allocated.

The backward is the model's own: autograd computes weight gradients only for the parameters that require
them (LoRA's adapters, freeze's unfrozen layers, every weight in full), so LoRA vs full vs freeze is what
autograd does, not a factor. The model's own gradient checkpointing runs (transformers' ``GradientCheckpointingLayer``,
torch's checkpoint): its backward recomputes each checkpointed layer whose output needs a gradient, and that
recompute is told apart by those layers' forward FLOPs. A decoder of alike layers runs cut to 2 and 3 layers,
the difference standing for each further layer (FlopCounterMode's per-module attribution of the backward is not
exact enough to scale from the activation trace's two of each kind); other models run every layer.
tests/test_forecast_flops.py checks the count against a real CPU step and the paper's.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    price: float | None = None  # USD per GPU-hour, the user's (--price)
    cards: bool = False  # --cards: every catalogue card and the faster settings (forecast/cards.py)
    measure: int | None = None  # --measure N: N steps timed on this machine (forecast/measure.py)
    rate_from: tuple[str, Any] | None = None  # --rate-from FILE: (FILE, the measure it holds: measure.py fit_in)


_REQUEST: contextvars.ContextVar[Request | None] = contextvars.ContextVar("forecast_request", default=None)


@contextlib.contextmanager
def requested(
    price: float | None = None,
    *,
    cards: bool = False,
    measure: int | None = None,
    rate_from: tuple[str, Any] | None = None,
) -> Iterator[None]:
    """The forecast is asked for (check --forecast, --cards, --measure): the dry run counts FLOPs and the check
    makes the forecast (forecast/run.py ``forecast_for``)."""
    from ..lf.dry_activations import STEP_HOOKS
    from ..lf.dry_data import PACKED_ROWS_CAP
    from ..lf.model_files import STANDIN

    token = _REQUEST.set(Request(price=price, cards=cards, measure=measure, rate_from=rate_from))
    packed = PACKED_ROWS_CAP.set(FORECAST_PACKED_ROWS)
    standin = STANDIN.set(True)  # a model not reachable here: its bundled shape and a stand-in tokenizer
    STEP_HOOKS.append(count_step_flops)
    try:
        yield
    finally:
        STEP_HOOKS.remove(count_step_flops)
        STANDIN.reset(standin)
        PACKED_ROWS_CAP.reset(packed)
        _REQUEST.reset(token)


# Packed rows are counted, not scaled, on datasets of up to this many rows each (lf/dry_data.py
# PACKED_ROWS_CAP): the steps of a packed run on them are exact; about 0.35 s more a check here at most.
FORECAST_PACKED_ROWS = 1024


def request() -> Request | None:
    return _REQUEST.get()


def count_step_flops(launch: Any) -> None:
    """A step hook of the dry run's activation step: the FLOPs of one micro-batch at the trace's shape (the
    per-device batch x cutoff_len) on the built model; a model whose forward cannot run fake gets none."""
    from ..lf.memory import sequences_per_forward

    args = launch.training_args
    sequences = sequences_per_forward(str(launch.run.stage), int(args.per_device_train_batch_size))
    compute = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
    length = int(launch.data_args.cutoff_len)
    try:
        launch.run.forecast["step_flops"] = step_flops(launch.model, sequences, length, compute)
        forwards: list[tuple[str, StepFlops]] = []  # the trainer's forwards without gradients, beside its step
        if getattr(launch.finetuning_args, "use_ref_model", False) or launch.run.stage == "kto":
            # the reference log-probs of the batch (train/dpo/trainer.py and train/kto/trainer.py
            # compute_reference_log_probs): the policy with its adapter disabled, or the copy create_ref_model
            # loads for full and freeze (a ref_model of its own is counted as the base); dpo's only where
            # use_ref_model (not orpo, simpo), kto's always
            reference = step_flops(launch.model, sequences, length, compute, forward_only=True)
            forwards.append(("target", reference))
        if launch.run.stage == "kto":
            # kto also runs its KL batch through the policy (concatenated_forward, adapter on) and the reference;
            # without an adapter the two forwards are the same count
            policy = (
                step_flops(launch.model, sequences, length, compute, forward_only=True, adapter_off=False)
                if hasattr(launch.model, "disable_adapter")
                else reference
            )
            forwards += [("kl", policy), ("kl", reference)]
        launch.run.forecast["forwards"] = tuple(forwards)
    except Exception as exc:  # the rest of the forecast stands; the reason is said
        launch.run.forecast["step_flops_error"] = f"{type(exc).__name__}: {exc}"[:300]


@dataclass(frozen=True)
class StepFlops:
    forward: int
    backward: int
    recompute: int  # gradient checkpointing's second forward of its layers
    sequences: int
    length: int
    # of the total, the attention kernels' (forward, backward, recompute): torch's formulas for them
    # (sdpa_flop_count, flex attention's) grow with the square of the length, everything else with the tokens
    attention: int = 0
    recompute_attention: int = 0  # of the recompute, the attention kernels'

    def without_recompute(self) -> StepFlops:
        """The step with gradient checkpointing's recompute taken out."""
        return dataclasses.replace(self, recompute=0, attention=self.attention - self.recompute_attention,
                                   recompute_attention=0)  # fmt: skip

    @property
    def total(self) -> int:
        return self.forward + self.backward + self.recompute

    def of(self, tokens: float, squares: float) -> float:
        """The FLOPs of micro-batches of ``tokens`` tokens in all (sequences x padded length) whose sequences'
        padded lengths squared sum to ``squares``: the count at ``sequences x length`` taken apart into its part
        per token and its attention's part per squared length."""
        return sum(self.parts(tokens, squares))

    def parts(self, tokens: float, squares: float) -> tuple[float, float]:
        """``of``'s two parts: (the FLOPs that grow with the tokens, the attention kernels' FLOPs)."""
        per_token = (self.total - self.attention) / (self.sequences * self.length)
        per_square = self.attention / (self.sequences * self.length * self.length)
        return per_token * tokens, per_square * squares

    def per_token(self, length: int) -> float:
        """FLOPs per token of sequences ``length`` long."""
        return self.of(length, length * length) / length

    def as_json(self) -> dict[str, Any]:
        return {
            "forward": self.forward,
            "backward": self.backward,
            "recompute": self.recompute,
            "total": self.total,
            "attention": self.attention,
            "shape": [self.sequences, self.length],
        }


def step_flops(
    model: Any,
    sequences: int,
    length: int,
    compute_dtype: str | None,
    *,
    every_layer: bool = False,
    fake: bool = False,
    forward_only: bool = False,
    adapter_off: bool = True,
) -> StepFlops:
    """Forward + backward FLOPs of ``sequences`` x ``length`` tokens on ``model`` (labels = ids: the loss
    and its logits are in the count, as in training), with the model's own gradient checkpointing (LLaMA-Factory's
    prepare_model_for_training turns it on unless disable_gradient_checkpointing).

    Where the checkpointed layers are one list of alike layers (dry_activations ``_layer_signature``: modules,
    settings, parameter shapes and trainability, layer type), the model runs cut to 2 and to 3 of them and the
    third's count stands for each layer after the second (the first may differ: its input may need no gradient);
    otherwise, or with ``every_layer``, every layer runs."""
    counting = _Counting(sequences, length, compute_dtype, fake, forward_only, forward_only and adapter_off)
    cut = None if every_layer else _alike_layers(model)
    if cut is None:
        return _counted(model, counting)
    two, three = (_counted_cut(model, cut, k, counting) for k in (2, 3))
    more = len(cut[2]) - 2
    return StepFlops(
        forward=two.forward + more * (three.forward - two.forward),
        backward=two.backward + more * (three.backward - two.backward),
        recompute=two.recompute + more * (three.recompute - two.recompute),
        sequences=sequences,
        length=length,
        attention=two.attention + more * (three.attention - two.attention),
        recompute_attention=two.recompute_attention + more * (three.recompute_attention - two.recompute_attention),
    )


def _alike_layers(model: Any) -> tuple[Any, str, Any] | None:
    """(parent, attribute, the ModuleList) where every checkpointed layer is in that one list, at least 4 of them,
    all alike and of one ``config.layer_types`` entry (if any); else None."""
    import torch
    from transformers.modeling_layers import GradientCheckpointingLayer

    from ..lf.dry_activations import _layer_signature

    layers = {id(m) for m in model.modules() if isinstance(m, GradientCheckpointingLayer)}
    for parent in model.modules():
        for name, child in parent._modules.items():
            if not isinstance(child, torch.nn.ModuleList) or not child or any(id(m) not in layers for m in child):
                continue
            types = getattr(getattr(parent, "config", None), "layer_types", None)
            if len(child) != len(layers) or len(child) < 4 or (types is not None and len(set(types)) > 1):
                return None
            first = _layer_signature(child[0], None)
            return (parent, name, child) if all(_layer_signature(m, None) == first for m in child) else None
    return None


@dataclass(frozen=True)
class _Counting:
    """One count's shape and way: ``sequences`` x ``length`` tokens, the autocast dtype, on FakeTensors
    (``fake``), forward only without gradients (``forward_only``) and without a peft model's adapter
    (``adapter_off``: a reference model's forward)."""

    sequences: int
    length: int
    compute_dtype: str | None
    fake: bool = False
    forward_only: bool = False
    adapter_off: bool = False


def _counted_cut(model: Any, cut: tuple[Any, str, Any], keep: int, counting: _Counting) -> StepFlops:
    """``_counted`` with the layer list cut to its first ``keep`` layers (and ``config.layer_types`` alike)."""
    import torch

    parent, name, full = cut
    config = getattr(parent, "config", None)
    types = getattr(config, "layer_types", None)
    parent._modules[name] = torch.nn.ModuleList(list(full)[:keep])
    if types is not None:
        config.layer_types = list(types)[:keep]
    try:
        return _counted(model, counting)
    finally:
        parent._modules[name] = full
        if types is not None:
            config.layer_types = types


def _counted(model: Any, counting: _Counting) -> StepFlops:
    """One forward + backward counted. A model whose every parameter is on the meta device (the dry run's)
    runs there: about 2.5x faster than FakeTensors (no fake dispatch or its cache keys; bench/bench_forecast.py),
    with the CPU's fused attention kernel called as the CPU picks it for these inputs (``_meta_attention``). A
    model it cannot run (a data-dependent op, e.g. an MoE router's) and a model with real weights run on
    FakeTensors as the activation trace does (``fake``). tests/test_forecast_flops.py: both counts equal."""
    shape = (counting.sequences, counting.length, counting.compute_dtype)
    if not counting.fake and all(p.device.type == "meta" for p in model.parameters()):
        try:
            return _count(model, *shape, "meta", counting.forward_only, counting.adapter_off)
        except Exception:  # the fake run below counts what meta tensors cannot run
            for parameter in model.parameters():
                parameter.grad = None
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..lf.dry_activations import _faked

    mode = FakeTensorMode()
    with _faked(model, mode), mode:
        return _count(model, *shape, "cpu", counting.forward_only, counting.adapter_off)


def _count(
    model: Any,
    sequences: int,
    length: int,
    compute_dtype: str | None,
    device: str,
    forward_only: bool = False,
    adapter_off: bool = False,
) -> StepFlops:
    """One forward + backward counted, or (``forward_only``) one forward without gradients, and (``adapter_off``)
    without a peft model's adapters, as a reference model's forward runs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers.modeling_layers import GradientCheckpointingLayer

    from ..lf.dry_activations import _needs_token_types, _rows_unpacked

    forward_counter = FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas())
    backward_counter = FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas())
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    names = {id(module): name for name, module in model.named_modules()}
    recomputed: list[str] = []  # checkpointed layers whose output needs a gradient: backward recomputes them

    def watch(module: Any, _args: Any, output: Any) -> None:
        first = output[0] if isinstance(output, tuple) else output
        if getattr(module, "gradient_checkpointing", False) and getattr(first, "requires_grad", False):
            recomputed.append(names[id(module)])

    handles = [layer.register_forward_hook(watch) for layer in layers]
    try:
        with _rows_unpacked(), _meta_attention() if device == "meta" else contextlib.nullcontext():
            # autocast's casts change no FLOP count; it applies to the (fake) CPU tensors, not to meta ones
            autocast = (
                torch.autocast("cpu", dtype=getattr(torch, compute_dtype))
                if compute_dtype and device == "cpu"
                else contextlib.nullcontext()
            )
            ids = torch.zeros(sequences, length, dtype=torch.long, device=device)
            extra = {"token_type_ids": torch.zeros_like(ids)} if _needs_token_types(model) else {}
            reference = _no_grad_forward(model, adapter_off) if forward_only else contextlib.nullcontext()
            with forward_counter, autocast, reference:  # the model's own checkpointing: its backward recomputes
                output = model(input_ids=ids, labels=ids, use_cache=False, **extra)
                # trl's value-head model (the rm stage) returns (lm_logits, loss, values), and LLaMA-Factory's
                # reward trainer (train/rm/trainer.py compute_loss) takes its loss from the values alone
                loss = output.loss if hasattr(output, "loss") else output[2].sum()
            with backward_counter:
                if loss.requires_grad and not forward_only:
                    loss.backward()
    finally:
        for handle in handles:
            handle.remove()
        if device == "meta":
            for parameter in model.parameters():
                parameter.grad = None  # the dry model is left as it was built
    # forward FLOPs are attributed to the module running (FlopCounterMode's module tracker)
    by_module, attention_by_module = _by_module(forward_counter), _by_module(forward_counter, _attention)
    recompute = sum(by_module.get(name, 0) for name in recomputed)
    backward = backward_counter.get_total_flops() - recompute
    attention = sum(
        flops
        for counter in (forward_counter, backward_counter)
        for op, flops in counter.get_flop_counts().get("Global", {}).items()
        if _attention(op)
    )
    return StepFlops(
        forward_counter.get_total_flops(),
        int(backward),
        int(recompute),
        sequences,
        length,
        attention=int(attention),
        recompute_attention=int(sum(attention_by_module.get(name, 0) for name in recomputed)),
    )


@contextlib.contextmanager
def _no_grad_forward(model: Any, adapter_off: bool) -> Iterator[None]:
    """No gradients, and (``adapter_off``) a peft model's adapters off (``PeftModel.disable_adapter``)."""
    import torch

    off = adapter_off and hasattr(model, "disable_adapter")
    with torch.no_grad(), model.disable_adapter() if off else contextlib.nullcontext():
        yield


def _attention(op: Any) -> bool:
    """An attention kernel: aten's scaled_dot_product ones (the CPU's included) and flex_attention."""
    return "attention" in str(op)


@contextlib.contextmanager
def _meta_attention() -> Any:
    """On meta tensors torch's ``scaled_dot_product_attention`` can pick no fused kernel and runs its math
    (two bmm forward, four backward); on the CPU's tensors it picks the fused CPU kernel where
    ``torch._fused_sdp_choice`` says so, and that kernel is what ``cpu_attention_formulas`` counts as the GPU's.
    Here the choice is asked of the CPU (on empty CPU tensors of the inputs' shapes, no data read) and, where it
    is that kernel, the kernel is called on the meta inputs (it has a meta implementation and a derivative)."""
    import torch
    from torch.nn import functional

    original = functional.scaled_dot_product_attention
    flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    def attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:  # fmt: skip
        if query.device.type == "meta" and attn_mask is None:
            on_cpu = [torch.empty(t.shape, dtype=t.dtype, device="cpu") for t in (query, key, value)]
            choice = torch._fused_sdp_choice(*on_cpu, None, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
            if choice == torch.nn.attention.SDPBackend.FLASH_ATTENTION.value:
                return flash_cpu(query, key, value, dropout_p, is_causal, scale=scale)[0]
        return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    functional.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def cpu_attention_formulas() -> dict[Any, Any]:
    """The fused attention kernel torch picks on the CPU has no FLOP formula in torch's registry; the GPU's
    fused kernels (flash, efficient, cudnn: the ones a ROCm or CUDA run takes) share torch's
    ``sdpa_flop``/``sdpa_backward_flop``, whose arguments the CPU kernel's schema begins with too."""
    import torch
    from torch.utils import flop_counter

    def forward(query: Any, key: Any, value: Any, *_args: Any, out_shape: Any = None, **_kwargs: Any) -> int:
        return flop_counter.sdpa_flop_count(query, key, value)

    def backward(grad: Any, query: Any, key: Any, value: Any, *_args: Any, out_shape: Any = None, **_kw: Any) -> int:
        return flop_counter.sdpa_backward_flop_count(grad, query, key, value)

    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
    }


def _by_module(counter: Any, ops_counted: Any = None) -> dict[str, int]:
    """FlopCounterMode's per-module totals (of the ops ``ops_counted`` accepts, else all), keyed by the dotted
    name after its root class's name."""
    return {
        name.partition(".")[2]: sum(flops for op, flops in ops.items() if ops_counted is None or ops_counted(op))
        for name, ops in counter.get_flop_counts().items()
    }
