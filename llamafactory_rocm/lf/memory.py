"""Will it fit? Peak device memory of a LLaMA-Factory run, estimated from the model's shapes.

Parameters are counted on the model LLaMA-Factory builds on the meta device (``count_model``), or from
``config.json`` where none was built. The estimate is a breakdown: frozen/base weights, trainable state
(weights + gradients + optimizer), activations, logits, and a fixed workspace. The per-op activation and
logit bytes follow what a real LoRA step allocates per family, measured on CPU at reduced size
(tests/test_memory_oracle.py, docs/memory.md#activations); docs/memory.md compares the estimate with
torchtune's and LLaMA-Factory's published figures and with H200 runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from .schema import field_default, within_64_bits

GIB = 2**30
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Activations: the bytes autograd saves for backward per token, counted per op from transformers' decoder
# layers under LoRA on all linears and bf16 autocast (tests/test_memory_oracle.py measures them, docs/memory.md
# lists them): an RMSNorm keeps its fp32 input (4 x width), each LoRA'd linear its own bf16 copy of its input
# (peft casts the input to the adapter's fp32 and autocast back), attention q, k, v and its output (bf16), the
# MLP gate, up, act(gate) and down's input. The loss keeps the fp32 log-softmax and, in backward, its gradient
# and the gradient of the fp32 upcast: 12 bytes per logit at its peak.
LOGIT_BYTES = 12
RM_LOGIT_BYTES = 10  # rm's forward: bf16 logits, trl's fp32 upcast, the unused language loss's (logit_bytes)
# sft/pt's loss runs inside the model's forward (transformers' ForCausalLMLoss): the bf16 logits (2), their fp32
# upcast (4) and cross_entropy's log-softmax (4) are held when the forward returns
FORWARD_LOGIT_BYTES = 10
LOSS_CHUNKS = 8  # fused/chunked cross-entropy keeps one fp32 chunk of the logits
WORKSPACE_GIB = 0.25  # BLAS workspaces and allocator slack


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    # what decides the activations beyond the dense Llama shape (defaults: a dense Llama)
    norms_per_layer: int = 2  # Gemma 2/3: 4 (pre/post attention and MLP)
    qk_norm: bool = False  # Qwen3, Gemma 3, Llama 4: RMSNorm (fp32 input kept) over q and k
    experts: int = 0  # routed experts of an MoE layer (0: dense)
    experts_per_token: int = 0  # experts each token passes (Llama 4 runs every expert on every token)
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # the always-on shared expert's width (DeepSeek, Llama 4)
    moe_layers: int = 0  # decoder layers whose MLP is the MoE one (the rest dense of ``dense_intermediate``)
    dense_intermediate: int = 0  # a dense layer's MLP width where it differs from ``intermediate`` (Llama 4)
    q_lora_rank: int = 0  # DeepSeek's MLA: the low-rank q and kv projections
    kv_lora_rank: int = 0
    v_head_dim: int = 0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ModelShape:
        if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
            cfg = cfg["text_config"]  # a vision-language config: the decoder's shape is nested
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        model_type = str(cfg.get("model_type", ""))
        layers = int(cfg["num_hidden_layers"])
        experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
        mla = bool(cfg.get("kv_lora_rank"))
        head_dim = int(cfg.get("qk_nope_head_dim", 0) + cfg.get("qk_rope_head_dim", 0)) if mla else 0
        return cls(
            norms_per_layer=4 if model_type.startswith(("gemma2", "gemma3")) else 2,
            qk_norm=model_type.startswith(("qwen3", "gemma3")) or bool(cfg.get("use_qk_norm")),
            experts=experts,
            # transformers' Llama4TextMoe multiplies every expert's output by its router score: all run
            experts_per_token=experts if model_type.startswith("llama4") else int(cfg.get("num_experts_per_tok") or 0),
            expert_intermediate=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0),
            shared_intermediate=_shared_width(cfg, model_type),
            moe_layers=_moe_layers(cfg, layers) if experts else 0,
            dense_intermediate=int(cfg.get("intermediate_size_mlp") or 0),
            q_lora_rank=int(cfg.get("q_lora_rank") or 0),
            kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
            v_head_dim=int(cfg.get("v_head_dim") or 0),
            hidden=hidden,
            intermediate=int(cfg["intermediate_size"]),
            layers=layers,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim or int(cfg.get("head_dim") or hidden // heads),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each decoder-layer linear: what LoRA targets."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_width),
            "k_proj": (h, self.kv_width),
            "v_proj": (h, self.kv_width),
            "o_proj": (self.q_width, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_linear_params(self) -> int:
        return sum(a * b for a, b in self.linear_shapes().values())

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def norm_params(self, qk_norm: bool) -> int:
        per_layer = 2 * self.hidden + (2 * self.head_dim if qk_norm else 0)
        return self.layers * per_layer + self.hidden

    def parameter_count(self, qk_norm: bool = False) -> int:
        return self.layers * self.layer_linear_params() + self.embedding_params() + self.norm_params(qk_norm)

    def layer_activation_bytes(self, moe: bool, lora_rank: int = 0) -> int:
        """Bytes autograd saves per token in one decoder layer's forward (bf16 autocast; ``lora_rank`` > 0:
        LoRA on every linear, each then keeping its own copy of its input). Per op, as listed in
        docs/memory.md#activations; tests/test_memory_oracle.py measures them."""
        h, r = self.hidden, lora_rank
        lora = r > 0
        if self.kv_lora_rank:  # MLA: q_a/q_b, kv_a/kv_b, o; q, k, v and the output all heads x qk width
            q = self.heads * self.head_dim
            attention = (
                4 * h * self.norms_per_layer
                + 4 * (self.q_lora_rank + self.kv_lora_rank)  # q_a and kv_a layernorms
                + 2 * (2 * h + self.q_lora_rank + self.kv_lora_rank + self.heads * self.v_head_dim)
                + 8 * q
                + 2 * r * 5
            )
        else:
            q, kv = self.q_width, self.kv_width
            attention = (
                4 * h * self.norms_per_layer
                + (4 * (q + kv) if self.qk_norm else 0)
                + 2 * (3 * h if lora else h)
                + 2 * q  # q, k, v input (one copy each with LoRA); o input
                + 4 * (q + kv)  # q, k, v, attention output
                + 2 * r * 4
            )

        def mlp(width: int) -> int:  # gate/up input (a copy each with LoRA), gate, up, act(gate), down input
            return (4 * h if lora else 2 * h) + 8 * width + 2 * r * 3

        if not moe:
            return attention + mlp(self.dense_intermediate or self.intermediate)
        routed = self.experts_per_token * (2 * h + 6 * self.expert_intermediate + 12)  # gathered input, gate_up, act
        router = 4 * self.experts + 8 * self.experts_per_token  # fp32 router logits, top-k indices
        shared = mlp(self.shared_intermediate) if self.shared_intermediate else 0
        return attention + router + routed + shared

    def layer_backward_bytes(self, moe: bool) -> int:
        """The gradient one layer's MLP backward holds per token beyond its saved set: the bf16 gradient of
        gate and up (2 x width elements) of every expert the token passed, measured as a recomputed layer's
        extra (tests/test_memory_oracle.py, Llama 4's all-expert layer)."""
        if moe:
            return 4 * self.experts_per_token * self.expert_intermediate + 4 * self.shared_intermediate
        return 4 * (self.dense_intermediate or self.intermediate)


