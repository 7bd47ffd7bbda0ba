"""Radeon multi-GPU: NCCL_P2P_DISABLE=1 as the documented workaround (docs/rocm-facts.md#n15).

Recorded snapshots built from published facts; none of it ran on AMD hardware.
"""

from llamafactory_rocm.findings import Level
from llamafactory_rocm.machine.snapshot import Snapshot
from llamafactory_rocm.rules import multi_gpu
from llamafactory_rocm.rules.base import Context
from tests.conftest import make_ctx


def doubled(name: str) -> Context:
    ctx = make_ctx(name)
    snap: Snapshot = ctx.snapshot.model_copy(deep=True)
    snap.devices = [snap.devices[0], snap.devices[0].model_copy(update={"index": 1})]
    return Context(snapshot=snap, catalogue=ctx.catalogue, known_keys=ctx.known_keys)


def by_code(step):
    return {f.code: f for f in step.findings}


def test_two_rx7900xtx_name_nccl_p2p_disable_before_one_gpu():
    found = by_code(multi_gpu.multi_gpu_notices({}, {}, doubled("rx7900xtx")))
    rdna3 = found["RDNA3_DDP_KNOWN_ISSUE"]
    assert rdna3.fix.startswith("export NCCL_P2P_DISABLE=1") and "HIP_VISIBLE_DEVICES=0" in rdna3.fix
    assert rdna3.new == "1" and "ROCm/vllm#390" in rdna3.message


def test_with_nccl_p2p_disable_set_the_rdna3_note_says_so():
    found = by_code(multi_gpu.multi_gpu_notices({}, {"NCCL_P2P_DISABLE": "1"}, doubled("rx7900xtx")))
    assert found["RDNA3_DDP_KNOWN_ISSUE"].fix.startswith("NCCL_P2P_DISABLE=1 is set")


def test_several_rdna4_cards_without_p2p_disable_are_warned():
    found = by_code(multi_gpu.multi_gpu_notices({}, {}, doubled("r9700")))
    p2p = found["RADEON_P2P_HANG"]
    assert p2p.level is Level.WARNING and "NCCL_P2P_DISABLE=1" in p2p.fix and "#11348" in p2p.message
    quiet = by_code(multi_gpu.multi_gpu_notices({}, {"NCCL_P2P_DISABLE": "1"}, doubled("r9700")))
    assert "RADEON_P2P_HANG" not in quiet


def test_one_rdna4_card_or_an_instinct_node_is_not_warned():
    assert "RADEON_P2P_HANG" not in by_code(multi_gpu.multi_gpu_notices({}, {}, make_ctx("r9700")))
    assert "RADEON_P2P_HANG" not in by_code(multi_gpu.multi_gpu_notices({}, {}, make_ctx("mi300x_8gpu")))
