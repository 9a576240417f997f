/*
 * The exported `dlsym`. glibc's dlsym resolves RTLD_NEXT relative to its caller's return
 * address, so an override written as an ordinary C function that calls the real dlsym would
 * make every RTLD_NEXT lookup of the program (or of another preloaded library) resolve
 * relative to libvgpu.so instead. This entry point therefore only asks the C filter
 * (vgpu_dlsym_filter in resolve.c) what to do, and for every name that is not one of our hooks
 * TAIL-JUMPS to the real dlsym with the original arguments, stack and return address, as if the
 * program had called it directly.
 *
 * The filter returns a two-pointer struct in registers (rax:rdx on x86-64, x0:x1 on aarch64):
 * { result, forward_to }. forward_to != NULL: jump there with the caller's arguments;
 * otherwise return `result`.
 */

#if defined(__x86_64__)

    .text
    .globl dlsym
    .type dlsym, @function
    .p2align 4
dlsym:
    .cfi_startproc
#if defined(__CET__)
    endbr64
#endif
    /* Entry: rsp = 8 (mod 16). Save the two arguments and realign for the call. */
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    call vgpu_dlsym_filter
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    testq %rdx, %rdx
    jz 1f
    /* Not ours: the real dlsym runs with our caller's frame and return address. */
    jmp *%rdx
1:
    ret
    .cfi_endproc
    .size dlsym, .-dlsym

#elif defined(__aarch64__)

    .text
    .globl dlsym
    .type dlsym, %function
    .p2align 4
dlsym:
    .cfi_startproc
#if defined(__ARM_FEATURE_BTI_DEFAULT)
    hint #34 /* bti c */
#endif
    stp x29, x30, [sp, #-32]!
    .cfi_def_cfa_offset 32
    .cfi_offset 29, -32
    .cfi_offset 30, -24
    mov x29, sp
    stp x0, x1, [sp, #16]
    bl vgpu_dlsym_filter
    cbz x1, 1f
    /* Not ours: restore arguments and the caller's link register, then branch. x16 is the
     * intra-procedure-call scratch register, allowed as a BTI "call" target source. */
    mov x16, x1
    ldp x0, x1, [sp, #16]
    ldp x29, x30, [sp], #32
    .cfi_restore 29
    .cfi_restore 30
    .cfi_def_cfa_offset 0
    br x16
1:
    ldp x29, x30, [sp], #32
    .cfi_restore 29
    .cfi_restore 30
    .cfi_def_cfa_offset 0
    ret
    .cfi_endproc
    .size dlsym, .-dlsym

#else
#error "libvgpu.so's dlsym entry point exists for x86-64 and aarch64 only"
#endif

    .section .note.GNU-stack, "", %progbits
