"""Arms the hook inside stock LLaMA-Factory.

``llamafactory_rocm.pth`` runs in every Python process of the environment, so it imports nothing:
it appends a one-line meta-path finder that ignores every import except ``llamafactory.*``, and
only then imports this module (``lazy_find_spec``). From here on, three modules are hooked.

- ``llamafactory.train.tuner``: after it executes, ``run_exp`` is wrapped (``hook.wrap_run_exp``).
  Every training entry point goes through it: ``llamafactory-cli train``/``lmf train`` (launcher
  ``launch()``), the torchrun child ranks (``launcher.py`` ``__main__``) and ``run_exp(args=...)``.
  ``export_model`` in the same module is wrapped too (``after.wrap_export_model``): ``llamafactory-cli
  export`` and LlamaBoard's export tab.
- ``llamafactory.chat.chat_model``: ``ChatModel.__init__`` is wrapped (``after.wrap_chat_model_init``):
  ``chat``, ``api`` and ``webchat`` all construct a ChatModel (docs/after-training.md#t8).
- ``llamafactory.webui.interface`` and ``llamafactory.api.app``: ``run_web_ui``, ``run_web_demo`` and
  ``run_api`` first say, in one line, when the server will listen beyond the loopback without a password
  or key (``lf.exposure``); nothing about the server is changed.
- ``llamafactory.v1.launcher`` (LLaMA-Factory main, ``USE_V1=1``): its ``launch`` never calls ``run_exp``,
  so it first says in one line that the run is not checked (``lf.v1_launcher``).
- ``llamafactory.data.mm_plugin``: it imports torchaudio unconditionally, for audio inputs only.
  When torchaudio is missing or broken, a stand-in is visible while that one module executes; it
  raises a clear error only if audio is really used.

``LLAMAFACTORY_ROCM=0`` switches the check off: no rewrite, record, guard or summary. The torchaudio
stand-in stays, so that stock ``llamafactory-cli train`` still imports where torchaudio cannot (the
README's install): without it the off switch would leave text training unable to start.
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
else:
    ModuleType = type(sys)

SWITCH = "LLAMAFACTORY_ROCM"
TUNER = "llamafactory.train.tuner"
CHAT_MODEL = "llamafactory.chat.chat_model"
MM_PLUGIN = "llamafactory.data.mm_plugin"
WEBUI = "llamafactory.webui.interface"
API = "llamafactory.api.app"
V1_LAUNCHER = "llamafactory.v1.launcher"


def enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get(SWITCH, "1").strip().lower() not in {"0", "false", "off", "no"}


def _step_aside(exc: Exception) -> None:
    """Never break LLaMA-Factory: say so in one line and leave it stock."""
    from llamafactory_rocm.console import say

    say(f"pre-launch check is off for this run ({exc}); set {SWITCH}=0 to silence this line.")


def _patch_tuner(module: ModuleType) -> None:
    original = getattr(module, "run_exp", None)
    if not getattr(original, "__llamafactory_rocm__", False):
        try:
            from llamafactory_rocm.train.hook import wrap_run_exp

            module.run_exp = wrap_run_exp(original)  # type: ignore[attr-defined]
        except Exception as exc:
            _step_aside(exc)
    export = getattr(module, "export_model", None)
    if export is not None and not getattr(export, "__llamafactory_rocm__", False):
        try:
            from llamafactory_rocm.train.after import wrap_export_model

            module.export_model = wrap_export_model(export)  # type: ignore[attr-defined]
        except Exception as exc:
            _step_aside(exc)


def _patch_chat_model(module: ModuleType) -> None:
    chat_model = getattr(module, "ChatModel", None)
    init = getattr(chat_model, "__init__", None)
    if chat_model is None or getattr(init, "__llamafactory_rocm__", False):
        return
    try:
        from llamafactory_rocm.train.after import wrap_chat_model_init

        chat_model.__init__ = wrap_chat_model_init(init)  # type: ignore[misc]
    except Exception as exc:
        _step_aside(exc)


def _wrap_attr(module: ModuleType, name: str, wrap: Callable[[Callable], Callable]) -> None:
    """Replace ``module.name`` by ``wrap(module.name)`` once; step aside in one line if that fails."""
    original = getattr(module, name, None)
    if original is None or getattr(original, "__llamafactory_rocm__", False):
        return
    try:
        setattr(module, name, wrap(original))
    except Exception as exc:
        _step_aside(exc)


def _patch_servers(module: ModuleType) -> None:
    from llamafactory_rocm.lf.exposure import wrap_server_entry

    for name, command in (("run_web_ui", "webui"), ("run_web_demo", "webchat"), ("run_api", "api")):
        _wrap_attr(module, name, lambda entry, command=command: wrap_server_entry(entry, command))


def _patch_v1_launcher(module: ModuleType) -> None:
    from llamafactory_rocm.lf.v1_launcher import wrap_launch

    _wrap_attr(module, "launch", wrap_launch)


_PATCHES = {
    TUNER: _patch_tuner,
    CHAT_MODEL: _patch_chat_model,
    WEBUI: _patch_servers,
    API: _patch_servers,
    V1_LAUNCHER: _patch_v1_launcher,
}


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
            _PATCHES[self._fullname](module)


class _Finder:
    """A meta-path finder (importlib's MetaPathFinder protocol) for the modules we hook."""

    targets = (TUNER, CHAT_MODEL, WEBUI, API, V1_LAUNCHER, MM_PLUGIN)

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets:
            return None
        if fullname in _PATCHES and not (_FORCED[0] or enabled()):
            return None  # switched off: only the torchaudio stand-in stays
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
    for name, patch in _PATCHES.items():
        if name in sys.modules:  # imported before we were armed
            patch(sys.modules[name])
    if on_installed:
        on_installed()
    return True
