/* The tile's command layer in firmware (include/soft_tile.h): the C twin of hw/tile_model.py TileModel for
 * the commands an HCCS unit alone can serve. Checks run in the model's order and the first failure wins;
 * an error response carries no payload and its result word is the expected length for BAD_LENGTH, else 0;
 * the first error since CLEAR_ERROR is latched. CYCLES_LAST counts the CPU's cycles over the last command
 * (the model, which has no clock, reads 0 there). */
#include "soft_tile.h"

#include <string.h>

#include "fw.h"
#include "somatile_soc.h"

#if SOMATILE_PROFILE != SOC_SOFT_TILE_PROFILE
#error "the command layer in firmware runs the paper profile's HCCS unit (boards: profile: paper)"
#endif
#if SOMATILE_N_TILES != 1
#error "the command layer in firmware serves one HCCS unit (boards: n_tiles: 1)"
#endif

#define GLOBAL(name) (SOMATILE_REG_##name / SOC_SOFT_REGISTER_BYTES)
#define PADDED(n) (((n) + SOMATILE_FRAME_GRANULE - 1u) / SOMATILE_FRAME_GRANULE * SOMATILE_FRAME_GRANULE)
#define CONFIGURE_BYTES PADDED(4u * SOMATILE_HEAD_PARAM_COUNT)
#define OUT_BYTES (1u + SOMATILE_HCCS_OUT) /* hccs_out: code 0 uint8, 1 int16 */

static const uint32_t head_lo[SOMATILE_HEAD_PARAM_COUNT] = {SOC_SOFT_HEAD_LO};
static const uint32_t head_hi[SOMATILE_HEAD_PARAM_COUNT] = {SOC_SOFT_HEAD_HI};
static const uint32_t head_default[SOMATILE_HEAD_PARAM_COUNT] = {SOC_SOFT_HEAD_DEFAULT};
static const uint32_t info_values[SOC_SOFT_INFO_COUNT] = {SOC_SOFT_INFO_VALUES};

static struct {
    int ready;
    uint32_t globals[SOC_SOFT_GLOBAL_COUNT];
    uint32_t heads[SOMATILE_HEADS][SOMATILE_HEAD_PARAM_COUNT];
    uint32_t configured; /* bit h: head h has parameters from a successful CONFIGURE_HEAD */
} tile;

struct refusal {
    uint8_t code;
    uint32_t detail;
};

static const struct refusal none = {0, 0};

static struct refusal refuse(uint8_t code, uint32_t detail)
{
    struct refusal r;
    r.code = code;
    r.detail = detail;
    return r;
}

void soft_tile_reset(void)
{
    unsigned h;

    memset(&tile, 0, sizeof tile);
    for (h = 0; h < SOMATILE_HEADS; h++)
        memcpy(tile.heads[h], head_default, sizeof head_default);
    tile.globals[GLOBAL(ID)] = SOMATILE_ID_VALUE;
    tile.globals[GLOBAL(API_LEVEL)] = SOMATILE_API_LEVEL;
    tile.ready = 1;
}

/* REG_READ's value of `address` into *value, or BAD_REGISTER off the map. */
static struct refusal read_register(uint32_t address, uint32_t *value)
{
    uint32_t index = address / SOC_SOFT_REGISTER_BYTES;

    if (address % SOC_SOFT_REGISTER_BYTES)
        return refuse(SOMATILE_ERR_BAD_REGISTER, 0);
    if (index < SOC_SOFT_GLOBAL_COUNT) {
        *value = index == GLOBAL(CONFIGURED) ? tile.configured : tile.globals[index];
        return none;
    }
    if (address >= SOC_SOFT_INFO_BASE && (address - SOC_SOFT_INFO_BASE) / 4u < SOC_SOFT_INFO_COUNT) {
        *value = info_values[(address - SOC_SOFT_INFO_BASE) / 4u];
        return none;
    }
    if (address >= SOMATILE_HEAD_BASE) {
        uint32_t head = (address - SOMATILE_HEAD_BASE) / SOMATILE_HEAD_STRIDE;
        uint32_t offset = (address - SOMATILE_HEAD_BASE) % SOMATILE_HEAD_STRIDE;
        if (head < SOMATILE_HEADS && offset / 4u < SOMATILE_HEAD_PARAM_COUNT) {
            *value = tile.heads[head][offset / 4u];
            return none;
        }
    }
    return refuse(SOMATILE_ERR_BAD_REGISTER, 0);
}

