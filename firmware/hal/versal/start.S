/* Reset entry of the Versal processing-system build (Cortex-R5F, ARMv7-R, low vectors at 0 in the ATCM): the
 * VFP on (the hard-float ABI may use its registers), a stack at the top of the BTCM, .bss cleared, then main,
 * which does not return. .data needs no copy: the loader (JTAG or the boot image) places it where it runs. */
    .syntax unified
    .arm
    .section .vectors, "ax"
    .global _vectors
_vectors:
    b _start
    b .     /* undefined instruction */
    b .     /* supervisor call */
    b .     /* prefetch abort */
    b .     /* data abort */
    b .
    b .     /* IRQ: none are enabled */
    b .     /* FIQ */

    .text
    .global _start
_start:
    mrc p15, 0, r0, c1, c0, 2       /* CPACR: full access to cp10 and cp11 (the VFP) */
    orr r0, r0, #(0xf << 20)
    mcr p15, 0, r0, c1, c0, 2
    isb
    mov r0, #(1 << 30)              /* FPEXC.EN */
    vmsr fpexc, r0
    ldr sp, =__stack_top
    ldr r0, =__bss_start
    ldr r1, =__bss_end
    mov r2, #0
1:  cmp r0, r1
    strlo r2, [r0], #4
    blo 1b
    bl main
2:  b 2b
