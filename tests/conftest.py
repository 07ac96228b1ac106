"""Test configuration shared by every test file.

Triton's interpreter must be chosen before triton is first imported; without a GPU the
kernel tests run through it. Hypothesis runs without deadlines: the interpreter and the
2-core CI machine make per-example times noisy.

NumPy's deprecated conversion of a one-element array to a Python scalar is an error here,
in this process and in the scripts the tests start: NumPy 2.5 makes it one, and Triton's
interpreter made it (kernels/interpret.py), so the suite fails on it whatever NumPy is
installed.
"""

import os
import pathlib
import shutil
import warnings

_SCALAR_CONVERSION = "error:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
warnings.filterwarnings("error", message="Conversion of an array with ndim > 0 to a scalar",
                        category=DeprecationWarning)
os.environ["PYTHONWARNINGS"] = ",".join(
    w for w in (os.environ.get("PYTHONWARNINGS"), _SCALAR_CONVERSION) if w)

if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
# torch and JAX share the GPU in one test process: no JAX preallocation of 75% of it
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


class _RootIsNotATestPackage:
    """The repository root is the package ``mamba_align`` (its ``__init__.py`` sits there),
    so pytest would collect it as a test package and import it under the checkout folder's
    name: a second copy of the library (``main.core``, ...) or, in a folder such as
    ``mamba-align``, an import error in every test. The tests import the installed
    ``mamba_align`` instead; the root is collected as a plain directory."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path, parent):
        if path == ROOT:
            return pytest.Dir.from_parent(parent, path=path)
        return None


def pytest_configure(config):
    # registered as a plugin, not a conftest hook: conftest hooks only see paths below
    # tests/, and the root is collected above it
    config.pluginmanager.register(_RootIsNotATestPackage(), "mamba-align-root-dir")


settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(params=["reference", "torch", "jax"])
def backend(request):
    """Each operation checked three ways: the core reference, torch and JAX."""
    from support import make_backend

    return make_backend(request.param)


@pytest.fixture(params=["torch", "jax"])
def device_backend(request):
    """The kernels only (torch and JAX): behaviour the core rejects instead of running."""
    from support import make_backend

    return make_backend(request.param)
