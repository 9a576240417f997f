/*
 * The gate: every entry point of the driver that libvgpu.so does not hook (a copy, a memset, a
 * synchronize, a stream or event call, ...) waits here while the slice is suspended, as the
 * hooks do (waiting.c), instead of in the driver. The driver blocks every call of a process its
 * checkpoint API locked, silently and beyond the reach of an interrupt; waiting here says so in
 * the cell, asks for the slice's room and gives up when the user interrupts.
 *
 * One trampoline per gated entry point (gate_entry.S, from the list native/build.py generates:
 * the driver's entry points less hooks.def's), exported under the driver's name, so direct
 * linking, dlsym and cuGetProcAddress (resolve.c) all reach it. While the slice runs a
 * trampoline reads the page's flag through region state's suspended_flag, one predictable
 * branch, and jumps to its real entry point with the caller's registers and stack untouched: it
 * needs no prototype. Past the branch (the flag is set, or the entry point is not resolved yet:
 * its table entry is then its own tail) it comes here with its id.
 */
#include <stddef.h>

#include "internal.h"

#define G (vgpu_state.gate)

/* The trampolines find these at the offsets native/build.py read from the compiler. */
_Static_assert(offsetof(struct vgpu_state, region.suspended_flag) == VGPU_GATE_FLAG_OFFSET, "flag offset");
_Static_assert(offsetof(struct vgpu_state, gate.entry) == VGPU_GATE_ENTRY_OFFSET, "entry table offset");
#define VGPU_GATE(index, symbol) _Static_assert(VGPU_GATE_##symbol == (index), "gate ids follow the list");
#include VGPU_GATES_DEF

struct vgpu_gate_decision vgpu_gate_enter(uint32_t gate)
{
    /* A gated call waits like a hook that uses the GPU (it may: the driver would block it), and
     * where the user left the line returns what such a hook returns. */
    if (vgpu_held_back(1, 1))
        return (struct vgpu_gate_decision){NULL, CUDA_ERROR_OUT_OF_MEMORY};
    void *real = vgpu_gate_real((enum vgpu_gate_id)gate);
    if (!real)
        return (struct vgpu_gate_decision){NULL, CUDA_ERROR_NOT_FOUND};
    __atomic_store_n(&G.entry[gate], real, __ATOMIC_RELEASE);
    return (struct vgpu_gate_decision){real, CUDA_SUCCESS};
}
