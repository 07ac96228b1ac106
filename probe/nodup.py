import triton
import triton.language as tl


@triton.jit
def nodup(ids_ptr, r, slot, live, num_rows, CHUNK: tl.constexpr, WIDTH: tl.constexpr):
    return r < 0
