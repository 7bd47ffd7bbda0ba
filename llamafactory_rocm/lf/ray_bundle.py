"""The Ray placement bundle LLaMA-Factory asks per device, from its own ``get_placement_group``.

``train/trainer_utils.py`` ``get_placement_group`` builds ``{"CPU": 10}`` plus one of the device kind
(``get_device_name()``, none on a CPU-only machine) for every device of the Ray cluster, then hands the
list to Ray's ``placement_group``. It is called here with Ray's function recorded (Ray need not be
installed) and the device kind given, so the rule quotes the bundle the installed line asks for.
"""

from __future__ import annotations

from functools import cache

from .text_only import text_only_llamafactory


@cache
def placement_bundle(device_name: str = "cpu") -> dict[str, int]:
    """The bundle LLaMA-Factory's Ray launcher asks per device on a machine whose devices are ``device_name``."""
    with text_only_llamafactory():
        from llamafactory.train import trainer_utils

    saved = {name: trainer_utils.__dict__.get(name) for name in ("placement_group", "get_device_name")}
    trainer_utils.placement_group = lambda bundles, strategy=None: bundles  # Ray's, recorded
    trainer_utils.get_device_name = lambda: device_name
    try:
        _, bundle = trainer_utils.get_placement_group(1)
    finally:
        for name, value in saved.items():
            if value is None:
                trainer_utils.__dict__.pop(name, None)
            else:
                setattr(trainer_utils, name, value)
    return dict(bundle)
