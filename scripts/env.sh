# Sourced by the scripts: which torch wheel and which virtual environment.
#   TORCH_VERSION  2.14.1 (default: the CUDA 13 build, runs on CPU too, with torchvision 0.29.1)
#                  or 2.13.0 (the CPU build); the wheels lie on local disk.
#   VENV_DIR       the venv (default .venv for 2.14.1, .venv-<version> for another torch)
# and where ccache keeps the objects of the pip builds (scripts/setup.sh): build/ccache, inside
# the checkout (a clean clone starts without it and fills it), paths relative to the checkout so
# that the build trees of both wheels (build/py-torch<version>, at the same depth) share the
# objects that do not include torch.
TORCH_VERSION=${TORCH_VERSION:-2.14.1}
if [ "$TORCH_VERSION" = 2.14.1 ]; then
  VENV_DIR=${VENV_DIR:-.venv}
else
  VENV_DIR=${VENV_DIR:-.venv-$TORCH_VERSION}
fi
VENV_PY=$PWD/$VENV_DIR/bin/python
export TORCH_VERSION VENV_DIR VENV_PY
export CCACHE_DIR=${CCACHE_DIR:-$PWD/build/ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=1
