#include "fw.h"
#include "hal.h"

static struct fw_error error(uint32_t code, uint32_t detail)
{
    struct fw_error e;
    e.code = code;
    e.detail = detail;
    return e;
}

/* A stream descriptor in both directions: the command frame goes out from wherever it lies (the receive
 * buffer, so a tensor is never copied), the answer lands where the caller wants it (the answer buffer). */
struct fw_error tile_transfer(unsigned tile, const uint8_t *command, uint32_t command_len, uint8_t *answer,
                              uint32_t answer_cap, uint32_t *answer_len)
{
    size_t got = 0;
    int r;

    *answer_len = 0;
    if (hal_stream_push(tile, command, command_len) < 0)
        return error(WIRE_ERR_TILE_TIMEOUT, 0);
    r = hal_stream_pop(tile, answer, answer_cap, FW_TILE_TIMEOUT_MS, &got);
    *answer_len = (uint32_t)got;
    if (r == HAL_POP_TIMEOUT)
        return error(WIRE_ERR_TILE_TIMEOUT, (uint32_t)got);
    if (r == HAL_POP_OVERFLOW)
        return error(WIRE_ERR_TILE_OVERFLOW, answer_cap);
    return error(0, 0);
}

#define PARAM_BLOCK_BYTES (4u * SOMATILE_HEAD_PARAM_COUNT)
#define PADDED(n) (((n) + SOMATILE_FRAME_GRANULE - 1u) / SOMATILE_FRAME_GRANULE * SOMATILE_FRAME_GRANULE)

/* A command the firmware makes itself (payload at most one head parameter block); its answer must be a bare
 * header, and a tile error code in it becomes TILE_REFUSED. */
static struct fw_error own_command(unsigned tile, uint8_t opcode, uint8_t head, uint8_t count, uint32_t arg0,
                                   uint32_t arg1, const uint8_t *payload, uint32_t payload_len, uint32_t *result)
{
    uint8_t command[SOMATILE_HEADER_BYTES + PADDED(PARAM_BLOCK_BYTES)];
    uint8_t answer[SOMATILE_HEADER_BYTES];
    uint32_t answer_len, padded_len = PADDED(payload_len), i;
    struct fw_error e;

    if (padded_len > PADDED(PARAM_BLOCK_BYTES))
        return error(WIRE_ERR_BAD_LENGTH, PARAM_BLOCK_BYTES);
    fw_put_tile_header(command, opcode, head, count, padded_len, arg0, arg1);
    for (i = 0; i < padded_len; i++)
        command[SOMATILE_HEADER_BYTES + i] = i < payload_len ? payload[i] : 0;
    e = tile_transfer(tile, command, SOMATILE_HEADER_BYTES + padded_len, answer, sizeof answer, &answer_len);
    if (e.code == WIRE_ERR_TILE_OVERFLOW)
        return error(WIRE_ERR_TILE_BAD_ANSWER, answer_len);
    if (e.code)
        return e;
    if (answer_len != SOMATILE_HEADER_BYTES || answer[0] != SOMATILE_FRAME_MAGIC)
        return error(WIRE_ERR_TILE_BAD_ANSWER, answer_len);
    if (answer[3] != 0)
        return error(WIRE_ERR_TILE_REFUSED, answer[3]);
    if (result)
        *result = fw_get_u32(answer + 8);
    return error(0, 0);
}

struct fw_error tile_reg_read(unsigned tile, uint32_t address, uint32_t *value)
{
    return own_command(tile, SOMATILE_OP_REG_READ, 0, 0, address, 0, NULL, 0, value);
}

struct fw_error tile_simple_command(unsigned tile, uint8_t opcode, uint8_t head, uint8_t count)
{
    return own_command(tile, opcode, head, count, 0, 0, NULL, 0, NULL);
}

struct fw_error tile_payload_command(unsigned tile, uint8_t opcode, uint8_t head, const uint8_t *payload,
                                     uint32_t payload_len)
{
    return own_command(tile, opcode, head, 0, 0, 0, payload, payload_len, NULL);
}
