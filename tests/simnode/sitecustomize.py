"""Installs the simulated node (tests/simulated_node.py) in every Python process of a test's run, and the
rank recorder (tests/rank_record.py) where the test asks for it.

LLAMAFACTORY_ROCM_TEST_NODE names the snapshot. The launcher's process (``llamafactory-cli``, no
LOCAL_RANK) sees the node's devices, so LLaMA-Factory starts torchrun with that many ranks. A torchrun
rank sees them while the pre-launch check runs (what a rank of that node would judge), then trains on
the CPU with gloo: a rank of a simulated node cannot run a kernel on a GPU that does not exist.

LLAMAFACTORY_ROCM_TEST_RANKS names a folder: every process that runs LLaMA-Factory's ``get_train_args``
writes there the world it ran in (torchrun's variables, TrainingArguments, torch.distributed, accelerate).

LLAMAFACTORY_ROCM_TEST_SLOW_FIRST_RANK (seconds): the node's first rank waits that long before its check, as it
does under load beside a rank that runs the rules alone.
"""

import os
import sys

_node = os.environ.get("LLAMAFACTORY_ROCM_TEST_NODE")
_ranks = os.environ.get("LLAMAFACTORY_ROCM_TEST_RANKS")
if _node or _ranks:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ranks:
    import rank_record

    rank_record.install(_ranks)
if _node:
    import simulated_node

    if "LOCAL_RANK" not in os.environ:
        simulated_node.install(_node)
    elif os.environ.get("LLAMAFACTORY_ROCM", "1") != "0":
        from llamafactory_rocm.train import hook as _hook

        _unsimulated = _hook.prepare

        _slow_first = os.environ.get("LLAMAFACTORY_ROCM_TEST_SLOW_FIRST_RANK")  # seconds, node's first rank only

        def _prepare_on_the_node(args):  # the probe and the check, as the rank of that node sees them
            if _slow_first and os.environ.get("LOCAL_RANK") == "0":  # a first rank slower to its verdict
                import time

                time.sleep(float(_slow_first))
            with simulated_node.simulated_node(_node):
                return _unsimulated(args)

        _hook.prepare = _prepare_on_the_node