def _shared_width(cfg: Mapping[str, Any], model_type: str) -> int:
    if model_type.startswith("llama4"):
        return int(cfg.get("intermediate_size") or 0)  # Llama4TextMoe.shared_expert: a Llama4TextMLP
    if cfg.get("n_shared_experts"):
        return int(cfg["n_shared_experts"]) * int(cfg.get("moe_intermediate_size") or 0)
    return int(cfg.get("shared_expert_intermediate_size") or 0)


def _moe_layers(cfg: Mapping[str, Any], layers: int) -> int:
    """Decoder layers with the MoE MLP, as transformers' models choose them."""
    if isinstance(cfg.get("moe_layers"), list):  # Llama 4
        return sum(1 for i in cfg["moe_layers"] if i < layers)
    if "first_k_dense_replace" in cfg:  # DeepSeek-V3
        return max(0, layers - int(cfg["first_k_dense_replace"]))
    if "interleave_moe_layer_step" in cfg:
        step = int(cfg["interleave_moe_layer_step"]) or 1
        return sum(1 for i in range(layers) if (i + 1) % step == 0)
    only_dense = set(cfg.get("mlp_only_layers") or [])  # Qwen2/3-MoE
    step = int(cfg.get("decoder_sparse_step") or 1)
    return sum(1 for i in range(layers) if i not in only_dense and (i + 1) % step == 0)


def shape_and_count(cfg: Mapping[str, Any]) -> tuple[ModelShape, int]:
    shape = ModelShape.from_config(cfg)
    return shape, shape.parameter_count(qk_norm=cfg.get("model_type") == "qwen3")


