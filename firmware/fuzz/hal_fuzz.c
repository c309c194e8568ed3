/* HAL of the fuzz build: no I/O. The link's output is parsed again by a second frame parser, so that every
 * answer the firmware sends must be a well-formed frame (checked with abort(), which the fuzzer reports).
 * The tile answers every command at once: a bare OK header, or, for commands whose first payload byte is
 * odd, a header followed by the command's payload (so answers of every size up to the limit occur). One
 * command of each session may fail instead, chosen by the input's last byte: its low 3 bits the kind (2 the
 * push fails, 3 a wrong API level in a register read, 4 a timeout, 5 a refusal, 6 a foreign answer, 7 an
 * answer too large; 0 and 1 none), its high 5 bits which command of the session (0-31). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fw.h"
#include "hal.h"

static uint8_t check_buffer[FW_FRAME_BYTES];
static struct fw_parser checker;
static int checker_ready;
static uint8_t last_command[FW_FRAME_BYTES];
static size_t last_command_len;
enum tile_fault { FAULT_PUSH = 2, FAULT_WRONG_LEVEL, FAULT_TIMEOUT, FAULT_REFUSED, FAULT_FOREIGN, FAULT_OVERFLOW };
static unsigned fault_kind, fault_command, command_index, current_fault;
/* What the inputs reached, so that a run shows it got past the CRC check (driver.c prints them). */
unsigned long fuzz_answers, fuzz_tile_commands;

void fuzz_hal_begin(const uint8_t *data, size_t size)
{
    uint8_t last = size ? data[size - 1] : 0;
    fault_kind = last & 7u;
    fault_command = last >> 3;
    command_index = 0;
}

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
    current_fault = command_index++ == fault_command ? fault_kind : 0;
    fuzz_tile_commands++;
    return current_fault == FAULT_PUSH ? -1 : 0;
}

int hal_stream_pop(unsigned tile, uint8_t *buf, size_t cap, uint32_t timeout_ms, size_t *got)
{
    size_t n = SOMATILE_HEADER_BYTES;
    (void)tile;
    (void)timeout_ms;
    if (last_command_len > SOMATILE_HEADER_BYTES && (last_command[SOMATILE_HEADER_BYTES] & 1u))
        n = last_command_len;
    *got = 0;
    if (current_fault == FAULT_TIMEOUT)
        return HAL_POP_TIMEOUT;
    if (n > cap || current_fault == FAULT_OVERFLOW)
        return HAL_POP_OVERFLOW;
    memset(buf, 0, SOMATILE_HEADER_BYTES);
    memcpy(buf, last_command, n < last_command_len ? n : last_command_len);
    buf[0] = SOMATILE_FRAME_MAGIC;
    buf[3] = 0;
    /* REG_READ of API_LEVEL must agree, or HELLO is (correctly) refused every time; the commands register
     * names every command, so that RESET sends RESET_STATE too. */
    if (last_command[1] == SOMATILE_OP_REG_READ)
        fw_put_u32(buf + 8, fw_get_u32(last_command + 8) == SOMATILE_REG_INFO_COMMANDS
                                ? SOMATILE_COMMANDS
                                : SOMATILE_API_LEVEL + (current_fault == FAULT_WRONG_LEVEL));
    if (current_fault == FAULT_REFUSED)
        buf[3] = 1;
    if (current_fault == FAULT_FOREIGN)
        buf[0] = (uint8_t)~SOMATILE_FRAME_MAGIC;
    *got = n;
    return HAL_POP_OK;
}
