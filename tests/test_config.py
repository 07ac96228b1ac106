"""``CacheConfig`` as a value: its numbers stored as Python ints whatever integer type they
came as (the JAX runner hands them to the ops as they are), and a hash that a pickled copy
recomputes (``jax.jit`` takes the config as a static argument)."""

import os
import pickle
import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from mamba_align.backends import jax as mj
from mamba_align.core import CacheConfig, ConvSpec, TemporalSpec


def numpy_config():
    i = np.int64
    return CacheConfig(i(4), i(2), i(1), {"conv": ConvSpec(i(3), i(2)),
                                          "ssm": TemporalSpec((i(2), np.int32(3)))})


def test_numpy_integers_are_stored_as_python_ints():
    cfg = numpy_config()
    values = (cfg.block_size, cfg.num_spec, cfg.num_layers, cfg.states["conv"].kernel_size,
              cfg.states["conv"].dim, *cfg.states["ssm"].shape)
    assert values == (4, 2, 1, 3, 2, 2, 3) and all(type(v) is int for v in values)
    assert cfg == CacheConfig(4, 2, 1, {"conv": ConvSpec(3, 2), "ssm": TemporalSpec((2, 3))})


def test_the_jax_runner_takes_a_config_of_numpy_integers():
    # it had passed np.int64(4) on to the ops, which refused it as "not an int"
    cfg = numpy_config()
    state = mj.add_requests(mj.init_state(1), jnp.array([0], jnp.int32),
                            jnp.array([5], jnp.int32), config=cfg)
    assert np.asarray(state.state_idx).tolist() == [1]


def test_a_pickled_config_hashes_as_an_equal_one_made_there():
    # a cached hash carried through pickle into another process (string hashes differ
    # between processes) made equal configs hash unequal there
    cfg = numpy_config()
    hash(cfg)
    code = ("import pickle, sys; from mamba_align.core import CacheConfig, ConvSpec, "
            "TemporalSpec; c = pickle.loads(sys.stdin.buffer.read()); "
            "d = CacheConfig(4, 2, 1, {'conv': ConvSpec(3, 2), 'ssm': TemporalSpec((2, 3))}); "
            "print(c == d, hash(c) == hash(d), {d: 1}.get(c))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(cfg),
                         capture_output=True, check=True,
                         env=dict(os.environ, PYTHONHASHSEED="random"))  # (not a fixed seed)
    assert out.stdout.decode().split() == ["True", "True", "1"]
    assert pickle.loads(pickle.dumps(cfg)) == cfg
