/*
 * The gate's trampolines (gate.c): one per entry point of the generated gate list
 * (VGPU_GATES_DEF), exported under the driver's name. While the slice runs, a trampoline loads
 * the page's suspended flag through region state's suspended_flag (never NULL), branches once
 * (not taken) and tail-jumps through its entry in the gate's table: the caller's arguments,
 * stack and return address reach the driver untouched, whatever the prototype. Taken (the flag is
 * set), or jumped to through a table entry not resolved yet, its tail passes its id to
 * vgpu_gate_slow, which keeps the argument registers (integer and vector) across
 * vgpu_gate_enter and then jumps where it says, or returns its status.
 *
 * The offsets come from native/build.py, which reads them from the compiler
 * (VGPU_GATE_FLAG_OFFSET, VGPU_GATE_ENTRY_OFFSET; gate.c asserts them).
 */

#if defined(__x86_64__)

#if defined(__CET__)
#define VGPU_LANDING endbr64
#else
#define VGPU_LANDING
#endif

    .hidden vgpu_state
    .hidden vgpu_gate_enter

    .macro VGPU_TRAMPOLINE name, index
    .text
    .globl \name
    .type \name, @function
    .p2align 4
\name:
    .cfi_startproc
    VGPU_LANDING
    movq vgpu_state+VGPU_GATE_FLAG_OFFSET(%rip), %rax
    cmpl $0, (%rax)
    jne 1f
    jmpq *vgpu_state+VGPU_GATE_ENTRY_OFFSET+8*\index(%rip)
1:
    .globl vgpu_gate_tail_\name
    .hidden vgpu_gate_tail_\name
vgpu_gate_tail_\name:
    VGPU_LANDING
    movl $\index, %eax
    jmp vgpu_gate_slow
    .cfi_endproc
    .size \name, .-\name
    .globl vgpu_gate_\name
    .hidden vgpu_gate_\name
    .set vgpu_gate_\name, \name
    .endm

    .text
    .p2align 4
    .type vgpu_gate_slow, @function
vgpu_gate_slow:
    .cfi_startproc
    /* Entry: rsp = 8 (mod 16), the trampoline's caller's return address on top; eax = id. */
    pushq %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rbp, 0
    movq %rsp, %rbp
    .cfi_def_cfa_register %rbp
    subq $176, %rsp
    movq %rdi, 0(%rsp)
    movq %rsi, 8(%rsp)
    movq %rdx, 16(%rsp)
    movq %rcx, 24(%rsp)
    movq %r8, 32(%rsp)
    movq %r9, 40(%rsp)
    movaps %xmm0, 48(%rsp)
    movaps %xmm1, 64(%rsp)
    movaps %xmm2, 80(%rsp)
    movaps %xmm3, 96(%rsp)
    movaps %xmm4, 112(%rsp)
    movaps %xmm5, 128(%rsp)
    movaps %xmm6, 144(%rsp)
    movaps %xmm7, 160(%rsp)
    movl %eax, %edi
    call vgpu_gate_enter
    movq %rax, %r11
    movq %rdx, %r10
    movq 0(%rsp), %rdi
    movq 8(%rsp), %rsi
    movq 16(%rsp), %rdx
    movq 24(%rsp), %rcx
    movq 32(%rsp), %r8
    movq 40(%rsp), %r9
    movaps 48(%rsp), %xmm0
    movaps 64(%rsp), %xmm1
    movaps 80(%rsp), %xmm2
    movaps 96(%rsp), %xmm3
    movaps 112(%rsp), %xmm4
    movaps 128(%rsp), %xmm5
    movaps 144(%rsp), %xmm6
    movaps 160(%rsp), %xmm7
    movq %rbp, %rsp
    popq %rbp
    .cfi_def_cfa %rsp, 8
    .cfi_restore %rbp
    testq %r11, %r11
    jz 2f
    /* As if the program had called the driver: its frame and return address. */
    jmp *%r11
2:
    movl %r10d, %eax
    ret
    .cfi_endproc
    .size vgpu_gate_slow, .-vgpu_gate_slow

#elif defined(__aarch64__)

#if defined(__ARM_FEATURE_BTI_DEFAULT)
#define VGPU_LANDING_CALL hint #34 /* bti c */
#define VGPU_LANDING_JUMP hint #36 /* bti j */
#else
#define VGPU_LANDING_CALL
#define VGPU_LANDING_JUMP
#endif

    .hidden vgpu_state
    .hidden vgpu_gate_enter

    /* x16 and x17, the intra-procedure-call scratch registers, are the trampolines' own. */
    .macro VGPU_TRAMPOLINE name, index
    .text
    .globl \name
    .type \name, %function
    .p2align 4
\name:
    .cfi_startproc
    VGPU_LANDING_CALL
    adrp x16, vgpu_state+VGPU_GATE_FLAG_OFFSET
    ldr x16, [x16, #:lo12:vgpu_state+VGPU_GATE_FLAG_OFFSET]
    ldr w17, [x16]
    cbnz w17, 1f
    adrp x16, vgpu_state+VGPU_GATE_ENTRY_OFFSET+8*\index
    ldr x16, [x16, #:lo12:vgpu_state+VGPU_GATE_ENTRY_OFFSET+8*\index]
    br x16
1:
    .globl vgpu_gate_tail_\name
    .hidden vgpu_gate_tail_\name
vgpu_gate_tail_\name:
    VGPU_LANDING_JUMP
    mov w16, #\index
    b vgpu_gate_slow
    .cfi_endproc
    .size \name, .-\name
    .globl vgpu_gate_\name
    .hidden vgpu_gate_\name
    .set vgpu_gate_\name, \name
    .endm

    .text
    .p2align 4
    .type vgpu_gate_slow, %function
vgpu_gate_slow:
    .cfi_startproc
    /* w16 = id; x0-x7 and q0-q7 carry arguments, x8 an indirect result's address. */
    stp x29, x30, [sp, #-224]!
    .cfi_def_cfa_offset 224
    .cfi_offset 29, -224
    .cfi_offset 30, -216
    mov x29, sp
    stp x0, x1, [sp, #16]
    stp x2, x3, [sp, #32]
    stp x4, x5, [sp, #48]
    stp x6, x7, [sp, #64]
    str x8, [sp, #80]
    stp q0, q1, [sp, #96]
    stp q2, q3, [sp, #128]
    stp q4, q5, [sp, #160]
    stp q6, q7, [sp, #192]
    mov w0, w16
    bl vgpu_gate_enter
    mov x16, x0
    mov x17, x1
    ldp x0, x1, [sp, #16]
    ldp x2, x3, [sp, #32]
    ldp x4, x5, [sp, #48]
    ldp x6, x7, [sp, #64]
    ldr x8, [sp, #80]
    ldp q0, q1, [sp, #96]
    ldp q2, q3, [sp, #128]
    ldp q4, q5, [sp, #160]
    ldp q6, q7, [sp, #192]
    ldp x29, x30, [sp], #224
    .cfi_restore 29
    .cfi_restore 30
    .cfi_def_cfa_offset 0
    cbz x16, 2f
    /* As if the program had called the driver: its link register. */
    br x16
2:
    mov w0, w17
    ret
    .cfi_endproc
    .size vgpu_gate_slow, .-vgpu_gate_slow

#else
#error "libvgpu.so's gate exists for x86-64 and aarch64 only"
#endif

#define VGPU_GATE(index, symbol) VGPU_TRAMPOLINE symbol, index
#include VGPU_GATES_DEF

    .section .note.GNU-stack, "", %progbits
