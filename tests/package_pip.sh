#!/bin/sh
# package.pip (tests/package.cmake): SOURCE_DIR BUILD_DIR WORK_DIR VERSION.
# `pip install .` with Debian's pip, setuptools and wheel, offline and without build isolation, into a
# virtual environment (--system-site-packages: numpy and torch from Debian) in WORK_DIR, reusing
# BUILD_DIR's compiled module (ATTN_BUILD_DIR, setup.py); then imports it from there, checks pip's
# metadata, uninstalls it and checks that nothing of it is left. The environment is removed at the end.
set -eu
source=$1 build=$2 work=$3 version=$4
rm -rf "$work"
mkdir -p "$work"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
py=$work/venv/bin/python
site=$("$py" -c "import sysconfig; print(sysconfig.get_path('platlib'))")
(cd "$source" && ATTN_BUILD_DIR=$build "$py" -m pip install --no-build-isolation --no-index -q .)
cd "$work"  # not the source tree: the installed package must be the one imported
"$py" - "$site" "$version" <<'PY'
import sys
import numpy as np
import attn
site, version = sys.argv[1], sys.argv[2]
assert attn.__file__.startswith(site), f"attn imported from {attn.__file__}, not from the environment's {site}"
assert attn.__version__ == version, (attn.__version__, version)
x = np.ones((1, 2, 3), np.float32)
assert np.allclose(attn.scaled_dot_product_attention(x, x, x), x)
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    import attn.torch
    t = torch.ones(1, 2, 3, requires_grad=True)
    attn.torch.scaled_dot_product_attention(t, t, t).sum().backward()
    assert t.grad.shape == (1, 2, 3)
print(f"package.pip: attn {attn.__version__} imported from {attn.__file__}")
PY
"$py" -m pip show attn | grep -qx "Version: $version"
"$py" -m pip uninstall -y -q attn
if ls "$site" | grep -q '^attn'; then
  echo "package.pip: pip uninstall left in $site:" >&2
  ls "$site" | grep '^attn' >&2
  exit 1
fi
if "$py" -m pip show attn >/dev/null 2>&1; then echo "package.pip: pip still lists attn" >&2; exit 1; fi
rm -rf "$work"
echo "package.pip: installed, imported and uninstalled; nothing left"
