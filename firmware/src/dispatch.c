/* Request dispatch: the C twin of somatile.host.protocol.DeviceEndpoint and the handlers of
 * somatile.host.emu.ReferenceFirmware; the tests check that both answer every byte stream identically. */
#include "fw.h"
#include "hal.h"

#define TOTAL_HEADS (SOMATILE_HEADS * SOMATILE_N_TILES)
#define CONFIGURE_BYTES (4u + 4u * SOMATILE_HEAD_PARAM_COUNT)
#define STREAM_BYTES (SOMATILE_STREAM_WIDTH / 8u)

static uint8_t receive_buffer[FW_FRAME_BYTES];
/* The answer to the last executed request, kept for a retry of the same sequence number. */
static uint8_t answer_buffer[FW_FRAME_BYTES];
/* Answers that are not cached (dropped frames, wrong API level, wrong sequence number). */
static uint8_t refusal_buffer[WIRE_HEADER_SIZE + WIRE_ERROR_PAYLOAD_SIZE + WIRE_CRC_SIZE];

static struct fw_error refuse(uint32_t code, uint32_t detail)
{
    struct fw_error e;
    e.code = code;
    e.detail = detail;
    return e;
}

static const struct fw_error accepted = {0, 0};

uint32_t fw_frame_seal(uint8_t *frame, uint8_t opcode, uint16_t seq, uint32_t length)
{
    uint32_t body = WIRE_HEADER_SIZE + length;
    frame[0] = WIRE_MAGIC0;
    frame[1] = WIRE_MAGIC1;
    frame[2] = SOMATILE_API_LEVEL;
    frame[3] = opcode;
    frame[4] = (uint8_t)seq;
    frame[5] = (uint8_t)(seq >> 8);
    fw_put_u32(frame + 6, length);
    fw_put_u32(frame + body, fw_crc32(0, frame, body));
    return body + WIRE_CRC_SIZE;
}

static uint32_t error_frame(uint8_t *frame, struct fw_error e, uint8_t opcode, uint16_t seq)
{
    uint8_t *p = frame + WIRE_HEADER_SIZE;
    p[0] = (uint8_t)e.code;
    p[1] = opcode;
    p[2] = (uint8_t)seq;
    p[3] = (uint8_t)(seq >> 8);
    fw_put_u32(p + 4, e.detail);
    return fw_frame_seal(frame, WIRE_ERROR_OPCODE, seq, WIRE_ERROR_PAYLOAD_SIZE);
}

/* A failed write means the host is gone (closed, reset, or not reading): the device stops answering it, so a
 * vanished host can never stop the firmware from serving the next one. */
static void send(struct fw_device *dev, const uint8_t *frame, uint32_t n)
{
    if (!dev->link_failed && hal_link_write(frame, n) < 0)
        dev->link_failed = 1;
}

static void send_refusal(struct fw_device *dev, struct fw_error e, uint8_t opcode, uint16_t seq)
{
    send(dev, refusal_buffer, error_frame(refusal_buffer, e, opcode, seq));
}

static struct fw_error hello(uint32_t length, uint8_t *out, uint32_t *out_len)
{
    static const uint32_t info_registers[WIRE_INFO_REGISTER_COUNT] = {WIRE_INFO_REGISTERS};
    static const char board[] = FW_BOARD_NAME;
    unsigned tile, i;

