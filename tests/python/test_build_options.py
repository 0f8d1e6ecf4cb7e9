"""The build's own options (Note [Profile-guided optimization], CMakeLists.txt): a wrong value is a
clear CMake error at configure time, and a right one reaches the compiler's command lines.
Configures without torch, tests or benchmarks, so each case takes a second or two."""
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compiler_is_gcc():
    r = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True, text=True)
    return "Free Software Foundation" in r.stdout


# Profile-guided optimization is GCC's: CMakeLists.txt refuses it with another compiler.
GCC_ONLY = pytest.mark.skipif(not compiler_is_gcc(), reason="DTR_PGO needs GCC")


def configure(tmp_path, *defines):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.fail("cmake is not on PATH (scripts/setup.sh installs it)")
    return subprocess.run([cmake, "-S", ROOT, "-B", str(tmp_path / "b"), "-DDTR_BUILD_HOOKS=OFF", "-DDTR_BUILD_TESTS=OFF",
                           "-DDTR_BUILD_BENCH=OFF", *defines], capture_output=True, text=True)


@GCC_ONLY
@pytest.mark.parametrize("defines, message", [
    (["-DDTR_PGO=fast"], "DTR_PGO must be empty, generate or use (got 'fast')"),
    (["-DDTR_PGO=generate"], "DTR_PGO=generate needs DTR_PGO_DIR, the profile's directory"),
    (["-DDTR_PGO=use", "-DDTR_PGO_DIR=/nonexistent/profile"], "there is no profile in /nonexistent/profile"),
])
def test_a_wrong_profile_guided_option_is_a_clear_configure_error(tmp_path, defines, message):
    r = configure(tmp_path, *defines)
    assert r.returncode != 0
    assert message in " ".join(r.stderr.split()), r.stderr


def runtime_command(tmp_path):
    """The compiler's command line for runtime/runtime.cc in the configured tree."""
    with open(tmp_path / "b" / "compile_commands.json") as f:
        commands = [c["command"].split() for c in json.load(f) if c["file"].endswith("runtime/runtime.cc")]
    assert len(commands) == 1, commands
    return commands[0]


@GCC_ONLY
def test_profile_guided_options_reach_the_compiler(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    expected = {
        (): [],
        ("-DDTR_PGO=generate", f"-DDTR_PGO_DIR={profile}"):
            ["-fprofile-generate", "-fprofile-update=atomic", f"-fprofile-dir={profile}"],
        ("-DDTR_PGO=use", f"-DDTR_PGO_DIR={profile}"):
            ["-fprofile-use", f"-fprofile-dir={profile}", "-fprofile-partial-training", "-Wno-missing-profile",
             "-Wno-error=coverage-mismatch"],
        # Back to empty, as pyproject.toml passes on every configure: nothing of the profile is left.
        ("-DDTR_PGO=", "-DDTR_PGO_DIR="): [],
    }
    for defines, flags in expected.items():
        r = configure(tmp_path, *defines)
        assert r.returncode == 0, r.stderr
        command = runtime_command(tmp_path)
        assert [a for a in command if a.startswith(("-fprofile", "-Wno-missing-profile", "-Wno-error=coverage"))] == flags, \
            (defines, command)
        assert "-ffp-contract=off" in command  # Note [No contracted floating point] holds either way

