"""Test configuration shared by every test file.

Triton's interpreter must be chosen before triton is first imported; without a GPU the
kernel tests run through it. Hypothesis runs without deadlines: the interpreter and the
2-core CI machine make per-example times noisy.
"""

import os
import shutil

if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
# torch and JAX share the GPU in one test process: no JAX preallocation of 75% of it
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
