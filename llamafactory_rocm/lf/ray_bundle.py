"""The Ray placement bundle LLaMA-Factory asks per device, from its own ``get_placement_group``.

``train/trainer_utils.py`` ``get_placement_group`` builds ``{"CPU": 10}`` plus one of the device kind
(``get_device_name()``, none on a CPU-only machine) for every device of the Ray cluster, then hands the
list to Ray's ``placement_group``. It is called here with Ray's function recorded (Ray need not be
installed) and the device kind given, so the rule quotes the bundle the installed line asks for.
"""

from __future__ import annotations

from functools import cache

from .patching import Patches
from .text_only import text_only_llamafactory


@cache
def placement_bundle(device_name: str = "cpu") -> dict[str, int]:
    """The bundle LLaMA-Factory's Ray launcher asks per device on a machine whose devices are ``device_name``."""
    with text_only_llamafactory():
        from llamafactory.train import trainer_utils

    with Patches() as patches:  # placement_group is there only where Ray is installed
        patches.setattr(trainer_utils, "placement_group", lambda bundles, strategy=None: bundles, raising=False)
        patches.setattr(trainer_utils, "get_device_name", lambda: device_name, raising=False)
        _, bundle = trainer_utils.get_placement_group(1)
    return dict(bundle)
