/* somatile firmware: the device side of the wire protocol (docs/protocol.md, docs/firmware.md).
 *
 * Portable C99, no heap: the frame buffers are static arrays of FW_MAX_PAYLOAD bytes. The board-specific
 * part is the HAL (hal.h). The protocol constants come from the generated build/gen/somatile_wire.h
 * (somatile.host.protocol) and the tile's from build/gen/somatile_regmap.h (somatile.hw.regmap).
 */
#ifndef SOMATILE_FW_H
#define SOMATILE_FW_H

#include <stddef.h>
#include <stdint.h>

#include "somatile_regmap.h"
#include "somatile_wire.h"

#ifndef FW_MAX_PAYLOAD
#define FW_MAX_PAYLOAD WIRE_DEFAULT_MAX_PAYLOAD
#endif
#ifndef FW_BOARD_NAME
#define FW_BOARD_NAME "sim"
#endif
/* How long the firmware waits for the tile to finish answering one command frame. */
#ifndef FW_TILE_TIMEOUT_MS
#define FW_TILE_TIMEOUT_MS 20000u
#endif

#define FW_FRAME_BYTES (WIRE_HEADER_SIZE + FW_MAX_PAYLOAD + WIRE_CRC_SIZE)

uint32_t fw_crc32(uint32_t crc, const uint8_t *data, size_t n);

static inline uint32_t fw_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline void fw_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* A tile frame's 16-byte header (hw/regmap.py): magic, opcode, head, then a command's count or a response's
 * error code, the payload length, and a command's arg0 and arg1 or a response's result word and 0. */
static inline void fw_put_tile_header(uint8_t *p, uint8_t opcode, uint8_t head, uint8_t count_or_error,
                                      uint32_t length, uint32_t word0, uint32_t word1)
{
    p[0] = SOMATILE_FRAME_MAGIC;
    p[1] = opcode;
    p[2] = head;
    p[3] = count_or_error;
    fw_put_u32(p + 4, length);
    fw_put_u32(p + 8, word0);
    fw_put_u32(p + 12, word1);
}

/* Frame parser: one byte at a time, the same semantics as somatile.host.protocol.FrameParser. */
enum fw_event { FW_EVENT_NONE = 0, FW_EVENT_FRAME, FW_EVENT_BAD };

struct fw_parser {
    uint8_t *buf;         /* FW_FRAME_BYTES: header, payload, CRC of the frame being read */
    uint32_t max_payload;
    uint32_t have;        /* bytes of the current frame in buf */
    uint32_t need;        /* total bytes of the current frame once the header is known, else 0 */
    int hunting_second;   /* the last byte was the first magic byte */
    /* Valid after FW_EVENT_FRAME (payload = buf + WIRE_HEADER_SIZE) or FW_EVENT_BAD: */
    uint8_t api_level, opcode;
    uint16_t seq;
    uint32_t length;
    uint8_t bad_code;
    uint32_t bad_detail;
};

void fw_parser_init(struct fw_parser *p, uint8_t *buf, uint32_t max_payload);
enum fw_event fw_parser_push(struct fw_parser *p, uint8_t byte);
/* The inter-byte timeout passed: drop a partial frame (FW_EVENT_BAD with TRUNCATED) or nothing. */
enum fw_event fw_parser_expire(struct fw_parser *p);
int fw_parser_mid_frame(const struct fw_parser *p);

/* The device: parser, sequence state and the cached answer to the last executed request. */
struct fw_device {
    struct fw_parser parser;
    int synced;           /* a HELLO set the sequence */
    uint16_t last_seq;
    uint8_t last_opcode;  /* a retry repeats seq AND opcode of the cached request */
    uint32_t answer_len;  /* bytes of the cached answer */
    uint32_t request_crc; /* CRC-32 of the cached request's payload: a retry must repeat it */
    uint32_t frames;      /* complete frames (valid CRC) received since fw_init: the HAL's sign of a live host */
    int link_failed;      /* a write to the link failed: the host is gone, the rest of its bytes are dropped */
};

/* Write header and CRC around the payload already at frame + WIRE_HEADER_SIZE; returns the frame's bytes. */
uint32_t fw_frame_seal(uint8_t *frame, uint8_t opcode, uint16_t seq, uint32_t length);

void fw_init(struct fw_device *dev);
/* Consume link bytes; every complete request or dropped frame is answered through hal_link_write. Once a
 * write has failed (dev->link_failed) the remaining bytes are ignored until fw_init: that host is gone. */
void fw_feed(struct fw_device *dev, const uint8_t *data, size_t n);
void fw_expire(struct fw_device *dev);
/* The main loop: read the link (expiring partial frames when it is idle) until it closes or a write to it
 * fails; returns 0. */
int fw_run(struct fw_device *dev);

/* A refused request: a WIRE_ERR_* code (0 = none) and the detail word of the error frame. */
struct fw_error {
    uint32_t code;
    uint32_t detail;
};

/* Tile access through its command stream (src/tile.c). tile_transfer sends one command frame and receives
 * its answer; the others build small command frames and check the answer's header (a tile error code there
 * is returned as TILE_REFUSED with the code as detail; REG_READ's result goes to *value). */
struct fw_error tile_transfer(unsigned tile, const uint8_t *command, uint32_t command_len, uint8_t *answer,
                              uint32_t answer_cap, uint32_t *answer_len);
struct fw_error tile_reg_read(unsigned tile, uint32_t address, uint32_t *value);
struct fw_error tile_simple_command(unsigned tile, uint8_t opcode, uint8_t head, uint8_t count);
/* A command with a payload of at most one head parameter block (CONFIGURE_HEAD). */
struct fw_error tile_payload_command(unsigned tile, uint8_t opcode, uint8_t head, const uint8_t *payload,
                                     uint32_t payload_len);

#endif
