#!/usr/bin/env bash
# The hook, launch and trainer tests again on LLaMA-Factory main (0.9.6.dev0), the line most users
# install from git, from the wheel in ../shared/wheels (built from the public source, `pip wheel
# --no-deps`). Its own venv: LLaMA-Factory installs with --no-deps, as the README says for 0.9.5.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${LLAMAFACTORY_ROCM_MAIN_WHEELS:-../shared/wheels}  # another folder: tests/test_main_line_script.py
wheel=$(ls "$wheels"/llamafactory-0.9.6*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  # In CI (CI set to anything but empty, 0, false, no, off) a missing wheel fails: the main line must be tested
  # there; on a developer's machine it is said and skipped.
  case "$(printf '%s' "${CI:-}" | tr '[:upper:]' '[:lower:]')" in
    "" | 0 | false | no | off)
      echo "main line: no LLaMA-Factory main wheel in $wheels, so only 0.9.5 was tested"
      exit 0
      ;;
  esac
  echo "main line: CI=$CI but no LLaMA-Factory main wheel (llamafactory-0.9.6*.whl) in $wheels: build it there" \
    "(pip wheel --no-deps from LLaMA-Factory's source) or point LLAMAFACTORY_ROCM_MAIN_WHEELS at its folder" >&2
  exit 1
fi
echo "+ main line: $wheel"
# .venv-main is the README's .venv with LLaMA-Factory main in front of it: the same torch, transformers, peft and
# test packages (LLaMA-Factory installs with --no-deps on both lines, so a second resolve would pick the same ones),
# seen through a .pth that adds .venv's site-packages (site.addsitedir: its own .pth files, our editable install
# and startup hook, run too) after .venv-main's own, where the main wheel goes: `import llamafactory` and its
# metadata find main first. A second full install cost ~100 s of CI's 30 minutes.
base=${LLAMAFACTORY_ROCM_BASE_VENV:-.venv}
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m venv .venv-main
main_site=$(.venv-main/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf 'import site; site.addsitedir(%s)\n' "'$base_site'" > "$main_site/zz_llamafactory_rocm_base_venv.pth"
.venv-main/bin/pip install -q --no-deps -e .  # this venv's llamafactory-rocm script
.venv-main/bin/pip install -q --no-deps --force-reinstall "$wheel"
# .venv's console scripts (torchrun, which LLaMA-Factory's launcher runs from PATH, pytest, accelerate...) with
# this venv's python, and .venv/bin off PATH: nothing below may reach the 0.9.5 line by its own interpreter.
base_bin=$(cd "$base/bin" && pwd)
for script in "$base_bin"/*; do
  name=$(basename "$script")
  if [ ! -e ".venv-main/bin/$name" ] && head -n 1 "$script" | grep -q '^#!.*/python'; then
    sed "1s|.*|#!$PWD/.venv-main/bin/python|" "$script" > ".venv-main/bin/$name"
    chmod +x ".venv-main/bin/$name"
  fi
done
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$base_bin" | paste -sd: -)
. .venv-main/bin/activate
python - <<'PY'
import importlib.metadata as m
import llamafactory
version = m.version("llamafactory")
# the main line, from .venv-main, or nothing below tests it
assert version.startswith("0.9.6") and "/.venv-main/" in llamafactory.__file__, (version, llamafactory.__file__)
print("llamafactory", version, "transformers", m.version("transformers"))
PY
case "$(command -v torchrun)" in
  "$PWD/.venv-main/bin/"*) ;;
  *) echo "main line: torchrun is $(command -v torchrun), not .venv-main's" >&2; exit 1 ;;
esac
# The hook and trainer paths, the pins to LLaMA-Factory's source (launcher, Ray, library constants), the
# dry launch and its activation trace, each stage's own trainer against the memory estimate, the rank's view
# on simulated nodes, the exposure line (the rules run the same code on both), and every literal refusal of that
# line's parser with its cause and a fix that passes it (tests/test_refusal_fixes.py).
# The node corpus on this line: the torchrun world, the two-node world and ray's refusal, which stops in
# LLaMA-Factory's own tuner (the simulated GPU nodes and the DeepSpeed cases run on 0.9.5, in the full suite, as
# do batch 0 and nccl on a CPU, refused in torch's and accelerate's words: the same packages on both lines),
# and one loopback case of the exposure line (the wrapped entry is the same): CI's 30 minutes.
export NODE_CORPUS_ONLY="${NODE_CORPUS_ONLY:-^(plain_torchrun|plain_two_nodes|ray_without_ray)$}"
python -m pytest -q -n 2 --dist loadfile --durations=5 tests/test_command_registry.py tests/test_startup_hook.py tests/test_seed_command.py tests/test_train_e2e.py \
  tests/test_library_pins.py tests/test_rules_world.py tests/test_dry_run.py tests/test_rank_view.py \
  tests/test_exposure.py tests/test_memory_workflow.py tests/test_dry_activations.py tests/test_memory_stages.py \
  tests/test_refusal_fixes.py -k "not each_bundled_dataset_trains and not agrees_with_stock and not corpus_covers and not 127.0.0.1"
