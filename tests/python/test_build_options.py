"""The build's own options: a wrong value is a clear CMake error at configure time
(Note [Profile-guided optimization], CMakeLists.txt). Configures without torch, tests or
benchmarks, so each case takes a second or two."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def configure(tmp_path, *defines):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.fail("cmake is not on PATH (scripts/setup.sh installs it)")
    return subprocess.run([cmake, "-S", ROOT, "-B", str(tmp_path / "b"), "-DDTR_BUILD_HOOKS=OFF", "-DDTR_BUILD_TESTS=OFF",
                           "-DDTR_BUILD_BENCH=OFF", *defines], capture_output=True, text=True)


@pytest.mark.parametrize("defines, message", [
    (["-DDTR_PGO=fast"], "DTR_PGO must be empty, generate or use (got 'fast')"),
    (["-DDTR_PGO=generate"], "DTR_PGO=generate needs DTR_PGO_DIR, the profile's directory"),
    (["-DDTR_PGO=use", "-DDTR_PGO_DIR=/nonexistent/profile"], "there is no profile in /nonexistent/profile"),
])
def test_a_wrong_profile_guided_option_is_a_clear_configure_error(tmp_path, defines, message):
    r = configure(tmp_path, *defines)
    assert r.returncode != 0
    assert message in " ".join(r.stderr.split()), r.stderr


def test_profile_guided_options_configure(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    for defines in ([], ["-DDTR_PGO=generate", f"-DDTR_PGO_DIR={profile}"], ["-DDTR_PGO=use", f"-DDTR_PGO_DIR={profile}"]):
        r = configure(tmp_path, *defines)
        assert r.returncode == 0, r.stderr
