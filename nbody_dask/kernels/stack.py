"""Stack alignment for the CPU kernels whose inner loops spill SIMD registers (no Dask).

LLVM compiles Numba's functions for the x86-64 ABI, which promises a 16-byte aligned stack
at each call, and spills 32-byte (AVX) registers with unaligned moves to 16-byte aligned
slots. Where the stack pointer happens to sit 16 bytes off a 32-byte boundary, a loop with
many spills pays for loads and stores that straddle cache lines on every iteration. That
offset depends on the frames above the kernel (the Python interpreter's, the threading
layer's, the callers'), so the same machine code ran 1.3x slower or faster depending on
whether it was called from the main thread or a worker, and on whether its callers had
been freshly compiled or loaded from Numba's cache (which links callees differently).
:func:`align_stack` makes the function that calls it realign its own frame on entry.
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

__all__ = ["STACK_ALIGNMENT", "align_stack"]

#: Bytes to which a kernel calling :func:`align_stack` aligns its frame: a cache line,
#: so that no spill slot of a 32- or 64-byte register straddles two.
STACK_ALIGNMENT = 64


@intrinsic
def align_stack(typingctx):
    """Mark the calling kernel (the LLVM function being compiled) to realign its stack
    frame to :data:`STACK_ALIGNMENT` bytes on entry; generates no code where it is called.
    Call it first in a CPU kernel whose inner loop spills SIMD registers."""

    def codegen(context, builder, signature, args):
        attributes = builder.function.attributes
        attributes.alignstack = STACK_ALIGNMENT
        # llvmlite writes a function's attributes only when its set of named ones is not
        # empty; Numba's functions report errors by return code and never unwind
        attributes.add("nounwind")
        return context.get_dummy_value()

    return types.none(), codegen