/* somatile.model.hccs.check_params for rows of `cols` (B, S and Dmax are inside their registers' ranges). */
static int hccs_rules_hold(const uint32_t *values, uint32_t cols)
{
    uint32_t B = values[SOMATILE_HEAD_HCCS_B], S = values[SOMATILE_HEAD_HCCS_S];
    int32_t floor = (int32_t)B - (int32_t)(S * values[SOMATILE_HEAD_HCCS_DMAX]);

    return floor >= 0 && cols * (uint32_t)floor >= SOC_SOFT_HCCS_MIN_FLOOR_MASS &&
           cols * B <= SOC_SOFT_HCCS_MAX_ROW_MASS;
}

/* What head_config (SomaConfig) accepts, as the RTL tile checks it: every register in range, query gating
 * only on a field of values, HCCS heads within the HCCS rules over the head's slots (sinks + ring). */
static int block_accepted(const uint32_t *values)
{
    unsigned i;

    for (i = 0; i < SOMATILE_HEAD_PARAM_COUNT; i++)
        if (values[i] < head_lo[i] || values[i] > head_hi[i])
            return 0;
    if (values[SOMATILE_HEAD_GATING] == SOC_SOFT_GATING_QUERY &&
        values[SOMATILE_HEAD_FIELD_SOURCE] != SOC_SOFT_FIELD_SOURCE_VALUES)
        return 0;
    return values[SOMATILE_HEAD_NORMALISER] != SOC_SOFT_NORMALISER_HCCS ||
           hccs_rules_hold(values, SOMATILE_SINKS + SOMATILE_RING);
}

static int runs(uint8_t opcode)
{
    return opcode < 32u && ((SOC_SOFT_TILE_COMMANDS >> opcode) & 1u);
}

/* The header checks in the model's order; *expected: the payload length the command requires. */
static struct refusal check_header(const uint8_t *frame, uint32_t *expected)
{
    uint8_t opcode = frame[1], head = frame[2];
    uint32_t length = fw_get_u32(frame + 4), arg0 = fw_get_u32(frame + 8), arg1 = fw_get_u32(frame + 12);
    uint32_t value;

    *expected = 0;
    if (frame[0] != SOMATILE_FRAME_MAGIC)
        return refuse(SOMATILE_ERR_BAD_MAGIC, 0);
    /* A command this tile does not run is one it does not know. */
    if (!runs(opcode))
        return refuse(SOMATILE_ERR_UNKNOWN_OPCODE, 0);
    if ((opcode == SOMATILE_OP_CONFIGURE_HEAD || opcode == SOMATILE_OP_HCCS) && head >= SOMATILE_HEADS)
        return refuse(SOMATILE_ERR_BAD_HEAD, 0);
    if (opcode == SOMATILE_OP_REG_READ) {
        struct refusal r = read_register(arg0, &value);
        if (r.code)
            return r;
    }
    if (opcode == SOMATILE_OP_REG_WRITE && arg0 != SOMATILE_REG_SCRATCH)
        return refuse(SOMATILE_ERR_BAD_REGISTER, 0);
    if (opcode == SOMATILE_OP_HCCS) {
        /* rows * row_bytes <= staging_bytes, without the product overflowing */
        if (!(arg1 >= 1 && arg1 <= SOMATILE_N_MAX && arg0 >= 1 && arg0 <= SOMATILE_STAGING_BYTES / PADDED(arg1)))
            return refuse(SOMATILE_ERR_BAD_ARGUMENT, 0);
        if (!((tile.configured >> head) & 1u))
            return refuse(SOMATILE_ERR_NOT_CONFIGURED, 0);
        if (!hccs_rules_hold(tile.heads[head], arg1))
            return refuse(SOMATILE_ERR_BAD_ARGUMENT, 0);
        *expected = arg0 * PADDED(arg1);
    }
    if (opcode == SOMATILE_OP_CONFIGURE_HEAD)
        *expected = CONFIGURE_BYTES;
    if (length != *expected)
        return refuse(SOMATILE_ERR_BAD_LENGTH, *expected);
    return none;
}

/* Run a command that passed the checks: its payload length into *length (payload written after the
 * header), its result word into *result; BAD_ARGUMENT for a refused parameter block, TILE_TIMEOUT (a code
 * beyond the tile's, never answered) when the unit did not answer. */