    if (length != 0)
        return refuse(WIRE_ERR_BAD_LENGTH, 0);
    /* The tiles must speak the command-layer level this firmware was generated for. */
    for (tile = 0; tile < SOMATILE_N_TILES; tile++) {
        uint32_t level = 0;
        struct fw_error e = tile_reg_read(tile, SOMATILE_REG_API_LEVEL, &level);
        if (e.code)
            return e;
        if (level != SOMATILE_API_LEVEL)
            return refuse(WIRE_ERR_WRONG_API_LEVEL, level);
    }
    fw_put_u32(out + 4 * WIRE_INFO_API_LEVEL, SOMATILE_API_LEVEL);
    fw_put_u32(out + 4 * WIRE_INFO_MAX_PAYLOAD, FW_MAX_PAYLOAD);
    /* The capacity comes from the tile itself, so a host never trusts a header the tile disagrees with. */
    for (i = 0; i < WIRE_INFO_REGISTER_COUNT; i++) {
        uint32_t value = 0;
        struct fw_error e = tile_reg_read(0, info_registers[i], &value);
        if (e.code)
            return e;
        fw_put_u32(out + 4 * (WIRE_INFO_FIELDS - WIRE_INFO_REGISTER_COUNT + i), value);
    }
    for (i = 0; i < WIRE_BOARD_NAME_BYTES; i++)
        out[4 * WIRE_INFO_FIELDS + i] = i < sizeof board - 1 ? (uint8_t)board[i] : 0;
    *out_len = WIRE_INFO_SIZE;
    return accepted;
}

static struct fw_error tile_command(const uint8_t *payload, uint32_t length, uint8_t *out, uint32_t *out_len)
{
    uint32_t tile;

    if (length < WIRE_TILE_PREFIX_SIZE + SOMATILE_HEADER_BYTES)
        return refuse(WIRE_ERR_BAD_LENGTH, WIRE_TILE_PREFIX_SIZE + SOMATILE_HEADER_BYTES);
    tile = fw_get_u32(payload);
    if (tile >= SOMATILE_N_TILES)
        return refuse(WIRE_ERR_BAD_TILE, SOMATILE_N_TILES);
    /* The stream carries whole beats only. */
    if ((length - WIRE_TILE_PREFIX_SIZE) % STREAM_BYTES != 0)
        return refuse(WIRE_ERR_BAD_LENGTH, STREAM_BYTES);
    return tile_transfer(tile, payload + WIRE_TILE_PREFIX_SIZE, length - WIRE_TILE_PREFIX_SIZE, out,
                         FW_MAX_PAYLOAD, out_len);
}

static struct fw_error configure(const uint8_t *payload, uint32_t length)
{
    uint32_t head;

    if (length != CONFIGURE_BYTES)
        return refuse(WIRE_ERR_BAD_LENGTH, CONFIGURE_BYTES);
    head = fw_get_u32(payload);
    if (head >= TOTAL_HEADS)
        return refuse(WIRE_ERR_BAD_TILE, TOTAL_HEADS);
    return tile_payload_command(head / SOMATILE_HEADS, SOMATILE_OP_CONFIGURE_HEAD, (uint8_t)(head % SOMATILE_HEADS),
                                payload + 4, 4u * SOMATILE_HEAD_PARAM_COUNT);
}

static struct fw_error reset(uint32_t length)
{
    unsigned tile;

    if (length != 0)
        return refuse(WIRE_ERR_BAD_LENGTH, 0);
    for (tile = 0; tile < SOMATILE_N_TILES; tile++) {
        /* A tile without state (the HCCS-only SoC's, whose commands register lacks RESET_STATE) has only its
         * error to clear. */
        uint32_t commands = 0;
        struct fw_error e = tile_reg_read(tile, SOMATILE_REG_INFO_COMMANDS, &commands);
        /* Clear a latched error first, so that the state reset is not refused because of it. */
        if (!e.code)
            e = tile_simple_command(tile, SOMATILE_OP_CLEAR_ERROR, 0, 0);
        if (!e.code && (commands >> SOMATILE_OP_RESET_STATE) & 1u)
            e = tile_simple_command(tile, SOMATILE_OP_RESET_STATE, 0, SOMATILE_HEADS);
        if (e.code)
            return e;
    }
    return accepted;
}

static uint32_t payload_crc(const struct fw_parser *p)
{
    return fw_crc32(0, p->buf + WIRE_HEADER_SIZE, p->length);
}