@lru_cache(maxsize=1)
def shipped_model_files() -> dict[str, tuple[str, dict[str, Any]]]:
    """hub id (lower case) -> (the file's name, its config), from the small JSON files in llamafactory_rocm/models/."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for entry in resources.files("llamafactory_rocm.models").iterdir():
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text("utf-8"))
            for hub_id in data["hub_ids"]:
                found[hub_id.lower()] = (entry.name, data["config"])
    return found


@lru_cache(maxsize=1)
def shipped_models() -> dict[str, dict[str, Any]]:
    """hub id -> config, from the small JSON files in llamafactory_rocm/models/."""
    return {hub_id: config for hub_id, (_, config) in shipped_model_files().items()}


def model_config_for(name_or_path: str, cache_dir: str | None = None) -> dict[str, Any] | None:
    """The model's config as transformers reads it (``AutoConfig.from_pretrained(..., local_files_only=True)``:
    a local folder or the Hugging Face cache, never the network), else a shipped config for a known hub
    id, else None."""
    if not name_or_path:
        return None
    try:
        from transformers import AutoConfig

        found = AutoConfig.from_pretrained(name_or_path, local_files_only=True, cache_dir=cache_dir).to_dict()
    except Exception:  # not local, not cached, or unreadable: transformers says why at launch
        found = None
    if found is not None:
        return found
    if (Path(name_or_path) / "config.json").exists():  # a local config transformers cannot read: no estimate
        return None
    return shipped_models().get(name_or_path.lower())


# What reading shapes from a config or a model's config.json raises when a value is not a number (cutoff_len:
# abc), a key is missing or a count is zero: no estimate then; LLaMA-Factory's own parser says what is wrong.
UNESTIMABLE = (ValueError, TypeError, KeyError, OverflowError, ZeroDivisionError)


# LLaMA-Factory loads the base model with ``init_kwargs["torch_dtype"] = "auto"`` (0.9.5
# ``model/loader.py`` ``load_model``), so the weights stay in the checkpoint's own dtype (config.json's
# ``torch_dtype``, ``dtype`` in transformers 5) whatever bf16/fp16 say: those set the compute dtype, and only
# trainable parameters are cast (``model/adapter.py`` ``init_adapter``). tests/test_memory.py pins the line.
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def checkpoint_weight_bytes(model_cfg: Mapping[str, Any] | None) -> int:
    """Bytes per parameter of the weights as ``from_pretrained(torch_dtype="auto")`` loads them. A config.json
    without a dtype makes transformers read it from the weights, which are not read here: half precision,
    what released checkpoints ship, is assumed."""
    named = (model_cfg or {}).get("torch_dtype") or (model_cfg or {}).get("dtype") or ""
    return _DTYPE_BYTES.get(str(named).removeprefix("torch."), 2)


@dataclass(frozen=True)
class TrainingShape:
    """The parts of a LLaMA-Factory config that decide memory. The class defaults serve the calibration
    tests; ``from_config`` fills what a config leaves out from LLaMA-Factory's own field defaults."""

    method: str = "lora"  # lora | freeze | full
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = LINEAR_NAMES
    quantization_bit: int | None = None
    batch: int = 8  # transformers' per_device_train_batch_size default
    cutoff_len: int = 2048  # LLaMA-Factory's default
    gradient_checkpointing: bool = True  # LLaMA-Factory enables it unless disable_gradient_checkpointing
    fused_loss: bool = False  # enable_liger_kernel (or a chunked loss): logits never fully materialised
    optimizer_bytes: int = 8  # AdamW: two fp32 states per trainable parameter
    weight_bytes: int = 2  # the checkpoint's dtype (checkpoint_weight_bytes): bf16/fp16 weights
    freeze_layers: int = 2
    zero_stage: int = 0  # DeepSpeed ZeRO stage (FSDP full shard counts as 3)
    world_size: int = 1
    stage: str = "sft"  # dpo and rm train on chosen + rejected; dpo and kto compute the logits themselves
    pref_loss: str = "sigmoid"  # dpo: orpo and simpo use no reference
    double_quantization: bool = True  # bitsandbytes' compress_statistics (LLaMA-Factory's default)
    # gradient_accumulation_steps > 1: the gradients of the first micro-batches are held through the next forward
    accumulation: int = 1

    @classmethod
    def from_config(cls, config: Mapping[str, Any], world_size: int = 1, weight_bytes: int = 2) -> TrainingShape:
        """``weight_bytes``: the checkpoint's, ``checkpoint_weight_bytes(model config)``."""

        def get(key: str) -> Any:
            return config[key] if key in config else field_default(key)

        def whole(key: str) -> int:
            """The key's whole number; a fraction or one beyond 64 bits is refused by check (VALUE_INVALID,
            lf/schema.py): no estimate is made of it (1e30 sequences a step would be 1e27 GiB)."""
            value = get(key)
            number = int(value)
            if (number != value and not isinstance(value, str)) or not within_64_bits(number):
                raise ValueError(f"{key}: {value!r} is not a whole number within 64 bits")
            return number

        targets = str(get("lora_target"))
        names = LINEAR_NAMES if targets == "all" else tuple(t.strip() for t in targets.split(",") if t.strip())
        optim = str(get("optim")).lower()
        bits = get("quantization_bit")
        return cls(
            method=str(get("finetuning_type")),
            lora_rank=whole("lora_rank"),
            lora_targets=names,
            quantization_bit=int(bits) if bits not in (None, "", "null") else None,
            batch=whole("per_device_train_batch_size"),
            cutoff_len=whole("cutoff_len"),
            gradient_checkpointing=not bool(get("disable_gradient_checkpointing")),
            fused_loss=bool(get("enable_liger_kernel")),
            optimizer_bytes=2 if "8bit" in optim else 0 if optim == "sgd" else 8,
            weight_bytes=weight_bytes,
            freeze_layers=abs(whole("freeze_trainable_layers")),
            zero_stage=zero_stage_of(config),
            world_size=max(1, world_size),
            stage=str(get("stage")),
            pref_loss=str(get("pref_loss")),
            double_quantization=bool(get("double_quantization")),
            accumulation=max(1, whole("gradient_accumulation_steps") if get("gradient_accumulation_steps") else 1),
        )

    @property
    def sequences(self) -> int:
        """Sequences in one forward on one device (``sequences_per_forward``)."""
        return sequences_per_forward(self.stage, self.batch)

    @property
    def reference_forward(self) -> bool:
        """A no-grad forward beside the policy's: dpo's reference (the policy with its adapter disabled under
        LoRA, else the ref model) where ``use_ref_model`` (hparams/finetuning_args.py __post_init__:
        ``self.use_ref_model = self.stage == "dpo" and self.pref_loss not in ["orpo", "simpo"]``); kto always
        (its KL batch, then the reference). tests/test_memory_workflow.py pins the rule on the installed line."""
        return self.stage == "kto" or (self.stage == "dpo" and self.pref_loss not in ("orpo", "simpo"))


