#!/usr/bin/env bash
# Writes deploy/docker/constraints.txt: every package `pip install .` brings, pinned
# to the version it brings today, so that the container image installs the same
# versions each time it is built (deploy/docker/Dockerfile). Run by `make constraints`
# after a dependency changes; tests/e2e/test_deploy.py checks that the file covers
# every runtime dependency and honours pyproject.toml's lower bounds.
set -euo pipefail
# pip's notes about find-links folders this machine lacks are noise here.
exec 2> >(grep -v "^WARNING: Location" >&2)
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --upgrade pip
"$work/venv/bin/pip" wheel --quiet --no-deps --wheel-dir "$work/wheel" .
# With the extras the image installs (MySQL/MariaDB outbox sources).
"$work/venv/bin/pip" install --quiet "$(ls "$work"/wheel/herald-*.whl)[mysql]"
{
  echo "# Every package the container image installs, pinned: written by scripts/constraints.sh"
  echo "# (make constraints) with $("$work/venv/bin/python" -V) on $(uname -m). Do not edit by hand."
  "$work/venv/bin/pip" freeze --all --exclude herald --exclude pip --exclude setuptools \
    --exclude wheel | LC_ALL=C sort -f
} > deploy/docker/constraints.txt
echo "wrote deploy/docker/constraints.txt ($(grep -vc '^#' deploy/docker/constraints.txt) packages)"
