/* The link read of a UART HAL (hal/soc, hal/versal): the bytes that arrive while they keep coming, up to cap;
 * 0 when none came before the deadline. The HAL gives `take` (one received byte, or -1 when none waits) and
 * `now` (its clock, in the deadline's units); both are its own static functions, so the compiler inlines
 * them into this loop. */
#ifndef SOMATILE_HAL_UART_H
#define SOMATILE_HAL_UART_H

#include <stddef.h>
#include <stdint.h>

static inline int hal_uart_read(uint8_t *buf, size_t cap, uint64_t deadline, int (*take)(void),
                                uint64_t (*now)(void))
{
    size_t n = 0;

    for (;;) {
        int byte = take();
        if (byte >= 0) {
            buf[n++] = (uint8_t)byte;
            if (n == cap)
                return (int)n;
            continue;
        }
        if (n > 0)
            return (int)n;
        if (now() >= deadline)
            return 0;
    }
}

#endif