static void execute(struct fw_device *dev)
{
    const struct fw_parser *p = &dev->parser;
    const uint8_t *payload = p->buf + WIRE_HEADER_SIZE;
    uint8_t *out = answer_buffer + WIRE_HEADER_SIZE;
    uint32_t out_len = 0;
    struct fw_error e;

    switch (p->opcode) {
    case WIRE_OP_HELLO:
        e = hello(p->length, out, &out_len);
        break;
    case WIRE_OP_TILE:
        e = tile_command(payload, p->length, out, &out_len);
        break;
    case WIRE_OP_CONFIGURE:
        e = configure(payload, p->length);
        break;
    case WIRE_OP_RESET:
        e = reset(p->length);
        break;
    default:
        e = refuse(WIRE_ERR_UNKNOWN_OPCODE, p->opcode);
        break;
    }
    if (e.code)
        dev->answer_len = error_frame(answer_buffer, e, p->opcode, p->seq);
    else
        dev->answer_len = fw_frame_seal(answer_buffer, (uint8_t)(p->opcode | WIRE_RESPONSE_FLAG), p->seq, out_len);
    dev->synced = 1;
    dev->last_seq = p->seq;
    dev->last_opcode = p->opcode;
    dev->request_crc = payload_crc(p);
    send(dev, answer_buffer, dev->answer_len);
}

static void on_frame(struct fw_device *dev)
{
    const struct fw_parser *p = &dev->parser;
    uint16_t expected = (uint16_t)(dev->last_seq + 1u);

    dev->frames++;
    if (p->api_level != SOMATILE_API_LEVEL) {
        send_refusal(dev, refuse(WIRE_ERR_WRONG_API_LEVEL, SOMATILE_API_LEVEL), p->opcode, p->seq);
        return;
    }
    if (p->opcode == WIRE_OP_HELLO) {
        dev->synced = 0;
    } else if (dev->synced && p->seq == dev->last_seq && p->opcode == dev->last_opcode &&
               payload_crc(p) == dev->request_crc) {
        /* A retry repeats the whole request; the same seq and opcode with another payload is a new request
         * that reused a number, refused below rather than answered with the first one's result. */
        send(dev, answer_buffer, dev->answer_len);
        return;
    } else if (!dev->synced || p->seq != expected) {
        send_refusal(dev, refuse(WIRE_ERR_SEQUENCE, dev->synced ? expected : 0), p->opcode, p->seq);
        return;
    }
    execute(dev);
}

static void on_event(struct fw_device *dev, enum fw_event event)
{
    if (event == FW_EVENT_FRAME)
        on_frame(dev);
    else if (event == FW_EVENT_BAD)
        send_refusal(dev, refuse(dev->parser.bad_code, dev->parser.bad_detail), dev->parser.opcode,
                     dev->parser.seq);
}

void fw_init(struct fw_device *dev)
{
    fw_parser_init(&dev->parser, receive_buffer, FW_MAX_PAYLOAD);
    dev->synced = 0;
    dev->last_seq = 0;
    dev->last_opcode = 0;
    dev->answer_len = 0;
    dev->request_crc = 0;
    dev->frames = 0;
    dev->link_failed = 0;
}

void fw_feed(struct fw_device *dev, const uint8_t *data, size_t n)
{
    size_t i;
    for (i = 0; i < n && !dev->link_failed; i++)
        on_event(dev, fw_parser_push(&dev->parser, data[i]));
}

void fw_expire(struct fw_device *dev)
{
    if (!dev->link_failed)
        on_event(dev, fw_parser_expire(&dev->parser));
}

int fw_run(struct fw_device *dev)
{
    static uint8_t chunk[4096];
    for (;;) {
        int n = hal_link_read(chunk, sizeof chunk, WIRE_INTERBYTE_TIMEOUT_MS);
        if (n < 0)
            return 0;
        if (n == 0)
            fw_expire(dev);
        else
            fw_feed(dev, chunk, (size_t)n);
        if (dev->link_failed)
            return 0;
    }
}
