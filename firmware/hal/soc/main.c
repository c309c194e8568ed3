/* somatile firmware on the SoC (hw/soc.py): set the UART's bit rate, then serve the wire protocol for ever.
 * fw_run returns only when the link fails, which a UART never does; a new fw_init would then start over
 * like a reset. */
#include "fw.h"
#include "somatile_soc.h"

#ifndef FW_UART_DIV
#error "FW_UART_DIV (clock cycles per UART bit) must be defined by the build"
#endif

int main(void)
{
    static struct fw_device dev;

    *(volatile uint32_t *)SOC_UART_DIV = FW_UART_DIV;
    for (;;) {
        fw_init(&dev);
        fw_run(&dev);
    }
}
