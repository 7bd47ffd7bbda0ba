"""The world a run spans: nodes x ranks per node (torchrun's variables, ``--nodes``/``--gpus-per-node``
when planning, or Ray's workers), the global batch it makes, and what RCCL and Ray need on ROCm.

LLaMA-Factory's launcher reads NNODES, NODE_RANK, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT (and
RDZV_ID, MIN_NNODES, MAX_NNODES for an elastic launch) and hands them to torchrun
(docs/rocm-facts.md#l14). Every node runs the same command, so this rule reads the same variables on
each (their list: machine/snapshot.py ``WORLD_ENV_VARS``). Facts: docs/rocm-facts.md#w1 (batch
arithmetic), #w2 (network interfaces), #w3 (MI300X environment), #w4 (Ray's visible devices on AMD),
#f10 (iommu=pt).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..findings import Finding, Level
from ..lf.commands import PLAN
from ..lf.work import optimizer_steps
from .base import Context, Step, env_enabled, lf_value, rule, unchanged
from .multi_gpu import iommu_pt_missing

LOOPBACK = ("127.", "localhost", "::1")


@dataclass(frozen=True)
class World:
    nodes: int
    per_node: int
    source: str  # where the numbers came from, said in the findings
    min_nodes: int | None = None  # elastic launch: the smallest world that can start

    @property
    def size(self) -> int:
        return self.nodes * self.per_node

    @property
    def smallest(self) -> int:
        """The world the memory estimate must fit: the fewest ranks shard the least."""
        return (self.min_nodes or self.nodes) * self.per_node


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None


def _invalid(name: str, value: str, why: str, case: str, **fix_with: Any) -> Finding:
    """WORLD_INVALID for ``name``; ``case`` names the registry's fix, ``fix_with`` fills it."""
    return Finding(
        code="WORLD_INVALID",
        key=name,
        old=value,
        message=f"{name}={value!r}: {why}",
        fix_as=case,
        fix_with=fix_with,
    )


