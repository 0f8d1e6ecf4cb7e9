"""Environment-only activation of dtr, run by dtr.pth at every interpreter start-up.

With no DTR_* variable in the environment and no libdtr.so preloaded it returns at once and
imports nothing: installing dtr costs other programs nothing. With one (DTR_BUDGET=6GiB, ...)
and DTR_ENABLE not 0, the program is re-executed under dtr's preload; under the preload, the
Python-side fixups are applied once torch is imported (dtr/_launcher.py, startup)."""
import os

if os.environ.get("DTR_ENABLE") != "0" and ("libdtr.so" in os.environ.get("LD_PRELOAD", "")
                                            or any(k.startswith("DTR_") for k in os.environ)):
    try:
        from dtr import _launcher
        _launcher.startup()
    except ImportError as e:  # a broken install must not break every Python program
        import sys
        sys.stderr.write(f"dtr: DTR_* is set but dtr cannot start: {e}\n")
