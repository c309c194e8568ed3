/* The SoC HAL's tile stream (hw/soc.py, peripheral tile_array): the tile array's AXI4-Stream pair through
 * the tile-bus registers, with timeouts from the cycle counter. */
#include "hal.h"

#include "fw.h"
#include "soc_clock.h"
#include "somatile_soc.h"

static int wait_status(uint32_t bit, uint64_t deadline)
{
    while (!(REG(SOC_TILE_STATUS) & bit))
        if (now_cycles() >= deadline)
            return -1;
    return 0;
}

/* Answer frames still owed by the tile for commands whose answer timed out: the array answers every
 * command with exactly one frame, so a late answer (or the rest of one) is read and dropped before the next
 * answer, never taken for it. */
static unsigned owed_answers;

/* Read one answer frame up to its tlast beat into buf (at most cap bytes; the rest of a longer frame is read
 * and dropped, HAL_POP_OVERFLOW), *got the bytes stored; HAL_POP_TIMEOUT when a beat does not come before the
 * deadline. */
static int read_frame(uint8_t *buf, size_t cap, uint64_t deadline, size_t *got)
{
    int overflow = 0;

    *got = 0;
    for (;;) {
        uint32_t status, word;
        if (wait_status(SOC_TILE_STATUS_OUT, deadline) < 0)
            return HAL_POP_TIMEOUT;
        status = REG(SOC_TILE_STATUS);
        word = REG(SOC_TILE_RX);
        if (*got + 4 <= cap && !overflow) {
            fw_put_u32(buf + *got, word);
            *got += 4;
        } else {
            overflow = 1;
        }
        if (status & SOC_TILE_STATUS_LAST)
            return overflow ? HAL_POP_OVERFLOW : HAL_POP_OK;
    }
}

/* Drop the owed answers; -1 when one does not come before the deadline (it stays owed). A late answer
 * must leave before the next command goes in: a tile that still streams it accepts no new beats. */
static int drop_owed(uint64_t deadline)
{
    size_t dropped;

    while (owed_answers > 0) {
        if (read_frame(NULL, 0, deadline, &dropped) == HAL_POP_TIMEOUT)
            return -1;
        owed_answers--;
    }
    return 0;
}

int hal_stream_push(unsigned tile, const uint8_t *frame, size_t n)
{
    uint64_t deadline = deadline_after(FW_TILE_TIMEOUT_MS);
    size_t i;

    (void)tile; /* one stream pair reaches the whole array; it routes frames by their head byte */
    if (n == 0 || n % 4 != 0 || drop_owed(deadline) < 0)
        return -1;
    for (i = 0; i < n; i += 4) {
        if (wait_status(SOC_TILE_STATUS_ROOM, deadline) < 0)
            return -1;
        if (i + 4 == n)
            REG(SOC_TILE_TX_LAST) = fw_get_u32(frame + i);
        else
            REG(SOC_TILE_TX) = fw_get_u32(frame + i);
    }
    return 0;
}

int hal_stream_pop(unsigned tile, uint8_t *buf, size_t cap, uint32_t timeout_ms, size_t *got)
{
    int r = read_frame(buf, cap, deadline_after(timeout_ms), got);

    (void)tile;
    if (r == HAL_POP_TIMEOUT)
        owed_answers++;
    return r;
}
