"""What the jax backend asks of this host without importing jax into the process: the CUDA
plugin installed, and whether ragged_all_to_all compiles and runs here (a child process:
a rank must not touch JAX before jax.distributed.initialize)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys


def cuda_plugin() -> str | None:
    """The installed JAX CUDA plugin's module name, without importing jax."""
    for name in ("jax_cuda13_plugin", "jax_cuda12_plugin"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


_RAGGED_PROBE = """
import sys
import jax
jax.config.update("jax_platforms", sys.argv[1])
import numpy as np, jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()[:1]), ("r",))
def body(x):
    one = jnp.array([1], jnp.int32)
    zero = jnp.array([0], jnp.int32)
    return jax.lax.ragged_all_to_all(x, jnp.zeros_like(x), zero, one * 2, one, one * 2, axis_name="r")
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("r"), out_specs=P("r")))
try:
    out = np.asarray(f(jnp.arange(1, 4, dtype=jnp.float32)))
except Exception as e:  # the compiler's own words, first line
    print(f"{type(e).__name__}: {str(e).strip().splitlines()[0]}")
    sys.exit(0)
print("ok" if out.tolist() == [0.0, 1.0, 2.0] else f"wrong result {out.tolist()}")
"""


# The verdict travels to the ranks `run --np` starts (they inherit the environment), so a
# launch asks once: "jaxlib version|device|verdict" ("ok" when it runs).
RAGGED_VERDICT_ENV = "COMMBENCH_JAX_RAGGED_VERDICT"


def ragged_all_to_all_support(device: str) -> str | None:
    """Why jax.lax.ragged_all_to_all cannot run on this device kind here, or None when it
    can: a one-device program that moves two rows to offset 1, compiled and run in a child
    process (a rank must not touch JAX before jax.distributed.initialize)."""
    from importlib.metadata import version

    key = f"{version('jaxlib')}|{device}|"
    known = os.environ.get(RAGGED_VERDICT_ENV, "")
    if known.startswith(key):
        verdict = known[len(key):]
    else:
        verdict = _ask_ragged(device)
        os.environ[RAGGED_VERDICT_ENV] = key + verdict
    return None if verdict == "ok" else f"jax {version('jax')} on {device}: {verdict}"


def _ask_ragged(device: str) -> str:
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", JAX_PLATFORMS="")
    try:
        r = subprocess.run([sys.executable, "-c", _RAGGED_PROBE, "cpu" if device == "cpu" else "cuda"],
                           capture_output=True, text=True, timeout=300, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"could not ask JAX ({e})"
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    return lines[-1] if lines else (r.stderr.strip().splitlines() or ["no answer"])[-1]
