/* The SoC HAL's link (hw/soc.py): the UART. The tile stream is hal_tile_bus.c (the tile array) or
 * hal/soc_hccs/ (the HCCS unit behind the command layer in firmware). Registers and their semantics:
 * somatile_soc.h (generated from hw/soc_map.py; documented in hw/soc.py). */
#include "hal.h"

#include "fw.h"
#include "hal_uart.h"
#include "soc_clock.h"
#include "somatile_soc.h"

static int take_byte(void)
{
    uint32_t v = REG(SOC_UART_DATA);
    return v == SOC_UART_EMPTY ? -1 : (int)(v & 0xFFu);
}

int hal_link_read(uint8_t *buf, size_t cap, uint32_t timeout_ms)
{
    return hal_uart_read(buf, cap, deadline_after(timeout_ms), take_byte, now_cycles);
}

int hal_link_write(const uint8_t *buf, size_t n)
{
    size_t i;
    /* A UART cannot tell whether anybody listens: the write always succeeds (the store waits while the
     * previous byte is sent). */
    for (i = 0; i < n; i++)
        REG(SOC_UART_DATA) = buf[i];
    return 0;
}

