/* HAL of the fuzz build: no I/O. The link's output is parsed again by a second frame parser, so that every
 * answer the firmware sends must be a well-formed frame (checked with abort(), which the fuzzer reports).
 * The tile answers every command at once: a bare OK header, or, for commands whose first payload byte is
 * odd, a header followed by the command's payload (so answers of every size up to the limit occur). */
#include <stdlib.h>
#include <string.h>

#include "fw.h"
#include "hal.h"

static uint8_t check_buffer[FW_FRAME_BYTES];
static struct fw_parser checker;
static int checker_ready;
static uint8_t last_command[FW_FRAME_BYTES];
static size_t last_command_len;
/* What the inputs reached, so that a run shows it got past the CRC check (driver.c prints them). */
unsigned long fuzz_answers, fuzz_tile_commands;

int hal_link_write(const uint8_t *buf, size_t n)
{
    size_t i;
    if (!checker_ready) {
        fw_parser_init(&checker, check_buffer, FW_MAX_PAYLOAD);
        checker_ready = 1;
    }
    for (i = 0; i < n; i++) {
        enum fw_event e = fw_parser_push(&checker, buf[i]);
        if (e == FW_EVENT_BAD)
            abort();
        if (e == FW_EVENT_FRAME && i + 1 != n)
            abort(); /* one write is exactly one frame */
    }
    if (fw_parser_mid_frame(&checker))
        abort();
    fuzz_answers++;
    return 0;
}

int hal_stream_push(unsigned tile, const uint8_t *frame, size_t n)
{
    if (tile >= SOMATILE_N_TILES || n > sizeof last_command)
        abort();
    memcpy(last_command, frame, n);
    last_command_len = n;
    fuzz_tile_commands++;
    return 0;
}

int hal_stream_pop(unsigned tile, uint8_t *buf, size_t cap, uint32_t timeout_ms, size_t *got)
{
    size_t n = SOMATILE_HEADER_BYTES;
    (void)tile;
    (void)timeout_ms;
    if (last_command_len > SOMATILE_HEADER_BYTES && (last_command[SOMATILE_HEADER_BYTES] & 1u))
        n = last_command_len;
    *got = 0;
    if (n > cap)
        return HAL_POP_OVERFLOW;
    memset(buf, 0, SOMATILE_HEADER_BYTES);
    memcpy(buf, last_command, n < last_command_len ? n : last_command_len);
    buf[0] = SOMATILE_FRAME_MAGIC;
    buf[3] = 0;
    /* REG_READ of API_LEVEL must agree, or HELLO is (correctly) refused every time. */
    if (last_command[1] == SOMATILE_OP_REG_READ)
        fw_put_u32(buf + 8, SOMATILE_API_LEVEL);
    *got = n;
    return HAL_POP_OK;
}