def sequences_per_forward(stage: str, per_device_batch: int) -> int:
    """rm and dpo batches hold each example's chosen and rejected sequences: LLaMA-Factory's
    PairwiseDataCollatorWithPadding (data/collator.py, used by train/rm/workflow.py and train/dpo/workflow.py)
    concatenates both, so a step runs 2 x per_device_train_batch_size sequences."""
    return per_device_batch * (2 if stage in ("rm", "dpo") else 1)


def zero_stage_of(config: Mapping[str, Any]) -> int:
    ds = config.get("deepspeed")
    if ds:
        try:
            return int(json.loads(Path(str(ds)).read_text())["zero_optimization"]["stage"])
        except (OSError, ValueError, KeyError, TypeError):
            name = Path(str(ds)).name
            return 3 if "z3" in name else 2 if "z2" in name else 0
    fsdp = str(config.get("fsdp", "") or "")
    return 3 if "full_shard" in fsdp else 0


@dataclass(frozen=True)
class Estimate:
    parameters: int
    trainable_parameters: int
    weights_gib: float
    trainable_state_gib: float
    activations_gib: float
    logits_gib: float
    workspace_gib: float
    activations_traced: bool = False  # from the built model's traced forward, else the per-family formula
    gradients_gib: float = 0.0  # part of the trainable state: what the backward writes (.grad)
    forward_logits_gib: float = 0.0  # the logits' bytes held when the forward returns (FORWARD_LOGIT_BYTES)
    weight_copies_gib: float = 0.0  # autocast's bf16 copies of fp32 trainable weights, held through the forward
    accumulating: bool = False  # gradient_accumulation_steps > 1: gradients held through the next forward

    def _held(self) -> dict[str, list[tuple[str, float]]]:
        """What one step holds beyond the weights and the optimizer's state, term by term, at each moment that can
        be its peak (transformers' Trainer: forward, loss backward, optimizer step, ``zero_grad(set_to_none=True)``;
        its default optimizer, adamw_torch_fused in transformers 5, makes no copy of its state):

        - forward end: the activations, the logits the forward's own loss holds and autocast's weight copies;
        - loss backward: the activations and the logits' peak (the copies are freed when the forward returns);
        - optimizer step: the gradients, every activation and logit freed.

        The gradients exist only from the backward on, except while accumulating, when the earlier micro-batches'
        gradients are held through each forward. Measured on real CPU steps: tests/test_memory_terms.py."""
        held = [("gradients", self.gradients_gib)] if self.accumulating else []
        return {
            "forward end": [("activations", self.activations_gib), ("logits", self.forward_logits_gib),
                            ("bf16 weight copies", self.weight_copies_gib), *held],
            "loss backward": [("activations", self.activations_gib), ("logits", self.logits_gib), *held],
            "optimizer step": [("gradients", self.gradients_gib)],
        }  # fmt: skip

    @property
    def moments(self) -> dict[str, float]:
        """GiB each moment holds beyond the weights and the optimizer's state (``_held``)."""
        return {moment: sum(gib for _, gib in terms) for moment, terms in self._held().items()}

    @property
    def peak_moment(self) -> str:
        moments = self.moments
        return max(moments, key=lambda name: moments[name])

    @property
    def optimizer_state_gib(self) -> float:
        """The trainable state held through the whole step: the optimizer's state (and fp32 master copies)."""
        return self.trainable_state_gib - self.gradients_gib

    @property
    def total_gib(self) -> float:
        step = self.moments[self.peak_moment]
        return self.weights_gib + self.optimizer_state_gib + step + self.workspace_gib

    def breakdown(self) -> str:
        """The total's terms, GiB, naming the moment of the step's peak and what is held then."""
        moment = self.peak_moment
        terms = self._held()[moment]
        held = " + ".join(f"{name} {gib:.1f}" for name, gib in terms if gib or name != "bf16 weight copies")
        return (
            f"weights {self.weights_gib:.1f} + optimizer state {self.optimizer_state_gib:.1f} + the step at its "
            f"{moment} {self.moments[moment]:.1f} ({held}) + workspace {self.workspace_gib:.2f}"
        )

    def as_dict(self) -> dict[str, float | int | str]:
        return {**asdict(self), "peak_moment": self.peak_moment, "total_gib": round(self.total_gib, 2)}


def _built_weights_and_state(built: ModelMemory, train: TrainingShape) -> tuple[float, int, float, float, float]:
    """(weight bytes, trainable parameters, gradient + optimizer bytes, gradient bytes, autocast's weight copies)
    of the built model, with the weights of the models the workflow builds beside it (``built.others``: all
    frozen, each at its own bits)."""
    weights = stored_weight_bytes(built, train.quantization_bit, train.double_quantization)
    weights += sum(stored_weight_bytes(o.memory, o.quantization_bit, train.double_quantization) for o in built.others)
    per = built.optimizer_bytes_per_parameter
    optimizer = built.trainable_parameters * (train.optimizer_bytes if per is None else per)
    gradients = built.gradient_bytes
    return weights, built.trainable_parameters, gradients + optimizer, gradients, built.cast_copy_bytes


