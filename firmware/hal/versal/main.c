/* somatile firmware on the Versal processing system (Cortex-R5F): the UART's bit rate, the cycle counter and
 * the AXI DMA set up, then the wire protocol served for ever (fw_run returns only when the link fails, which a
 * UART never does; a new fw_init would then start over like a reset). */
#include "fw.h"
#include "hal_versal.h"

#ifndef FW_UART_REF_HZ
#error "FW_UART_REF_HZ (the PS UART's reference clock in Hz) must be defined by the build"
#endif
#ifndef FW_BAUD
#error "FW_BAUD (the link's bit rate) must be defined by the build"
#endif

#define REG(address) (*(volatile uint32_t *)(uintptr_t)(address))

/* PL011: 8 data bits, no parity, FIFOs on; divisor ref / (16 * baud) in 16.6 fixed point, rounded. */
static void uart_init(void)
{
    uint32_t div64 = (uint32_t)(((uint64_t)FW_UART_REF_HZ * 8u / FW_BAUD + 1u) / 2u);
    REG(VERSAL_UART_BASE + 0x30u) = 0;              /* UARTCR: off while it is set up */
    REG(VERSAL_UART_BASE + 0x24u) = div64 >> 6;     /* UARTIBRD */
    REG(VERSAL_UART_BASE + 0x28u) = div64 & 63u;    /* UARTFBRD */
    REG(VERSAL_UART_BASE + 0x2Cu) = (3u << 5) | (1u << 4); /* UARTLCR_H: WLEN 8, FEN */
    REG(VERSAL_UART_BASE + 0x30u) = 1u | (1u << 8) | (1u << 9); /* UARTEN, TXE, RXE */
}

int main(void)
{
    static struct fw_device dev;

    uart_init();
    hal_versal_init();
    for (;;) {
        fw_init(&dev);
        fw_run(&dev);
    }
}
