/* Reset entry of the SoC build: stack at the top of data memory, .bss cleared, then main (which does not
 * return; if it did, the CPU waits here). .data needs no copy: the code memory holding it is RAM whose
 * initial contents are the image. */
    .section .text.start, "ax"
    .global _start
_start:
    la sp, __stack_top
    la t0, __bss_start
    la t1, __bss_end
1:  bgeu t0, t1, 2f
    sw zero, 0(t0)
    addi t0, t0, 4
    j 1b
2:  call main
3:  j 3b