def bnb_linear_bytes(parameters: int, rows: int, bits: int, double_quant: bool = True) -> float:
    """Bytes bitsandbytes stores for ``parameters`` weights of nn.Linear modules with ``rows`` output rows in
    all, quantized on the fly (LLaMA-Factory's ``BitsAndBytesConfig``, model/model_utils/quantization.py).
    4-bit (``Linear4bit``/``Params4bit``, blocksize 64): ``functional.quantize_4bit`` packs two values a byte
    (``(n + 1) // 2``) and keeps one fp32 absmax per block of 64; with ``compress_statistics`` (double
    quantization, LLaMA-Factory's ``double_quantization: true`` default) those are stored as uint8 by
    ``quantize_blockwise(absmax, blocksize=256)``, with one fp32 absmax per 256 of them. 8-bit
    (``Linear8bitLt``/``Int8Params``, LLM.int8): int8 weights and one fp32 scale per output row (``SCB``)."""
    if bits == 4:
        per_block = 1 + 4 / 256 if double_quant else 4
        return parameters * (0.5 + per_block / 64)
    return parameters * bits / 8 + 4 * rows


def stored_weight_bytes(memory: ModelMemory, bits: int | None, double_quant: bool = True) -> float:
    """The bytes ``memory``'s parameters take on the device: as counted (the meta model is never quantized:
    loader.py's ``from_config`` takes no quantization_config), with the frozen nn.Linear weights that
    bitsandbytes replaces at ``bits`` where given. Everything else stays in its dtype: norms, embeddings, the
    output embedding, routers, and MoE experts transformers stores as fused 3-D parameters (Llama 4, Qwen3-MoE,
    Mixtral in transformers 5), which ``replace_with_bnb_linear`` does not touch."""
    if not bits:
        return float(memory.weight_bytes)
    quantized = bnb_linear_bytes(memory.frozen_linear_parameters, memory.frozen_linear_rows, bits, double_quant)
    return memory.weight_bytes - memory.frozen_linear_bytes + quantized


def _formula_weights_and_state(
    shape: ModelShape, parameters: int, train: TrainingShape
) -> tuple[float, int, float, float, float]:
    """(weight bytes, trainable parameters, trainable state bytes, gradient bytes, autocast's weight copies)
    from a dense Llama's shapes: trainable parameters in fp32 (LLaMA-Factory upcasts them), each with an fp32
    gradient, and a bf16 copy of each trainable linear weight (all of them but the input embedding's)."""
    linear_total = shape.layers * shape.layer_linear_params()
    other = parameters - linear_total
    if train.quantization_bit:  # QLoRA: decoder linears quantised (bitsandbytes' storage), the rest bf16
        rows = shape.layers * sum(out for _, out in shape.linear_shapes().values())
        weights = bnb_linear_bytes(linear_total, rows, train.quantization_bit, train.double_quantization) + other * 2
    else:
        weights = parameters * train.weight_bytes
    if train.method == "lora":
        trainable = lora_parameters(shape, train.lora_rank, train.lora_targets)
        per_param = 4 + 4 + train.optimizer_bytes  # LLaMA-Factory upcasts trainable params to fp32
    elif train.method == "freeze":
        trainable = train.freeze_layers * (shape.layer_linear_params() + 2 * shape.hidden)
        per_param = 4 + 4 + train.optimizer_bytes
    else:  # full: bf16 weights are in `weights`; fp32 grads/master/optimizer in LLaMA-Factory's "18x"
        trainable = parameters
        per_param = 18 - train.weight_bytes
    linear = trainable - (shape.vocab * shape.hidden if train.method == "full" else 0)
    return weights, trainable, trainable * per_param, trainable * 4.0, linear * 2.0


