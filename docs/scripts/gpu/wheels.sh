#!/usr/bin/env bash
# Here, before a GPU run: the wheels the lent machines lack (Python 3.12, no network there) into .whl/, which git
# ignores through .git/info/exclude; each run names .whl in `carry` and setup.sh installs them. hydra-core,
# omegaconf and antlr4 (the config), diffusers (imported by the KL autoencoder's module). antlr4 4.9.3 has no wheel
# on PyPI: pip builds its pure-Python one.
set -euo pipefail
cd "$(dirname "$0")/../../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
  hydra-core==1.3.2 omegaconf==2.3.0 diffusers==0.35.2
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -la .whl