#define UNIT_TIMEOUT 0xFFu
static struct refusal execute(const uint8_t *frame, uint8_t *answer, uint32_t *length, uint32_t *result)
{
    uint8_t opcode = frame[1], head = frame[2];
    const uint8_t *payload = frame + SOMATILE_HEADER_BYTES;
    uint8_t *out = answer + SOMATILE_HEADER_BYTES;
    uint32_t arg0 = fw_get_u32(frame + 8), arg1 = fw_get_u32(frame + 12), values[SOMATILE_HEAD_PARAM_COUNT], i;

    *length = 0;
    *result = 0;
    switch (opcode) {
    case SOMATILE_OP_INFO:
        for (i = 0; i < SOC_SOFT_INFO_COUNT; i++)
            fw_put_u32(out + 4u * i, info_values[i]);
        *length = PADDED(4u * SOC_SOFT_INFO_COUNT);
        memset(out + 4u * SOC_SOFT_INFO_COUNT, 0, *length - 4u * SOC_SOFT_INFO_COUNT);
        break;
    case SOMATILE_OP_REG_READ:
        return read_register(arg0, result);
    case SOMATILE_OP_REG_WRITE:
        tile.globals[GLOBAL(SCRATCH)] = arg1;
        break;
    case SOMATILE_OP_CLEAR_ERROR:
        tile.globals[GLOBAL(STATUS)] = tile.globals[GLOBAL(ERROR_CODE)] = tile.globals[GLOBAL(ERROR_OPCODE)] = 0;
        break;
    case SOMATILE_OP_CONFIGURE_HEAD:
        for (i = 0; i < SOMATILE_HEAD_PARAM_COUNT; i++)
            values[i] = fw_get_u32(payload + 4u * i);
        if (!block_accepted(values))
            return refuse(SOMATILE_ERR_BAD_ARGUMENT, 0);
        memcpy(tile.heads[head], values, sizeof values);
        tile.configured |= 1u << head;
        break;
    case SOMATILE_OP_HCCS: {
        const uint32_t *h = tile.heads[head];
        struct soft_tile_hccs params;
        params.B = h[SOMATILE_HEAD_HCCS_B];
        params.S = h[SOMATILE_HEAD_HCCS_S];
        params.dmax = h[SOMATILE_HEAD_HCCS_DMAX];
        params.mode = h[SOMATILE_HEAD_HCCS_MODE];
        params.out = SOMATILE_HCCS_OUT;
        *length = arg0 * PADDED(arg1) * OUT_BYTES;
        memset(out, 0, *length); /* the rows' padding */
        if (soft_tile_normalise(head, &params, payload, arg0, arg1, PADDED(arg1), out, OUT_BYTES) < 0)
            return refuse(UNIT_TIMEOUT, 0);
        break;
    }
    default:
        break; /* check_header let only the commands this tile runs through */
    }
    return none;
}

uint32_t soft_tile_command(const uint8_t *frame, uint32_t n, uint8_t *answer)
{
    uint32_t started = soft_tile_cycles(), expected = 0, length = 0, result = 0, answer_len;
    uint8_t opcode = 0, head = 0;
    struct refusal r;

    if (!tile.ready)
        soft_tile_reset();
    if (n < SOMATILE_HEADER_BYTES) {
        r = refuse(SOMATILE_ERR_BAD_LENGTH, 0);
    } else {
        opcode = frame[1];
        head = frame[2];
        r = check_header(frame, &expected);
        if (!r.code && n - SOMATILE_HEADER_BYTES != expected)
            r = refuse(SOMATILE_ERR_BAD_LENGTH, expected);
        if (!r.code)
            r = execute(frame, answer, &length, &result);
    }
    tile.globals[GLOBAL(COMMANDS)]++;
    if (r.code == UNIT_TIMEOUT)
        return 0;
    if (r.code) {
        if (!(tile.globals[GLOBAL(STATUS)] & 1u)) {
            tile.globals[GLOBAL(STATUS)] = 1;
            tile.globals[GLOBAL(ERROR_CODE)] = r.code;
            tile.globals[GLOBAL(ERROR_OPCODE)] = opcode;
        }
        fw_put_tile_header(answer, opcode, head, r.code, 0, r.detail, 0);
        answer_len = SOMATILE_HEADER_BYTES;
    } else {
        fw_put_tile_header(answer, opcode, head, 0, length, result, 0);
        answer_len = SOMATILE_HEADER_BYTES + length;
    }
    tile.globals[GLOBAL(CYCLES_LAST)] = soft_tile_cycles() - started;
    return answer_len;
}
