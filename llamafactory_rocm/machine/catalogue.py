"""The architecture catalogue: facts about AMD GPU targets, loaded from ``archs.json``.

The catalogue is data, not code: every fact lives in ``archs.json`` with the source it came
from (see ``ArchInfo.sources``). This module only gives it a typed shape and lookup helpers.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A target as it appears in PYTORCH_ROCM_ARCH or gcnArchName: base arch plus optional
# ``:feature+``/``:feature-`` suffixes (LLVM target-id syntax).
TARGET_ID_RE = re.compile(r"^(gfx[0-9a-f]{3,4})((?::(?:xnack|sramecc)[+-])*)$")


# How a peak_source without a peak starts: AMD publishes no bf16 rate for the card (docs/rocm-facts.md#a3).
NO_PEAK_PUBLISHED = "none published by AMD"


class Product(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    alias: str = Field(description="short name used by --gpu and preset file names, e.g. mi300x")
    vram_gib: float = Field(description="memory of ONE device as torch sees it")
    integrated: bool = Field(
        default=False,
        description="an APU or the iGPU of a Ryzen CPU (torch: is_integrated); shares system memory",
    )
    peak_dense_bf16_tflops: float | None = Field(
        default=None,
        description="peak dense bf16 matrix throughput of ONE device as torch sees it (the forecast's ceiling)",
    )
    peak_source: str | None = Field(
        default=None,
        description="where the peak comes from, said with it: AMD's figure, derived from AMD's, or secondary",
    )
    peak_date: str | None = Field(
        default=None, description="the date of the peak's source (a document's date, or when it was read)"
    )

    @model_validator(mode="after")
    def _peak_has_source(self) -> Product:
        # A card AMD publishes no bf16 rate for says so with its source and date ("none published by AMD: ..."),
        # which the forecast prints where it gives no time; any other source goes with a peak.
        if (self.peak_source or "").startswith(NO_PEAK_PUBLISHED):
            together = self.peak_dense_bf16_tflops is None and self.peak_date is not None
        else:
            together = len({self.peak_dense_bf16_tflops is None, self.peak_source is None, self.peak_date is None}) == 1
        if not together:
            raise ValueError(f"{self.alias}: peak_dense_bf16_tflops, peak_source and peak_date go together")
        return self


class FlashAttention(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ck_min_version: str | None = Field(
        description="first flash-attn release whose CK (default ROCm) backend builds for this arch"
    )
    triton_backend: bool = Field(description="FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE covers it")


class ArchInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str
    family: str = Field(description="e.g. CDNA3, RDNA3; HSA overrides never cross families")
    products: list[Product]
    bf16_matrix: bool = Field(description="bf16 runs on matrix units (MFMA/WMMA)")
    bf16_faster_than_fp16: bool = Field(description="False where bf16 is slower than fp16")
    sdpa_aotriton: bool
    sdpa_aotriton_experimental: bool = False
    flash_attention: FlashAttention
    bitsandbytes_min_version: str | None
    hsa_override: str | None = Field(
        description="HSA_OVERRIDE_GFX_VERSION that makes this arch run kernels of a sibling"
    )
    hsa_override_target: str | None = None
    in_official_torch_wheels: bool
    retired: bool = False
    successor: str | None = Field(default=None, description="the target a retired one's GPUs are (gfx940 -> gfx942)")
    hip_page_faults: Literal["lora_backward_gemm", "memory_access"] | None = Field(
        default=None,
        description="reported GPU page faults: in LoRA's backward GEMMs (hipBLASLt) or memory access faults "
        "at load / first tensor; PYTORCH_NO_HIP_MEMORY_CACHING=1 is the reported workaround",
    )
    hip_page_faults_from_rocm: str | None = Field(
        default=None, description="the first ROCm whose code path faults (earlier ones do not)"
    )
    fp16_failure: Literal["silent_divergence", "nan"] | None = Field(
        default=None, description="how fp16 training is reported to fail here, where a report exists"
    )
    bf16_divergence_report: str | None = Field(
        default=None, description="a reported bf16 divergence here, named when a run stops on a non-finite loss"
    )
    # Multi-GPU and serving facts (rules/world.py, rules/multi_gpu.py, rules/serving.py read them).
    rccl_env: dict[str, str] = Field(default_factory=dict, description="AMD's RCCL settings for multi-GPU training")
    slow_partial_node_gpu_counts: list[int] = Field(
        default_factory=list, description="GPU counts per job whose collectives AMD's guidance calls slow"
    )
    multi_gpu_ddp_report: str | None = Field(default=None, description="an open report of DDP failing on these cards")
    p2p_hang: bool = Field(default=False, description="RCCL over direct PCIe P2P reported to hang (NCCL_P2P_DISABLE=1)")
    vllm_rocm: bool = Field(default=False, description="listed in vLLM's ROCm requirements")
    sglang_rocm: bool = Field(default=False, description="a target of SGLang's ROCm builds")
    gfx_target_version: int | None = Field(description="KFD sysfs value for this target")
    notes: list[str] = []
    sources: dict[str, str] = Field(description="fact name -> where it was read")

    @model_validator(mode="after")
    def _every_fact_has_a_source(self) -> ArchInfo:
        facts = {
            "family", "products", "bf16_matrix", "bf16_faster_than_fp16", "sdpa_aotriton",
            "flash_attention", "bitsandbytes_min_version", "hsa_override",
            "in_official_torch_wheels", "gfx_target_version",
        }  # fmt: skip
        optional = (
            "successor", "hip_page_faults", "hip_page_faults_from_rocm", "fp16_failure", "bf16_divergence_report",
            "rccl_env", "slow_partial_node_gpu_counts", "multi_gpu_ddp_report", "p2p_hang", "vllm_rocm",
            "sglang_rocm",
        )  # fmt: skip
        facts |= {name for name in optional if getattr(self, name)}  # a fact stated here needs its source
        # (a product's peak carries its own source and date: Product._peak_has_source)
        missing = sorted(facts - set(self.sources))
        if missing:
            raise ValueError(f"{self.target}: no source for {', '.join(missing)}")
        return self


class HsaOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targets: list[str] = Field(description="targets, some outside the catalogue (gfx1031), that users override")
    value: str = Field(description="the HSA_OVERRIDE_GFX_VERSION they set, a sibling in their family")


class Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int
    official_torch_wheel_archs: list[str]
    official_torch_wheel_archs_source: str
    hsa_overrides_in_the_wild: list[HsaOverride] = Field(
        description="HSA_OVERRIDE_GFX_VERSION values reported to work within a family, the examples a fix gives"
    )
    hsa_overrides_in_the_wild_source: str
    archs: dict[str, ArchInfo]

    def arch(self, target: str) -> ArchInfo | None:
        return self.archs.get(base_arch(target))

    def archs_where(self, flag: str) -> tuple[str, ...]:
        """The targets whose boolean fact ``flag`` holds (``vllm_rocm``: vLLM's ROCm build lists them)."""
        return tuple(target for target, info in self.archs.items() if getattr(info, flag))

    def gpu(self, alias: str) -> tuple[Product, ArchInfo] | None:
        wanted = normalise_alias(alias)
        for info in self.archs.values():
            for product in info.products:
                if product.alias == wanted:
                    return product, info
        return None

    def aliases(self) -> list[str]:
        return sorted(p.alias for a in self.archs.values() for p in a.products)

    def nearest_target(self, text: str) -> str | None:
        """The known target closest to a misspelt one (``gfx94`` -> ``gfx942``)."""
        cleaned = text.strip().lower().split(":")[0]
        names = sorted(self.archs)
        close = difflib.get_close_matches(cleaned, names, n=1, cutoff=0.5)
        if close:
            return close[0]
        prefixed = [n for n in names if n.startswith(cleaned)] if cleaned else []
        return prefixed[0] if prefixed else None

    def nearest_aliases(self, text: str, n: int = 3) -> list[str]:
        return difflib.get_close_matches(normalise_alias(text), self.aliases(), n=n, cutoff=0.3)


def normalise_alias(text: str) -> str:
    """``RX 7900 XTX`` / ``rx-7900-xtx`` / ``rx7900xtx`` all name the same GPU."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def base_arch(target: str) -> str:
    """``gfx942:sramecc+:xnack-`` -> ``gfx942`` (flash-attention does the same split)."""
    return target.strip().split(":")[0].lower()


@lru_cache(maxsize=1)
def load_catalogue() -> Catalogue:
    text = resources.files("llamafactory_rocm.catalogue").joinpath("archs.json").read_text(encoding="utf-8")
    return Catalogue.model_validate(json.loads(text))
