/* Linker script of the SoC build (preprocessed: SOC_CODE_BYTES and SOC_DATA_BYTES come from the board's
 * soc section). Code memory holds the image: code, constants and initialised data. Data memory holds
 * .bss and the stack (at its top). An image that does not fit fails here with "region ... overflowed". */
#include "somatile_soc.h"

OUTPUT_ARCH(riscv)
ENTRY(_start)

MEMORY
{
    CODE (rwx) : ORIGIN = SOC_CODE_BASE, LENGTH = SOC_CODE_BYTES
    DATA (rw)  : ORIGIN = SOC_DATA_BASE, LENGTH = SOC_DATA_BYTES
}

SECTIONS
{
    .text : { KEEP(*(.text.start)) *(.text .text.*) } > CODE
    .rodata : { *(.rodata .rodata.* .srodata .srodata.*) } > CODE
    .data : { *(.data .data.* .sdata .sdata.*) } > CODE
    __image_end = .;
    .bss (NOLOAD) : {
        . = ALIGN(4);
        __bss_start = .;
        *(.bss .bss.* .sbss .sbss.* COMMON)
        . = ALIGN(4);
        __bss_end = .;
    } > DATA
    __stack_top = ORIGIN(DATA) + LENGTH(DATA);
    /* The stack needs room below its top: SOC_STACK_BYTES (the firmware's deepest call chain with its
     * 4 KB chunk buffer is well inside it). */
    ASSERT(__stack_top - __bss_end >= SOC_STACK_BYTES, "data memory: no room for the stack (soc.data_kib)")
    /DISCARD/ : { *(.comment) *(.riscv.attributes) }
}