def lora_parameters(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    linears = shape.linear_shapes()
    per_layer = sum(rank * (linears[t][0] + linears[t][1]) for t in targets if t in linears)
    return shape.layers * per_layer


def estimate(shape: ModelShape, parameters: int, train: TrainingShape, built: ModelMemory | None = None) -> Estimate:
    """``built``: the parameters of the model LLaMA-Factory built (the dry run's count); where given, weights
    and trainable state are counted from it and ``parameters`` is not used; the formula below serves
    where the model could not be built (planning without its files)."""
    if built is not None:
        weights, trainable, state, gradients, copies = _built_weights_and_state(built, train)
        parameters = built.parameters
    else:
        weights, trainable, state, gradients, copies = _formula_weights_and_state(shape, parameters, train)
    if train.zero_stage >= 3:
        weights /= train.world_size
    if train.zero_stage >= 2 or (train.zero_stage == 1 and train.method != "lora"):
        state /= train.world_size
        gradients /= train.world_size
    traced = built.activations if built is not None else None
    activations, logits = activation_and_logit_bytes(shape, train, traced)
    forward_logits = logits * forward_logit_bytes(train) / logit_bytes(train)
    return Estimate(
        parameters=parameters,
        trainable_parameters=trainable,
        weights_gib=weights / GIB,
        trainable_state_gib=state / GIB,
        activations_gib=activations / GIB,
        logits_gib=logits / GIB,
        workspace_gib=WORKSPACE_GIB,
        activations_traced=built is not None and built.activations is not None,
        gradients_gib=gradients / GIB,
        forward_logits_gib=forward_logits / GIB,
        weight_copies_gib=copies / GIB,
        accumulating=train.accumulation > 1,
    )


def activation_and_logit_bytes(
    shape: ModelShape, train: TrainingShape, traced: ActivationTrace | None = None
) -> tuple[float, float]:
    """(activations, logits) at the step's peak, per device. The loss's peak (the logits) comes at the start of
    backward, when every layer's saved activations are still held; with gradient checkpointing those are
    only each layer's bf16 input, and one layer's full set (and its MLP's gradients) exists only while that
    layer is recomputed, after the logits are freed: the activations are then the checkpoints plus what that
    layer needs beyond the logits' bytes. ``traced``: the saved bytes of the built model's forward (per token,
    scaled to this shape's tokens); else the per-family formula below."""
    tokens = train.sequences * train.cutoff_len
    per_logit = logit_bytes(train)
    if traced is not None:
        return tokens * _traced_per_token(traced, shape, train, per_logit), tokens * traced.vocab * per_logit
    rank = train.lora_rank if train.method == "lora" else 0
    moe = min(shape.moe_layers, shape.layers)
    kinds = ([shape.layer_activation_bytes(True, rank)] if moe else []) + (
        [shape.layer_activation_bytes(False, rank)] if moe < shape.layers else []
    )
    recomputed = max(
        shape.layer_activation_bytes(is_moe, rank) + shape.layer_backward_bytes(is_moe)
        for is_moe in ([True] if moe else []) + ([False] if moe < shape.layers else [])
    )
    logits = shape.vocab * per_logit
    final_norm = 4 * shape.hidden  # the final RMSNorm's fp32 input
    if train.gradient_checkpointing:  # each layer's bf16 input kept; one layer recomputed at a time
        per_token = shape.layers * 2 * shape.hidden + final_norm + max(0.0, recomputed - logits)
    else:
        dense = shape.layers - moe
        per_token = moe * kinds[0] + dense * kinds[-1] + final_norm
    return tokens * per_token, tokens * logits


def _traced_per_token(traced: ActivationTrace, shape: ModelShape, train: TrainingShape, per_logit: float) -> float:
    """Activation bytes per token from a trace: every layer's saved set, or with gradient checkpointing every
    layer's inputs plus the largest recomputed layer (its saved set and its MLP's gradients) beyond the
    logits it outlives (``per_logit``: ``logit_bytes``)."""
    per = 1 / traced.tokens
    around = (traced.outside + traced.head) * per
    if not train.gradient_checkpointing:
        return sum(traced.layer_saved) * per + around
    moe = traced.moe_layers or (False,) * len(traced.layer_saved)
    recomputed = max(
        saved * per + shape.layer_backward_bytes(routed) for saved, routed in zip(traced.layer_saved, moe, strict=True)
    )
    logits = traced.vocab * per_logit
    # LLaMA-Factory checkpoints a layer only where it has a trainable parameter (model/model_utils/checkpointing.py
    # custom_gradient_checkpointing_func: else ``func(*args)``): a frozen layer before the first trainable one
    # (freeze's default, the last layers trained) is on no gradient's path and keeps nothing, its input included;
    # the trace saw it save nothing (tests/test_memory_terms.py, freeze)
    kept = sum(given for given, saved in zip(traced.layer_inputs, traced.layer_saved, strict=True) if saved)
    return kept * per + around + max(0.0, recomputed - logits)


def logit_bytes(train: TrainingShape) -> float:
    """Bytes per logit at the step's peak, as measured on LLaMA-Factory's own trainers (tests/test_memory_stages.py,
    docs/memory.md#stages). sft and pt: the loss's backward (LOGIT_BYTES), or one chunk of a fused loss.

    dpo and kto compute the logits themselves, without labels (train/dpo/trainer.py concatenated_forward:
    ``labels = batch.pop("labels")``, then ``model(**batch).logits.to(torch.float32)``, and trainer_utils.py
    get_batch_logps' ``logits[:, :-1, :]`` then ``.log_softmax(-1)``): the logits are materialized whatever
    enable_liger_kernel says, and the policy's fp32 logits and their log-softmax (8 bytes) are held while a
    no-grad forward of as many tokens makes its own: dpo's reference (compute_reference_log_probs), kto's KL
    batch and reference (train/kto/trainer.py, ``with torch.no_grad(): ... prefix="kl_"``). That forward holds
    its fp32 logits and their log-softmax (8), and, where its batch has more than one sequence, the contiguous
    copy log_softmax makes of the ``[:, :-1, :]`` slice (4: torch's softmax kernels start with
    ``input_.contiguous()``, SoftMax.cpp and cuda/SoftMax.cu ``host_softmax``, which ROCm builds too). kto also
    keeps ``target_logits[kto_tags]`` and ``[~kto_tags]``, a copy (4). So dpo with a reference 20, kto 24 (20 at
    batch 1), at least the 12 of the backward.

    rm: trl's value head model returns the base model's logits upcast (``lm_logits.float()``, 4) while the
    base model's output, with the bf16 logits (2), is still held, and the base model has computed a language
    loss on the labels the pairwise collator passes (transformers' ForCausalLMLoss ``logits.float()``, 4):
    10 bytes. The reward loss reads the values only, so no logit is in backward."""
    if train.stage == "rm":
        return RM_LOGIT_BYTES
    if train.stage not in ("dpo", "kto"):
        return 4 / LOSS_CHUNKS if train.fused_loss else LOGIT_BYTES
    held = 8 + (4 if train.stage == "kto" else 0)
    if train.reference_forward:
        held += 8 + (4 if train.sequences > 1 else 0)
    return max(LOGIT_BYTES, held)


def forward_logit_bytes(train: TrainingShape) -> float:
    """Bytes per logit held when the model's forward returns. sft and pt: the loss is computed inside it
    (FORWARD_LOGIT_BYTES), or one chunk of a fused loss; rm: trl's value head upcasts inside its forward
    (RM_LOGIT_BYTES); dpo and kto upcast and take the log-softmax after the forward (``logit_bytes``), so only
    the bf16 logits (2) are held then."""
    if train.stage in ("dpo", "kto"):
        return 2
    return logit_bytes(train) if train.stage == "rm" or train.fused_loss else FORWARD_LOGIT_BYTES


def estimate_config(config: Mapping[str, Any], world_size: int = 1) -> Estimate | None:
    """Estimate for a LLaMA-Factory config, or None when the model's shapes are unknown offline."""
    cache_dir = config.get("cache_dir")
    model_cfg = model_config_for(str(config.get("model_name_or_path", "")), str(cache_dir) if cache_dir else None)
    if model_cfg is None:
        return None
    try:
        shape, parameters = shape_and_count(model_cfg)
        train = TrainingShape.from_config(config, world_size, checkpoint_weight_bytes(model_cfg))
    except UNESTIMABLE:
        return None
    return estimate(shape, parameters, train)


def largest_fitting_batch(
    shape: ModelShape,
    parameters: int,
    config: Mapping[str, Any],
    budget_gib: float,
    world_size: int = 1,
    weight_bytes: int = 2,
    built: ModelMemory | None = None,
) -> int | None:
    """The largest per_device_train_batch_size whose estimate fits ``budget_gib`` (None if even 1 does not)."""
    start = int(config.get("per_device_train_batch_size", field_default("per_device_train_batch_size")))

    def fits(batch: int) -> bool:
        train = TrainingShape.from_config({**config, "per_device_train_batch_size": batch}, world_size, weight_bytes)
        return estimate(shape, parameters, train, built).total_gib <= budget_gib

    return largest_that_fits(fits, start)


def largest_that_fits(fits: Callable[[int], bool], high: int) -> int | None:
    """The largest n in [1, high] with ``fits(n)``, for a ``fits`` that holds up to some n and not beyond (memory
    grows with the batch): a bisection, so a batch of 1e30 is ~100 estimates, never a scan of 1e30 of them."""
    if high < 1 or not fits(1):
        return None
    low = 1  # fits(low); the answer is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


# -- the model LLaMA-Factory builds --------------------------------------------------------------------
@dataclass(frozen=True)
class ModelMemory:
    """What the parameters of the model LLaMA-Factory builds (``load_model`` + ``init_adapter``, on the meta
    device in the dry run) take: counted on the module itself, in the dtype each parameter has there, so
    every expert, vision tower, projector, value head and adapter is in, tied weights once."""

    parameters: int
    trainable_parameters: int
    frozen_bytes: int
    trainable_bytes: int
    # frozen parameters of torch.nn.Linear modules other than the output embedding: what bitsandbytes
    # quantizes for QLoRA (transformers' replace_with_bnb_linear swaps nn.Linear; lm_head is kept)
    frozen_linear_parameters: int = 0
    frozen_linear_bytes: int = 0
    frozen_linear_rows: int = 0  # their out_features summed: LLM.int8 keeps one fp32 scale a row
    by_dtype: tuple[tuple[str, int], ...] = ()  # (dtype, bytes), largest first
    # optimizer state bytes per trainable element, measured on the optimizer class the trainer builds
    # (lf/dry_trainer.py trainer_setup); None where it could not be built here
    optimizer_bytes_per_parameter: float | None = None
    optimizer: str | None = None
    # bytes of the bf16 copies autocast makes of the trainable fp32 weights the forward multiplies by (torch's
    # autocast caches a cast of a leaf that requires grad until its context exits: accelerate wraps the model's
    # forward, so they are held at the forward's end); 0 where the trainable weights are not fp32
    cast_copy_bytes: int = 0
    # the models the workflow builds beside this one (dpo/kto's reference, ppo's reference and reward),
    # counted on the meta models LLaMA-Factory's create_ref_model / create_reward_model built
    others: tuple[OtherModel, ...] = ()
    # the forward traced on fake tensors (lf/dry_activations.py); None where it could not run (the per-family
    # formula serves then)
    activations: ActivationTrace | None = None

    @property
    def weight_bytes(self) -> int:
        return self.frozen_bytes + self.trainable_bytes

    @property
    def gradient_bytes(self) -> int:
        return self.trainable_bytes  # autograd keeps each .grad in its parameter's dtype


@dataclass(frozen=True)
class ActivationTrace:
    """What autograd saved for backward in one forward of the model LLaMA-Factory built, run on fake tensors at
    the config's batch and ``cutoff_len`` (lf/dry_activations.py): bytes per region, each storage once. The
    estimate scales them per token; the logits' peak is ``logit_bytes``' (the stage's loss, not a saved set)."""

    tokens: int  # tokens of the traced forward: batch x cutoff_len (x 2 for chosen + rejected)
    layer_saved: tuple[int, ...]  # per checkpointed decoder layer, in call order: its whole saved set
    layer_inputs: tuple[int, ...]  # per layer: the tensors it was called with, new ones only (what a checkpoint keeps)
    outside: int  # saved outside the layers and before the output embedding (embeddings, final norm)
    head: int  # saved from the output embedding on (its input), without labels: no loss was traced
    vocab: int  # the output embedding's rows: the logits per token
    moe_layers: tuple[bool, ...] = ()  # per layer: whether it routed tokens to experts (its backward holds theirs)


@dataclass(frozen=True)
class OtherModel:
    """A model the workflow holds beside the policy, frozen (``load_model(..., is_trainable=False)``)."""

    role: str  # "reference" | "reward"
    memory: ModelMemory
    quantization_bit: int | None = None  # the model_args.quantization_bit its load_model was given


def count_model(model: Any) -> ModelMemory:
    """Count ``model``'s parameters (a torch module, meta tensors or real) by dtype, frozen and trainable."""
    import torch

    output = None
    try:
        output = model.get_output_embeddings()
    except Exception:  # a wrapper without it (trl's value head keeps it on pretrained_model)
        inner = getattr(model, "pretrained_model", None)
        output = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    # what transformers' replace_with_bnb_linear swaps: ``type(module) is nn.Linear`` (a subclass such as
    # Llama 4's router is kept), never the output embedding (quantizers/base.py get_keys_to_not_convert)
    linear_weights: dict[int, int] = {}
    kept = {id(output.weight)} if output is not None and hasattr(output, "weight") else set()
    head = getattr(model, "v_head", None)  # trl's value head is added after loading: never quantized
    kept |= {id(p) for p in head.parameters()} if isinstance(head, torch.nn.Module) else set()
    for module in model.modules():
        if type(module) is torch.nn.Linear and module is not output and id(module.weight) not in kept:
            linear_weights[id(module.weight)] = module.out_features
    # autocast's lower-precision ops (linear, matmul, bmm, conv) cast their fp32 weights; an embedding lookup does
    # not (torch/csrc/autograd/autocast_mode.cpp's lists), unless that weight is also the output embedding (tied)
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - kept
    seen: set[int] = set()
    cast_copies = 0
    parameters = trainable = frozen_bytes = trainable_bytes = frozen_linear = frozen_linear_bytes = rows = 0
    by_dtype: dict[str, int] = {}
    for param in model.parameters():  # parameters() yields a tied tensor once; the id set keeps it so
        if id(param) in seen:
            continue
        seen.add(id(param))
        n, size = param.numel(), param.numel() * param.element_size()
        parameters += n
        dtype = str(param.dtype).removeprefix("torch.")
        by_dtype[dtype] = by_dtype.get(dtype, 0) + size
        if param.requires_grad:
            trainable += n
            trainable_bytes += size
            if param.dtype == torch.float32 and param.dim() >= 2 and id(param) not in lookups:
                cast_copies += 2 * n
        else:
            frozen_bytes += size
            if id(param) in linear_weights:
                frozen_linear += n
                frozen_linear_bytes += size
                rows += linear_weights[id(param)]
    return ModelMemory(
        parameters=parameters,
        trainable_parameters=trainable,
        frozen_bytes=frozen_bytes,
        trainable_bytes=trainable_bytes,
        frozen_linear_parameters=frozen_linear,
        frozen_linear_bytes=frozen_linear_bytes,
        frozen_linear_rows=rows,
        by_dtype=tuple(sorted(by_dtype.items(), key=lambda kv: -kv[1])),
        cast_copy_bytes=cast_copies,
    )


def optimizer_state_bytes(optimizer_cls: Any, kwargs: Mapping[str, Any]) -> float | None:
    """Bytes of state per trainable fp32 element that ``optimizer_cls(params, **kwargs)`` keeps after a step,
    measured on a stand-in parameter (torch builds the state on the first step). None where it cannot run
    here (a GPU-only optimizer, one that needs its package)."""
    import torch

    elements = 4096
    param = torch.nn.Parameter(torch.zeros(64, elements // 64))
    param.grad = torch.full_like(param, 1e-3)
    try:
        optimizer = optimizer_cls([param], **kwargs)
        optimizer.step()
    except Exception:  # any refusal is the dry run's to report; here it only means "not measured"
        return None
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.numel() > 1:  # `step` counters are scalars
                total += value.numel() * value.element_size()
    return total / elements
