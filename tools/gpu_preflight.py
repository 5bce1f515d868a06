"""gpu_check's preflight: whether the check can run here, said in one line when it cannot,
cheap questions first (a GPU-less host answers without importing torch)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from gpu_targets import one_line

ROOT = Path(__file__).resolve().parent.parent
NO_CUDA_LINE = "no CUDA device: nothing to check"
EXIT_NO_CUDA, EXIT_MISSING = 3, 4
REQUIRED = ("numpy", "pandas", "rich", "torch")


def visible_gpus() -> int:
    """GPUs this host shows, by the rule the CLI's refusals use (commbench.backends.gpus.
    visible_gpus: CUDA_VISIBLE_DEVICES, the driver's /proc list, else /dev/nvidiaN), or -1
    when that cannot be asked (numpy absent: the preflight names what is missing)."""
    try:
        sys.path.insert(0, str(ROOT))
        from commbench.backends.gpus import visible_gpus as shared_rule
    except ImportError:
        return -1
    return shared_rule()


def preflight() -> tuple[int, str, dict]:
    """(0, "", env) when the check can run here, else (exit status, the one line saying what
    is missing, env). Cheap questions first: a GPU-less host answers without importing
    torch."""
    exe = sys.executable
    env: dict = {}
    gpus = visible_gpus()
    if gpus == 0:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        why = f"CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else "the NVIDIA driver lists no GPU"
        return EXIT_NO_CUDA, f"{NO_CUDA_LINE} ({why})", env
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if missing:
        return EXIT_MISSING, (f"{exe} lacks {', '.join(missing)}: run with an interpreter that has them "
                              f"(make gpu-check GPU_PY=/path/to/python)"), env
    try:
        import torch
    except Exception as e:  # noqa: BLE001 (a broken install: said in one line, not a traceback)
        return EXIT_MISSING, f"{exe}: torch fails to import ({type(e).__name__}: {one_line(e, 120)})", env
    env.update(torch=torch.__version__, cuda=torch.version.cuda, gpus=max(gpus, 0))
    if not torch.version.cuda:
        return EXIT_NO_CUDA, (f"{NO_CUDA_LINE} ({exe}'s torch {torch.__version__} is a CPU build: "
                              f"GPU_PY= an interpreter with a CUDA torch)"), env
    if not torch.cuda.is_available():
        return EXIT_NO_CUDA, f"{NO_CUDA_LINE} (torch {torch.__version__} with CUDA {torch.version.cuda} sees none)", env
    env["gpus"] = torch.cuda.device_count()
    env["cupy_ok"], env["cupy"] = cupy_state(env["cuda"])
    return 0, "", env


def cupy_state(cuda: str | None) -> tuple[bool, str]:
    """(usable, what): cupy importable, with NCCL, built for torch's CUDA major version."""
    try:
        import cupy
        from cupy.cuda import nccl  # noqa: F401 (the out-of-place all_reduce needs it)
    except Exception as e:  # noqa: BLE001 (absent, or broken: either way optional)
        return False, f"cupy is not importable ({type(e).__name__}: {one_line(e, 80)})"
    try:
        major = str(cupy.cuda.runtime.runtimeGetVersion() // 1000)  # e.g. 13000 -> 13
    except Exception as e:  # noqa: BLE001
        return False, f"cupy {cupy.__version__} cannot reach the CUDA runtime ({one_line(e, 80)})"
    if cuda and cuda.split(".")[0] != major:
        return False, f"cupy {cupy.__version__} is built for CUDA {major}, torch for CUDA {cuda}"
    return True, f"cupy {cupy.__version__} (CUDA {major})"
