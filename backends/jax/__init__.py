"""JAX backend (issue 4): jax arrays -> launch plan -> jax-triton or the interpreter."""
