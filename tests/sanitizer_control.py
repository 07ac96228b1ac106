"""A planted out-of-bounds store, for ``make sanitize``: memcheck must report it, which
shows that the clean runs beside it could have failed (one element past a tensor of its
own allocation: PYTORCH_NO_CUDA_MEMORY_CACHING=1 makes every tensor one)."""

import torch
import triton
import triton.language as tl


@triton.jit
def store_past_the_end(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, i.to(tl.float32), mask=i <= n)  # i == n is one past the end


x = torch.zeros(1000, device="cuda")
store_past_the_end[(1,)](x, x.numel(), BLOCK=1024)
torch.cuda.synchronize()
print("launched")
