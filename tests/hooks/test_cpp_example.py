"""A LibTorch C++ training program (examples/train_mlp.cc, no dtr code in it) under the preload:
same losses and parameters as without dtr, within the budget, with real rematerialization."""
import json
import os

from conftest import dtr_lib, run

BUDGET = 2300 * 1024  # about 0.87 of the program's 2.65 MB peak; parameters, gradients and
                      # momentum buffers (never evictable) are about 1.9 MB of it


def example_binary():
    return os.path.join(os.path.dirname(os.path.dirname(dtr_lib())), "bin", "dtr_example_train_mlp")


def test_cpp_training_program_under_preload_is_bit_identical(tmp_path):
    binary = example_binary()
    assert os.path.exists(binary), f"{binary} is built with hooks/ (ninja -C build dtr_example_train_mlp)"
    plain = run([binary])
    assert plain.returncode == 0, plain.stderr[-2000:]
    stats_file = tmp_path / "stats.json"
    with_dtr = run([binary], preload=True, DTR_BUDGET=BUDGET, DTR_STATS_FILE=stats_file)
    assert with_dtr.returncode == 0, with_dtr.stderr[-2000:]
    assert with_dtr.stdout == plain.stdout
    stats = json.loads(stats_file.read_text())
    assert stats["budget_bytes"] == BUDGET
    assert 0 < stats["peak_reserved_bytes"] <= BUDGET
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0


def test_cpp_program_with_an_infeasible_budget_gets_dtrs_out_of_memory_error():
    r = run([example_binary()], preload=True, DTR_BUDGET="900KiB")
    assert r.returncode != 0
    assert "c10::OutOfMemoryError" in r.stderr and "out of memory under DTR_BUDGET" in r.stderr
    assert "constants" in r.stderr
