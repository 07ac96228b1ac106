"""What the backend-error tests share: arrays of one backend by the same recipe (``Args``)
and a small two-pool config."""

import jax.numpy as jnp
import numpy as np
import torch

from mamba_align.backends import jax as mj
from mamba_align.backends.torch import ops as tops
from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec

DEV = "cuda" if torch.cuda.is_available() else "cpu"


class Args:
    """Arrays of one backend, by the same recipe: ``ids`` int, ``f32`` float, ``flags``
    bool; ``op(name)`` the backend's function for a kernel op."""

    def __init__(self, name):
        self.name = name

    def ids(self, *v, shape=None):
        a = np.array(v, np.int64).reshape(shape or (len(v),))
        return torch.as_tensor(a, device=DEV) if self.name == "torch" else jnp.asarray(a, jnp.int32)

    def f32(self, *shape):
        a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        return torch.as_tensor(a, device=DEV) if self.name == "torch" else jnp.asarray(a)

    def flags(self, n, dtype=bool):
        a = np.ones(n, dtype)
        return torch.as_tensor(a, device=DEV) if self.name == "torch" else jnp.asarray(a)

    def err(self):
        """A clear error flag."""
        a = np.array([0, 2**31 - 1], np.int32)
        return torch.as_tensor(a, device=DEV) if self.name == "torch" else jnp.asarray(a)

    def op(self, name):
        # every op updates something in place: torch names it with a trailing underscore
        return getattr(tops, name + "_") if self.name == "torch" else getattr(mj.ops, name)


CFG = CacheConfig(4, 1, 1, {"conv": ConvSpec(3, 4, "SD", "bfloat16"),
                            "ssm": TemporalSpec((2, 2), "float32")})