def read_world(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> tuple[World, list[Finding]]:
    """The world from the environment, with a finding for each value torchrun cannot use."""
    problems: list[Finding] = []
    for name in ("NNODES", "NODE_RANK", "NPROC_PER_NODE", "MIN_NNODES", "MAX_NNODES"):
        raw = env.get(name)
        if raw is not None and (not raw.strip().isdigit() or (name != "NODE_RANK" and int(raw) < 1)):
            problems.append(
                _invalid(
                    name,
                    raw,
                    "not a whole number of at least 1 (0 for NODE_RANK).",
                    "not_a_number",
                    variable=name,
                )
            )
    if env_enabled(env, "USE_RAY"):
        workers = lf_value(config, "ray_num_workers", 1)
        count = int(workers) if str(workers).isdigit() else 1
        return World(nodes=1, per_node=max(1, count), source=f"USE_RAY=1, ray_num_workers {count}"), problems
    nodes = _int(env, "NNODES") or 1
    if not starts_torchrun(env, ctx):
        asked = [f"{name}={env[name]}" for name in ("NNODES", "NPROC_PER_NODE") if (_int(env, name) or 1) > 1]
        if asked:
            problems.append(
                Finding(
                    code="WORLD_NOT_LAUNCHED",
                    key="FORCE_TORCHRUN",
                    message=f"{' '.join(asked)}, but LLaMA-Factory's launcher starts torchrun only with "
                    f"FORCE_TORCHRUN=1 or more than one GPU visible ({len(ctx.snapshot.devices)} here): each node "
                    "would train alone, in one process, and none would wait for the others.",
                )
            )
        return World(nodes=1, per_node=1, source="one process (torchrun not started)"), problems
    # LLaMA-Factory's launcher: NPROC_PER_NODE, else every visible device (docs/rocm-facts.md#l14).
    per_node = _int(env, "NPROC_PER_NODE") or max(1, len(ctx.snapshot.devices))
    node_rank = _int(env, "NODE_RANK")
    if node_rank is not None and node_rank >= nodes:
        why = f"node ranks run from 0 to NNODES-1 = {nodes - 1}, so the rendezvous never completes."
        problems.append(_invalid("NODE_RANK", str(node_rank), why, "node_rank_too_high", last_rank=nodes - 1))
    low, high = _int(env, "MIN_NNODES"), _int(env, "MAX_NNODES")
    if low is not None and high is not None and low > high:
        problems.append(_invalid("MIN_NNODES", str(low), f"more than MAX_NNODES={high}.", "min_above_max"))
    source = "NNODES x NPROC_PER_NODE" if "NPROC_PER_NODE" in env else "NNODES x the GPUs visible here"
    elastic_low = low if env.get("RDZV_ID") and low is not None and high is not None and low <= high else None
    return World(nodes=nodes, per_node=per_node, source=source, min_nodes=elastic_low), problems


def starts_torchrun(env: Mapping[str, str], ctx: Context) -> bool:
    """Whether ``llamafactory-cli train`` starts torchrun: mirrors ``launcher.py`` on both lines (``if command ==
    "train" and (is_env_enabled("FORCE_TORCHRUN") or (get_device_count() > 1 and not use_ray() and not
    use_kt()))``), the switches that force it read from the installed launcher (lf/launcher_source.py: USE_MCA,
    and USE_MEGATRON_BRIDGE on main), pinned by tests/test_rules_world.py. Ray is read before this."""
    from ..lf.launcher_source import torchrun_switches

    if any(env_enabled(env, switch) for switch in torchrun_switches()):
        return True
    devices = len(ctx.snapshot.devices)
    if ctx.snapshot.source.startswith("planned"):  # one device stands for the target's kind, not its count
        per_node = _int(env, "NPROC_PER_NODE")  # --gpus-per-node
        if per_node is None:
            return not env_enabled(env, "USE_KT")
        devices = per_node
    return devices > 1 and not env_enabled(env, "USE_KT")


def world_size(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> int:
    """The fewest ranks the run can start with (what memory_fit shards ZeRO/FSDP state over)."""
    return read_world(config, env, ctx)[0].smallest


def _number(config: Mapping[str, Any], key: str, default: int) -> int | None:
    """The config's whole number for ``key``, LLaMA-Factory's default when absent (``default`` without it)."""
    value = lf_value(config, key, default)
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # "abc", inf: LLaMA-Factory's parser names it (VALUE_INVALID)
        return None


def deepspeed_json(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The DeepSpeed JSON the config names, or None when it cannot be read (packages/parser say why)."""
    path = config.get("deepspeed")
    if not path:
        return None
    try:
        found = json.loads(Path(str(path)).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def world_batch(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    world, problems = read_world(config, env, ctx)
    if problems:
        return unchanged(config, env, *problems)
    findings: list[Finding] = []
    per_device = _number(config, "per_device_train_batch_size", 8)
    accumulation = _number(config, "gradient_accumulation_steps", 1)
    if per_device is None or accumulation is None or per_device < 1 or accumulation < 1:
        # Not a batch LLaMA-Factory trains: its parser or the dry run's DataLoader refuses it in its own
        # words (BATCH_REFUSED, LLAMAFACTORY_REFUSED); no arithmetic on it here.
        return unchanged(config, env)
    global_batch = per_device * accumulation * world.size
    arithmetic = (
        f"per_device_train_batch_size {per_device} x gradient_accumulation_steps {accumulation} x world "
        f"{world.size} ({world.nodes} node{'s' if world.nodes > 1 else ''} x {world.per_node}) = {global_batch}"
    )
    findings += _deepspeed_batch(config, per_device, accumulation, world, arithmetic)
    if world.size < 2:
        return unchanged(config, env, *findings)
    cutoff = _number(config, "cutoff_len", 2048) or 0
    plan = f"Global batch: {arithmetic} sequences, up to {global_batch * cutoff:,} tokens per optimizer step"
    if world.min_nodes is not None:
        plan += f" (elastic: {per_device * accumulation * world.smallest} with {world.min_nodes} nodes)"
    train_rows = ctx.train_rows  # after LLaMA-Factory's own processing and val_size split (the dry run)
    if train_rows is not None:
        if train_rows < global_batch:
            findings.append(
                Finding(
                    code="GLOBAL_BATCH_OVER_DATASET",
                    # LLaMA-Factory trains it: each epoch is one step on repeated rows
                    old=global_batch,
                    new=train_rows,
                    message=f"The global batch is larger than the data: {arithmetic} sequences, but the dataset "
                    f"has {train_rows} training rows, so every epoch is one optimizer step on rows repeated to "
                    "fill the ranks.",
                    fix_with={"size": world.size, "train_rows": train_rows},
                )
            )
        else:
            # the trainer's arithmetic: batches are dealt to the ranks, then accumulated (docs/rocm-facts.md#w1)
            steps = optimizer_steps(
                rows=train_rows,
                per_device_batch=per_device,
                accumulation=accumulation,
                num_train_epochs=1,
                world_size=world.size,
                drop_last=bool(config.get("dataloader_drop_last", False)),
            ).steps_per_epoch
            plan += f"; {train_rows} rows make {steps} optimizer steps per epoch"
    findings.append(
        Finding(
            code="WORLD_PLAN",
            new=world.size,
            message=plan + f" (world from {world.source}).",
        )
    )
    return unchanged(config, env, *findings)


# The batch keys of transformers' fill_match list; a mismatch among the rest is DEEPSPEED_MISMATCH.
_BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")


def deepspeed_mismatches(config: Mapping[str, Any], world_size: int) -> dict[str, tuple[Any, str]] | None:
    """transformers' own list of DeepSpeed-JSON values that do not match the training arguments
    (``HfTrainerDeepSpeedConfig.trainer_config_process``, run on the JSON with the config's values and
    this world size): {DeepSpeed key: (its value, transformers' line)}; None when it cannot run."""
    ds = deepspeed_json(config)
    if ds is None:
        return None
    try:
        probe = _trainer_deepspeed_config(ds)
        probe.trainer_config_process(_training_values(config, world_size))
    except Exception:  # a value the parser refuses (VALUE_INVALID says so), or no accelerate
        return None
    found = {}
    for line in probe.mismatches:  # "- ds {ds_key_long}={ds_val} vs hf {hf_key}={hf_val}" (fill_match)
        key = line.removeprefix("- ds ").split("=", 1)[0]
        found[key] = (probe.get_value(key), line.removeprefix("- "))
    return found


def _trainer_deepspeed_config(ds: dict[str, Any]) -> Any:
    """transformers' HfTrainerDeepSpeedConfig over accelerate's HfDeepSpeedConfig (which holds the dict and
    its key lookups), without its __init__'s global registration and DeepSpeed import: DeepSpeed need not
    be installed to run the comparison."""
    from accelerate.utils.deepspeed import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class _Probe(HfTrainerDeepSpeedConfig, HfDeepSpeedConfig):
        def __init__(self, config: dict[str, Any]) -> None:
            HfDeepSpeedConfig.__init__(self, config)  # a deep copy, as transformers makes
            self._dtype = None
            self.mismatches = []

    return _Probe(ds)


def _training_values(config: Mapping[str, Any], world_size: int) -> Any:
    """What trainer_config_process reads of TrainingArguments: the config's values over the dataclass
    defaults (LLaMA-Factory's TrainingArguments fields), and the world size."""
    from types import SimpleNamespace

    from ..lf.schema import field_defaults

    values = {**field_defaults(), **{k: v for k, v in config.items() if v is not None}}
    return SimpleNamespace(**values, world_size=world_size)


def _deepspeed_batch(
    config: Mapping[str, Any], per_device: int, accumulation: int, world: World, arithmetic: str
) -> list[Finding]:
    """DeepSpeed JSON values that are not "auto" must equal the config's: transformers lists each one
    that does not and stops (``trainer_config_finalize``), after the model is loaded (docs/rocm-facts.md#w1)."""
    mismatches = deepspeed_mismatches(config, world.size)
    if not mismatches:
        return []
    name = Path(str(config["deepspeed"])).name
    made = dict(zip(_BATCH_KEYS, (per_device, accumulation, per_device * accumulation * world.size), strict=True))
    batch = {key: found for key, found in mismatches.items() if key in made}
    other = {key: found for key, found in mismatches.items() if key not in made}
    stops = "transformers stops with 'DeepSpeed config values that mismatch TrainingArguments' after loading the model."
    findings = []
    if batch:
        findings.append(
            Finding(
                code="GLOBAL_BATCH_MISMATCH",
                key="deepspeed",
                old={key: value for key, (value, _) in batch.items()},
                new={key: made[key] for key in batch},
                message=f"The DeepSpeed JSON {name} pins batch numbers the run does not make "
                f"({'; '.join(line for _, line in batch.values())}); the global batch is {arithmetic}. {stops}",
            )
        )
    if other:
        findings.append(
            Finding(
                code="DEEPSPEED_MISMATCH",
                key="deepspeed",
                old={key: value for key, (value, _) in other.items()},
                message=f"The DeepSpeed JSON {name} pins values the config sets otherwise "
                f"({'; '.join(line for _, line in other.values())}). {stops}",
            )
        )
    return findings


def network(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """What RCCL needs across nodes on ROCm: the interface, iommu=pt, AMD's MI300X settings."""
    world, problems = read_world(config, env, ctx)
    if problems or world.size < 2 or not ctx.rocm or env_enabled(env, "USE_RAY"):
        return unchanged(config, env)
    findings: list[Finding] = []
    # Planning (--gpu, a preset's target): this shell is not a node, so its variables are advice, not a risk.
    level = Level.INFO if ctx.snapshot.source.startswith("planned") else Level.WARNING
    if world.nodes > 1:
        unset = [name for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if not env.get(name)]
        if unset:
            have = [f"{n}={env[n]}" for n in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if env.get(n)]
            findings.append(
                Finding(
                    code="RCCL_SOCKET_IFNAME_UNSET",
                    level=level,
                    key=unset[0],
                    message=f"{world.nodes} nodes but {' and '.join(unset)} unset"
                    + (f" ({', '.join(have)} is set)" if have else "")
                    + ": RCCL and gloo then pick an interface themselves, often a docker bridge or a management "
                    "port the other nodes cannot reach, and the first collective hangs or crawls.",
                    fix_with={"assignments": " ".join(f"{name}=<if>" for name in unset)},
                )
            )
        address = env.get("MASTER_ADDR", "")
        if not address or address.startswith(LOOPBACK):
            findings.append(
                Finding(
                    code="MASTER_ADDR_LOOPBACK",
                    level=level,
                    key="MASTER_ADDR",
                    old=address or None,
                    message=f"{world.nodes} nodes but MASTER_ADDR is "
                    + (f"{address}" if address else "unset (LLaMA-Factory then uses 127.0.0.1)")
                    + ": nodes other than this host cannot reach it, so they wait at the rendezvous.",
                )
            )
        if ctx.snapshot.iommu_pt is False and len(ctx.snapshot.devices) < 2:  # 2+: multi_gpu says it
            findings.append(iommu_pt_missing(f"{world.nodes} nodes"))
    # AMD's RCCL settings for the arch (catalogue rccl_env; MI300X: docs/rocm-facts.md#f10, #w3)
    tuned = next((info.rccl_env for _, info in ctx.arch_infos() if info is not None and info.rccl_env), {})
    if tuned:
        wanted = {k: v for k, v in tuned.items() if env.get(k) != v}
        if wanted:
            said = [
                ("set: " + ", ".join(f"{k}={v}" for k, v in tuned.items() if k not in wanted)),
                ("set otherwise: " + ", ".join(f"{k}={env[k]}" for k in wanted if env.get(k))),
                ("missing: " + ", ".join(k for k in wanted if not env.get(k))),
            ]
            findings.append(
                Finding(
                    code="RCCL_ENV_MI300X",
                    key=next(iter(wanted)),
                    new=wanted,
                    message=f"{world.size} ranks on MI300X; of AMD's multi-GPU settings "
                    + "; ".join(part for part in said if not part.endswith(": "))
                    + ". Without them RCCL runs fewer channels at normal priority.",
                    fix_with={"settings": " ".join(f"{k}={v}" for k, v in wanted.items())},
                )
            )
    return unchanged(config, env, *findings)


def ray_visible_devices(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """USE_RAY on ROCm: LLaMA-Factory's Ray worker reads only the CUDA/Ascend NOSET variables
    (docs/rocm-facts.md#w4); the AMD ones that guides set make every worker of a node take GPU 0."""
    if not env_enabled(env, "USE_RAY"):
        return unchanged(config, env)
    if ctx.cpu_only:
        return unchanged(config, env, _ray_on_cpu())
    if not ctx.rocm:
        return unchanged(config, env)
    amd_names = ("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES")
    amd_noset = [name for name in amd_names if env.get(name)]
    cuda_noset = bool(env.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"))
    problem = case = None
    fix_with: dict[str, str] = {}
    if amd_noset and not cuda_noset:
        problem = (
            f"{' and '.join(amd_noset)} stop Ray from giving each worker its own GPU, and LLaMA-Factory's Ray "
            "worker does not read them: it sets LOCAL_RANK=0, so every worker of a node trains on GPU 0."
        )
        case, fix_with = "amd_noset_only", {"amd_noset_variables": " ".join(amd_noset)}
    elif cuda_noset and not amd_noset:
        problem = (
            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES makes LLaMA-Factory's worker use Ray's GPU index as "
            "LOCAL_RANK, but on AMD Ray still narrows HIP_VISIBLE_DEVICES to that one GPU, so every worker "
            "but the first asks for a device it cannot see ('invalid device ordinal')."
        )
        case = "cuda_noset_only"
    elif env.get("ROCR_VISIBLE_DEVICES") and not env.get("HIP_VISIBLE_DEVICES"):
        problem = (
            "ROCR_VISIBLE_DEVICES is set without HIP_VISIBLE_DEVICES: Ray on AMD refuses to start GPU "
            "workers ('Please use HIP_VISIBLE_DEVICES instead of ROCR_VISIBLE_DEVICES')."
        )
        case, fix_with = "rocr_without_hip", {"devices": env["ROCR_VISIBLE_DEVICES"]}
    if problem is None or case is None:
        return unchanged(config, env)
    return unchanged(
        config,
        env,
        Finding(
            code="RAY_ROCM_VISIBLE_DEVICES",
            key="USE_RAY",
            message=problem,
            fix_as=case,
            fix_with=fix_with,
        ),
    )


def _ray_on_cpu() -> Finding:
    from ..lf.ray_bundle import placement_bundle

    # LLaMA-Factory's get_placement_group: one bundle per device; on a machine without a GPU the devices
    # are the CPUs (get_device_count), each asking the bundle below: more CPUs than the machine has.
    bundle = placement_bundle("cpu")
    return Finding(
        code="RAY_CPU_UNSCHEDULABLE",
        key="USE_RAY",
        message="USE_RAY=1 on a machine without a GPU: LLaMA-Factory's Ray launcher asks for one placement "
        f"bundle of {bundle} per device, and without a GPU every CPU counts as a device, so Ray can never "
        "place it and the run waits for ever ('No available node types can fulfill resource request').",
    )


@rule(PLAN)
def world_rules(config: Mapping[str, Any], env: Mapping[str, str], ctx: Context) -> Step:
    """The module's one rule, in the plan chain: batch arithmetic, network, Ray (each also usable alone)."""
    findings: list[Finding] = []
    for part in (world_batch, network, ray_visible_devices):
        findings += part(config, env, ctx).findings
    return unchanged(config, env, *findings)
