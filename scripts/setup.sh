#!/usr/bin/env bash
# Set up dpcl in ./.venv on a fresh machine (Python 3.11, package registries only).
#   bash scripts/setup.sh          -> runtime + training extras (enough for `dpcl demo`, `dpcl run`)
#   bash scripts/setup.sh --test   -> also the test tools and the Debian packages the tests read: `fortunes`
#                                     (text) and `dataset-fashion-mnist` (images, /usr/share/datasets/fashion-mnist)
# torch is pinned to the CPU wheel 2.13.0 and installed first, so that no CUDA build is pulled in.
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
for arg in "$@"; do
  case "$arg" in
    --test) with_tests=1 ;;
    *) echo "setup.sh: unknown option $arg (allowed: --test)" >&2; exit 2 ;;
  esac
done

python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin="$candidate"; break; fi
  done
fi
[ -n "$python_bin" ] || { echo "setup.sh: no python3.11 found; install Python 3.11" >&2; exit 2; }

[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
extras="train"
if [ "$with_tests" = 1 ]; then
  extras="train,test"
  # Debian packages the tests use: fortune texts, Fashion-MNIST images (the fmnist_* configs) and headless
  # Chromium (renders `dpcl report`'s page)
  missing=()
  [ -d /usr/share/games/fortunes ] || missing+=(fortunes)
  [ -d /usr/share/datasets/fashion-mnist ] || missing+=(dataset-fashion-mnist)
  command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 \
    || missing+=(chromium-headless-shell)
  if [ "${#missing[@]}" -gt 0 ]; then
    sudo_cmd=""
    [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
# A dpcl.egg-info left here by an older install would hide the new metadata (and its method entry points)
# from every command run in this folder: it is a build product, so it goes before the install.
rm -rf dpcl.egg-info
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[${extras}]"
