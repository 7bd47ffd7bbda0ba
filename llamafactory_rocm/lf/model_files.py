"""Where the dry launch finds the model's config and tokenizer when ``model_name_or_path`` is a Hugging Face id
that is neither a folder here nor in the cache: the files the dry run reads, never a weight.

- Where the Hub may be reached: huggingface_hub's own ``snapshot_download`` with the user's token, only the
  files ``FETCHED`` names (config, generation config, tokenizer, chat template, processor configs), into the
  user's Hugging Face cache, where the real run downloads the weights beside them. Said with their size.
- Where it may not (HF_HUB_OFFLINE, a gated repo without the user's token, no network; each said as such):
  the bundled shape of that id (llamafactory_rocm/models/) and a tokenizer of its family
  (llamafactory_rocm/standin/: the family's own where its license lets it ship, else a stand-in whose token
  count error on the bundled data is measured and printed), laid out as a Hugging Face cache snapshot in the
  launch's temporary folder, so LLaMA-Factory's own loaders read them under the user's model id. Only while a
  forecast is asked for (``STANDIN``, set by forecast/flops.py ``requested``): memory and FLOPs come from the
  shape built on the meta device, tokens from the stand-in; the check's verdict is not made on a stand-in.
"""

from __future__ import annotations

import contextvars
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import one_line
from .dry_parts import Launch, reachable, user_offline

# set while a check asks for the forecast (forecast/flops.py requested): a model not reachable here is built
# from its bundled shape with a stand-in tokenizer, for the forecast
STANDIN: contextvars.ContextVar[bool] = contextvars.ContextVar("standin_model_files", default=False)

# what LLaMA-Factory's launch reads before the weights (load_tokenizer: AutoTokenizer, AutoProcessor;
# load_config; the generation config read at save): the allow-list of the fetch, so no weight file can match
FETCHED = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
# the revision a stand-in snapshot is filed under in its temporary cache
STANDIN_REVISION = "0" * 40


@dataclass(frozen=True)
class ModelFiles:
    """How the dry run got the model's files: ``how`` is "fetched" or "standin"."""

    how: str
    model: str
    line: str  # said in the report: what was fetched and its size, or which shape and tokenizer stood in and why
    files: tuple[str, ...] = ()
    bytes: int = 0
    why: str | None = None  # standin: why the Hub was not asked or did not answer
    shape: str | None = None  # standin: the bundled shape's file
    tokenizer: str | None = None  # standin: what the tokenizer is
    tokenizer_exact: bool = False  # standin: the family's own tokenizer (the token counts are the real ones)
    tokenizer_error: str | None = None  # standin: its measured token count error, with its command and date

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def model_files(launch: Launch) -> bool:
    """Whether the model's config and tokenizer are here for the dry run: local, cached, fetched now, or (only
    while a forecast is asked for) a bundled shape with a stand-in tokenizer. Says each in the report."""
    run, model_args = launch.run, launch.model_args
    name = str(model_args.model_name_or_path)
    offline_here = user_offline("hub")
    # local, cached, not an id (refused), or offline and not planning (refused): reachable decides as before
    if reachable(run, model_args, offline_refuses=not launch.planned, quiet=True):
        return True
    if any(f.code == "MODEL_NOT_FOUND" for f in run.findings):
        if not _repo_id(name):
            return False  # not a folder and not a repo id: nothing to fetch or stand in for
        # offline here: the run cannot start, but the forecast a planner asked for is made on the bundled shape
        return STANDIN.get() and _stand_in(launch, "HF_HUB_OFFLINE is set here, so nothing is downloaded")
    why = "HF_HUB_OFFLINE is set here, so nothing is downloaded" if offline_here else None
    if why is None:
        fetched = fetch(name, model_args)
        if isinstance(fetched, ModelFiles):
            run.model_files = fetched.as_json()
            return True
        why = fetched
    if STANDIN.get() and _stand_in(launch, why):
        return True
    run.skip(
        "tokenizer, template, data pipeline and model modules",
        f"{name} is not local and not in the Hugging Face cache; {why}",
    )
    return False


def _repo_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def fetch(name: str, model_args: Any) -> ModelFiles | str:
    """The files ``FETCHED`` names of Hub repo ``name``, with huggingface_hub's own download into the user's
    cache; the reason it could not (gated, not found, no network) otherwise."""
    import huggingface_hub.constants as hub_constants
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    from .patching import Patches

    token = getattr(model_args, "hf_hub_token", None) or None
    revision = getattr(model_args, "model_revision", None) or "main"
    with Patches() as patches:
        patches.setattr(hub_constants, "HF_HUB_OFFLINE", False)  # the dry launch's own switch, off for this call
        try:
            folder = snapshot_download(
                name,
                revision=revision,
                cache_dir=model_args.cache_dir,
                token=token,
                allow_patterns=list(FETCHED),
            )
        except GatedRepoError:
            return (
                f"{name} is gated on the Hugging Face Hub and this machine's token has no access: accept its "
                "license on the model's Hub page, then log in (`hf auth login`, or set HF_TOKEN) and check again"
            )
        except RepositoryNotFoundError:
            return f"the Hugging Face Hub has no repo {name} this machine's token can see (a typo, or a private repo)"
        except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
            return f"the Hugging Face Hub did not answer ({type(exc).__name__}: {one_line(exc)[:160]})"
    got = sorted(p.name for p in Path(folder).iterdir() if p.name in FETCHED)
    if "config.json" not in got:
        return f"the Hugging Face Hub repo {name} has no config.json"
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in got)
    line = (
        f"fetched from the Hugging Face Hub into its cache, no weights: {', '.join(got)} ({_megabytes(size)}) of {name}"
    )
    return ModelFiles("fetched", name, line, files=tuple(got), bytes=size)


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


def _stand_in(launch: Launch, why: str) -> bool:
    """The bundled shape of the id with a tokenizer of its family, as a Hugging Face cache snapshot in the
    launch's temporary folder; the launch's ``cache_dir`` points at it while the dry launch runs (its undo
    stack puts it back). False where no shape or tokenizer family fits: then nothing stands in."""
    from ..standin import standin_family, write_tokenizer
    from .memory import shipped_model_files

    model_args = launch.model_args
    name = str(model_args.model_name_or_path)
    shipped = shipped_model_files().get(name.lower())
    if shipped is None:
        return False
    shape_file, config = shipped
    family = standin_family(config, name)
    if family is None:
        return False
    cache = launch.tmp / "standin-hub"
    repo = cache / ("models--" + name.replace("/", "--"))
    snapshot = repo / "snapshots" / STANDIN_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / (getattr(model_args, "model_revision", None) or "main")).write_text(STANDIN_REVISION)
    (snapshot / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    info = write_tokenizer(family, snapshot)
    launch.patches.setattr(model_args, "cache_dir", str(cache))
    line = (
        f"{name} is not here ({why}): built from the bundled shape llamafactory_rocm/models/{shape_file}, "
        f"tokens counted with {info.what}" + (f" ({info.error})" if info.error else "")
    )
    launch.run.model_files = ModelFiles(
        "standin",
        name,
        line,
        why=why,
        shape=shape_file,
        tokenizer=info.what,
        tokenizer_exact=info.exact,
        tokenizer_error=info.error,
    ).as_json()
    launch.run.skip(f"{name}'s own files", f"{why}; the forecast is made on its bundled shape, nothing else is")
    return True


__all__ = ["FETCHED", "STANDIN", "ModelFiles", "fetch", "model_files"]
