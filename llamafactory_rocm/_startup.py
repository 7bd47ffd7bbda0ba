"""Arms the hook inside stock LLaMA-Factory.

``llamafactory_rocm.pth`` runs in every Python process of the environment, so it imports nothing:
it appends a one-line meta-path finder that ignores every import except ``llamafactory.*``, and
only then imports this module (``lazy_find_spec``). What is hooked is read from the registry of
LLaMA-Factory commands (``lf/commands.py`` ``REGISTRY``, each entry's ``hooks``), on the first
``llamafactory.*`` import while the check is on: when a module an entry names has executed, each function
named in it is replaced by ``wrapper(original, command)``, once. Every training entry point goes through
``run_exp``: ``llamafactory-cli train``/``lmf train`` (launcher ``launch()``), the torchrun child ranks
(``launcher.py`` ``__main__``) and ``run_exp(args=...)``; ``chat``, ``api`` and ``webchat`` all construct a
ChatModel (docs/after-training.md#t8).

Two more, not commands:

- ``llamafactory.v1.launcher`` (LLaMA-Factory main, ``USE_V1=1``): its ``launch`` never calls ``run_exp``,
  so it first says in one line that the run is not checked (``lf.v1_launcher``).
- ``llamafactory.data.mm_plugin``: it imports torchaudio unconditionally, for audio inputs only.
  When torchaudio is missing or broken, a stand-in is visible while that one module executes; it
  raises a clear error only if audio is really used.

``LLAMAFACTORY_ROCM=0`` switches the check off: no rewrite, record, guard or summary (and the registry is
not read). The torchaudio stand-in stays, so that stock ``llamafactory-cli train`` still imports where
torchaudio cannot (the README's install): without it the off switch would leave text training unable to
start.
"""

from __future__ import annotations

# Only modules the interpreter has already loaded at start-up: this file runs in every process.
import importlib.machinery
import os
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing alone costs ~10 ms at start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from llamafactory_rocm.lf.commands import Ref
else:
    ModuleType = type(sys)

SWITCH = "LLAMAFACTORY_ROCM"
MM_PLUGIN = "llamafactory.data.mm_plugin"
V1_LAUNCHER = "llamafactory.v1.launcher"


def enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get(SWITCH, "1").strip().lower() not in {"0", "false", "off", "no"}


def _step_aside(exc: Exception) -> None:
    """Never break LLaMA-Factory: say so in one line and leave it stock."""
    from llamafactory_rocm.console import say

    say(f"pre-launch check is off for this run ({exc}); set {SWITCH}=0 to silence this line.")


_HOOKED: list[dict[str, tuple[tuple[str, Ref, str, bool], ...]]] = []  # read once, on first use


def _hooked() -> dict[str, tuple[tuple[str, Ref, str, bool], ...]]:
    """LLaMA-Factory module -> (qualified name, wrapper, command, required) for each function hooked in it."""
    if not _HOOKED:
        from llamafactory_rocm.lf.commands import hooked_modules

        _HOOKED.append(hooked_modules())
    return _HOOKED[0]


def _wrap_function(module: ModuleType, qualname: str, wrapper: Ref, command: str, required: bool) -> None:
    """Replace ``qualname`` in ``module`` by ``wrapper(original, command)`` once; step aside in one line if
    that fails, or if a ``required`` function is missing."""
    *path, name = qualname.split(".")
    owner: object = module
    for part in path:
        owner = getattr(owner, part, None)
    original = None if owner is None else getattr(owner, name, None)
    if getattr(original, "__llamafactory_rocm__", False) or (original is None and not required):
        return
    try:
        if original is None:
            raise AttributeError(f"{module.__name__} has no {qualname}")
        setattr(owner, name, wrapper.load()(original, command))
    except Exception as exc:
        _step_aside(exc)


def _patch(module: ModuleType) -> None:
    """Every function the registry hooks in ``module``."""
    for qualname, wrapper, command, required in _hooked().get(module.__name__, ()):
        _wrap_function(module, qualname, wrapper, command, required)


def _patch_v1_launcher(module: ModuleType) -> None:
    from llamafactory_rocm.lf.v1_launcher import wrap_launch

    original = getattr(module, "launch", None)
    if original is None or getattr(original, "__llamafactory_rocm__", False):
        return
    try:
        module.launch = wrap_launch(original)  # type: ignore[attr-defined]
    except Exception as exc:
        _step_aside(exc)


def _patch_for(fullname: str) -> Callable[[ModuleType], None] | None:
    """The patch for module ``fullname``, None for a module not hooked."""
    if fullname == V1_LAUNCHER:
        return _patch_v1_launcher
    return _patch if fullname in _hooked() else None


class _HookedLoader:
    """Wraps the real loader: runs the module, then patches it (importlib's Loader protocol)."""

    def __init__(self, inner: object, fullname: str) -> None:
        self._inner = inner
        self._fullname = fullname

    def __getattr__(self, name: str) -> object:  # get_source, get_code, ... for inspect and tracebacks
        return getattr(self._inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if self._fullname == MM_PLUGIN:
            from llamafactory_rocm.lf.text_only import text_only_llamafactory

            with text_only_llamafactory():
                self._inner.exec_module(module)
        else:
            self._inner.exec_module(module)
            patch = _patch_for(self._fullname)
            if patch is not None:
                patch(module)


class _Finder:
    """A meta-path finder (importlib's MetaPathFinder protocol) for the modules we hook."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MM_PLUGIN and not (_FORCED[0] or enabled()):
            return None  # switched off: only the torchaudio stand-in stays
        if fullname != MM_PLUGIN and _patch_for(fullname) is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)  # type: ignore[arg-type]
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader, fullname)  # type: ignore[assignment]
        return spec


def lazy_find_spec(fullname: str, path: object = None) -> importlib.machinery.ModuleSpec | None:
    """Called by the .pth finder for ``llamafactory.*`` imports only."""
    return _FINDER.find_spec(fullname, path)


_FINDER = _Finder()
_FORCED = [False]  # set by install(force=True): `llamafactory-rocm train` checks even when switched off


def install(*, force: bool = False, on_installed: Callable[[], None] | None = None) -> bool:
    """Arm the hook (idempotent). ``force`` ignores the off switch (``llamafactory-rocm train``)."""
    _FORCED[0] = _FORCED[0] or force
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)  # the torchaudio stand-in, even when switched off
    if not (force or enabled()):
        return False
    for name in (*_hooked(), V1_LAUNCHER):
        patch = _patch_for(name)
        if patch is not None and name in sys.modules:  # imported before we were armed
            patch(sys.modules[name])
    if on_installed:
        on_installed()
    return True
