"""Stand-in for einops (only imported by fla modules we do not run)."""
def _no(*a, **k):
    raise NotImplementedError("einops stub")
rearrange = reduce = repeat = einsum = _no
