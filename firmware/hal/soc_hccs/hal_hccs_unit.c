/* The SoC HAL's tile stream for an SoC whose peripheral is the HCCS unit alone (hw/soc.py, peripheral
 * hccs_unit): a command frame pushed is executed by the command layer in firmware (src/soft_tile.c) at once,
 * and its response waits here for the pop. The layer's HCCS rows go through the unit's registers. */
#include <string.h>

#include "hal.h"

#include "fw.h"
#include "soc_clock.h"
#include "soft_tile.h"
#include "somatile_soc.h"

static uint8_t response[SOFT_TILE_ANSWER_BYTES];
static uint32_t response_len;

/* Probabilities of a row that timed out, still owed by the unit: read and dropped before the next row, so
 * that a late one is never taken for the next row's. */
static uint32_t owed;

static int pop(uint32_t *value, uint64_t deadline)
{
    for (;;) {
        uint32_t word = REG(SOC_HCCS_OUT);
        if (word & SOC_HCCS_OUT_VALID) {
            *value = word;
            return 0;
        }
        if (now_cycles() >= deadline)
            return -1;
    }
}

static int push(uint32_t reg, uint8_t element, uint64_t deadline)
{
    while (!(REG(SOC_HCCS_STATUS) & SOC_HCCS_STATUS_ROOM))
        if (now_cycles() >= deadline)
            return -1;
    REG(reg) = element;
    return 0;
}

int soft_tile_normalise(uint8_t head, const struct soft_tile_hccs *p, const uint8_t *x, uint32_t rows,
                        uint32_t n, uint32_t stride, uint8_t *out, unsigned out_bytes)
{
    uint64_t deadline = deadline_after(FW_TILE_TIMEOUT_MS);
    uint32_t r, i, value;

    for (; owed > 0; owed--)
        if (pop(&value, deadline) < 0)
            return -1;
    REG(SOC_HCCS_HEAD) = head;
    REG(SOC_HCCS_CFG) = (p->B << SOC_HCCS_CFG_B_SHIFT) | (p->out << SOC_HCCS_CFG_OUT_SHIFT) |
                        (p->S << SOC_HCCS_CFG_S_SHIFT) | (p->mode << SOC_HCCS_CFG_MODE_SHIFT) |
                        (p->dmax << SOC_HCCS_CFG_DMAX_SHIFT);
    /* A row at a time: a whole row always fits the unit's free bank, so the pushes never wait on pops. */
    for (r = 0; r < rows; r++) {
        const uint8_t *row = x + r * stride;
        uint8_t *probs = out + r * stride * out_bytes;
        for (i = 0; i < n; i++)
            if (push(i + 1 == n ? SOC_HCCS_IN_LAST : SOC_HCCS_IN, row[i], deadline) < 0)
                return -1; /* the unit takes no element: a framing fault it reports itself */
        for (i = 0; i < n; i++) {
            if (pop(&value, deadline) < 0) {
                owed = n - i;
                return -1;
            }
            probs[out_bytes * i] = (uint8_t)value;
            if (out_bytes == 2)
                probs[2 * i + 1] = (uint8_t)(value >> 8);
        }
    }
    return 0;
}

uint32_t soft_tile_cycles(void)
{
    return (uint32_t)now_cycles();
}

int hal_stream_push(unsigned tile, const uint8_t *frame, size_t n)
{
    (void)tile; /* one unit, one command layer */
    response_len = soft_tile_command(frame, (uint32_t)n, response);
    return response_len ? 0 : -1;
}

int hal_stream_pop(unsigned tile, uint8_t *buf, size_t cap, uint32_t timeout_ms, size_t *got)
{
    uint32_t length = response_len;

    (void)tile;
    (void)timeout_ms; /* the response is complete when the push returns */
    response_len = 0;
    *got = length < cap ? length : cap;
    memcpy(buf, response, *got);
    if (length == 0)
        return HAL_POP_TIMEOUT;
    return length > cap ? HAL_POP_OVERFLOW : HAL_POP_OK;
}
