"""Activation by environment variable alone: scripts/install.sh into a user site directory,
then DTR_BUDGET without LD_PRELOAD activates dtr; without it, nothing changes."""
import os
import subprocess

from conftest import PY, REPO, clean_env, dtr_lib


def test_env_var_alone_activates_after_install(tmp_path):
    user_base = tmp_path / "userbase"
    env = clean_env(PYTHONUSERBASE=str(user_base))
    site = subprocess.run([PY, "-c", "import site; print(site.getusersitepackages())"], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["bash", os.path.join(REPO, "scripts", "install.sh"), "--lib", dtr_lib(), site], check=True,
                   capture_output=True, env=dict(env, PATH=os.environ["PATH"]))
    installed = open(os.path.join(site, "dtr_activate.py")).read()
    assert dtr_lib() in installed or os.path.realpath(dtr_lib()) in installed
    probe = "import torch; print(torch.ops.dtr.is_active(), torch.ops.dtr.budget())"
    active = subprocess.run([PY, "-c", probe], env=dict(env, DTR_BUDGET="64MiB"), capture_output=True, text=True)
    assert active.returncode == 0, active.stderr[-2000:]
    assert active.stdout.split() == ["True", str(64 << 20)]
    # Without DTR_BUDGET, or with DTR_ENABLE=0, the interpreter is untouched.
    plain = subprocess.run([PY, "-c", "import torch; print(hasattr(torch.ops.dtr, 'stats'))"], env=env,
                           capture_output=True, text=True)
    assert plain.stdout.strip() == "False", plain.stderr[-2000:]
    off = subprocess.run([PY, "-c", "import os; print(os.environ.get('LD_PRELOAD', ''))"],
                         env=dict(env, DTR_BUDGET="64MiB", DTR_ENABLE="0"), capture_output=True, text=True)
    assert "libdtr" not in off.stdout
