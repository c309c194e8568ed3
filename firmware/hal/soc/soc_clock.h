/* What the SoC HAL's parts share (hw/soc.py): register access and time from the CPU's cycle counter.
 * FW_CLOCK_HZ is the SoC clock the build was made for. */
#ifndef SOMATILE_SOC_CLOCK_H
#define SOMATILE_SOC_CLOCK_H

#include <stdint.h>

#ifndef FW_CLOCK_HZ
#error "FW_CLOCK_HZ (the SoC clock in Hz) must be defined by the build"
#endif

#define REG(address) (*(volatile uint32_t *)(address))

static inline uint64_t now_cycles(void)
{
    uint32_t hi, lo, again;
    /* The high word may tick between the two reads: read it again until it did not. */
    do {
        __asm__ volatile("rdcycleh %0" : "=r"(hi));
        __asm__ volatile("rdcycle %0" : "=r"(lo));
        __asm__ volatile("rdcycleh %0" : "=r"(again));
    } while (hi != again);
    return ((uint64_t)hi << 32) | lo;
}

static inline uint64_t deadline_after(uint32_t timeout_ms)
{
    return now_cycles() + (uint64_t)timeout_ms * (FW_CLOCK_HZ / 1000u);
}

#endif
