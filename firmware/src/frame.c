#include "fw.h"

void fw_parser_init(struct fw_parser *p, uint8_t *buf, uint32_t max_payload)
{
    p->buf = buf;
    p->max_payload = max_payload;
    p->have = 0;
    p->need = 0;
    p->hunting_second = 0;
    p->api_level = p->opcode = 0;
    p->seq = 0;
    p->length = 0;
    p->bad_code = 0;
    p->bad_detail = 0;
}

static enum fw_event drop(struct fw_parser *p, uint8_t code, uint32_t detail)
{
    p->bad_code = code;
    p->bad_detail = detail;
    p->have = 0;
    p->need = 0;
    p->hunting_second = 0;
    return FW_EVENT_BAD;
}

enum fw_event fw_parser_push(struct fw_parser *p, uint8_t byte)
{
    if (p->have == 0) {
        /* Hunting for the magic pair; a first magic byte may directly follow another. */
        if (p->hunting_second && byte == WIRE_MAGIC1) {
            p->buf[0] = WIRE_MAGIC0;
            p->buf[1] = WIRE_MAGIC1;
            p->have = 2;
            p->hunting_second = 0;
        } else {
            p->hunting_second = byte == WIRE_MAGIC0;
        }
        return FW_EVENT_NONE;
    }
    p->buf[p->have++] = byte;
    if (p->have == WIRE_HEADER_SIZE) {
        p->api_level = p->buf[2];
        p->opcode = p->buf[3];
        p->seq = (uint16_t)(p->buf[4] | (p->buf[5] << 8));
        p->length = fw_get_u32(p->buf + 6);
        /* Checked before reading on: a corrupted length must not make the parser wait for 4 GB. */
        if (p->length > p->max_payload)
            return drop(p, WIRE_ERR_OVERSIZE, p->max_payload);
        p->need = WIRE_HEADER_SIZE + p->length + WIRE_CRC_SIZE;
        return FW_EVENT_NONE;
    }
    if (p->need != 0 && p->have == p->need) {
        uint32_t body = WIRE_HEADER_SIZE + p->length;
        if (fw_crc32(0, p->buf, body) != fw_get_u32(p->buf + body))
            return drop(p, WIRE_ERR_BAD_CRC, 0);
        p->have = 0;
        p->need = 0;
        return FW_EVENT_FRAME;
    }
    return FW_EVENT_NONE;
}

enum fw_event fw_parser_expire(struct fw_parser *p)
{
    if (p->have >= WIRE_HEADER_SIZE)
        return drop(p, WIRE_ERR_TRUNCATED, 0);
    if (p->have >= 2) {
        p->opcode = 0;
        p->seq = 0;
        return drop(p, WIRE_ERR_TRUNCATED, 0);
    }
    p->hunting_second = 0;
    return FW_EVENT_NONE;
}

int fw_parser_mid_frame(const struct fw_parser *p)
{
    return p->have != 0 || p->hunting_second;
}
