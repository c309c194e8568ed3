/* Linker script of the Versal processing-system build (preprocessed: the regions come from the generated
 * somatile_versal.h, boards/vivado.py FIRMWARE_MEMORY; the Cortex-R5F's TCMs at their local addresses): code
 * and constants in the ATCM from the vectors at 0, data, .bss and the stack in the BTCM, the DMA bounce
 * buffers (section .dma) in the on-chip memory, which the PL's AXI DMA reaches at the same address (its
 * window in the block design, ADDRESS_MAP). An image that does not fit fails here with "region ... overflowed". */
#include "somatile_versal.h"

OUTPUT_ARCH(arm)
ENTRY(_start)

MEMORY
{
    ATCM (rx) : ORIGIN = VERSAL_ATCM_BASE, LENGTH = VERSAL_ATCM_BYTES
    BTCM (rw) : ORIGIN = VERSAL_BTCM_BASE, LENGTH = VERSAL_BTCM_BYTES
    OCM (rw)  : ORIGIN = VERSAL_OCM_BASE, LENGTH = VERSAL_OCM_BYTES
}

STACK_BYTES = 8K;

SECTIONS
{
    .vectors : { KEEP(*(.vectors)) } > ATCM
    .text : { *(.text .text.*) } > ATCM
    .rodata : { *(.rodata .rodata.*) } > ATCM
    .ARM.exidx : { *(.ARM.exidx* .gnu.linkonce.armexidx.*) } > ATCM
    .data : { *(.data .data.*) } > BTCM
    .bss (NOLOAD) : {
        . = ALIGN(4);
        __bss_start = .;
        *(.bss .bss.* COMMON)
        . = ALIGN(4);
        __bss_end = .;
    } > BTCM
    __stack_top = ORIGIN(BTCM) + LENGTH(BTCM);
    ASSERT(__stack_top - __bss_end >= STACK_BYTES, "BTCM: no room for the stack")
    .dma (NOLOAD) : { *(.dma) } > OCM
    /DISCARD/ : { *(.comment) *(.ARM.attributes) }
}
